"""The demo report's figure process (fpemu.report.FigureWriter): the figures it
draws in a process of its own are the bytes drawn in this one, and its
failures reach the caller with their cause."""

import threading

import pytest

pytest.importorskip("matplotlib")

from fpemu import report  # noqa: E402
from fpemu.errors import FpemuRuntimeError, FpemuValueError  # noqa: E402
from fpemu.experiments import module  # noqa: E402

#: two experiments that run in a second at their reduced sizes
NAMES = ("adam_epsilon", "stochastic_rounding")


def _finish(w, timeout=300):
    """``w.finish()`` within ``timeout`` seconds: a figure process that hangs
    is killed and the test fails, instead of the run hanging."""
    box = {}

    def run():
        try:
            box["value"] = w.finish()
        except BaseException as e:              # re-raised in the test's thread
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        if w._proc is not None:
            w._proc.kill()
        pytest.fail(f"the figure process did not answer within {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.fixture(scope="module")
def results():
    return [module(n).run(None, **module(n).QUICK) for n in NAMES]


def test_the_figure_process_draws_the_bytes_this_process_draws(results, tmp_path):
    stems = {}
    for workers in (0, 1):
        with report.FigureWriter(tmp_path / str(workers), workers=workers) as w:
            for r in results:
                w.add(r)
            stems[workers] = _finish(w)
    assert stems[0] == stems[1] and set(stems[0]) == set(NAMES)
    files = sorted(p.name for p in (tmp_path / "0" / "figures").iterdir())
    assert files == sorted(f"{s}.{k}" for v in stems[0].values() for s in v
                           for k in ("svg", "png"))
    for name in files:
        a = (tmp_path / "0" / "figures" / name).read_bytes()
        assert len(a) > 1000 and a == (tmp_path / "1" / "figures" / name).read_bytes(), name


def test_a_failure_in_the_figure_process_is_raised_with_its_cause(results, tmp_path):
    w = report.FigureWriter(tmp_path, formats=("bmp",), workers=1)
    w.add(results[0])
    with pytest.raises(FpemuRuntimeError, match=r"(?s)drawing adam_epsilon's figures failed "
                       r"in the figure process.*unknown format 'bmp'"):
        _finish(w)
    assert w._proc is None                         # stopped, not left behind


def test_a_figure_process_that_dies_is_reported(results, tmp_path):
    w = report.FigureWriter(tmp_path, workers=1)
    w._proc.kill()
    w._proc.wait()
    with pytest.raises(FpemuRuntimeError, match=r"the figure process ended \(exit code -9\) "
                       r"before drawing adam_epsilon's figures"):
        w.add(results[0])                          # (the write may find the pipe closed)
        _finish(w)
    assert w._proc is None


def test_workers_is_zero_or_one(tmp_path):
    with pytest.raises(FpemuValueError, match=r"workers is 0 \(draw in this process\) or 1 "
                       r"\(in a process of its own\), got 2"):
        report.FigureWriter(tmp_path, workers=2)
