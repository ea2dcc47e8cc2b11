"""The demo report: every experiment run, its figures saved, one HTML page.

``fpemu demo --out out/`` calls :func:`write_report`, which writes

* ``out/index.html``: one section per experiment with the question, the
  set-up, the figures, the key numbers and the conclusion computed from them;
* ``out/figures/*.svg|png``: every figure, deterministic bytes (``figure_formats``
  adds ``"pdf"``);
* ``out/results.json``: the numbers, the configs and the conclusions.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import pickle
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import time

from . import __version__
from .errors import FpemuRuntimeError, FpemuValueError
from .experiments import ORDER, module
from .numtext import summary as _show
from .plotting import lecture_style, new_axes, plot_bit_layout, plot_number_line, save_figure

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1180px; padding: 24px 32px 64px; color: #1d1d1f; line-height: 1.5; }
h1 { font-size: 2.1em; margin-bottom: 0.1em; }
h2 { border-top: 2px solid #3f90da; padding-top: 18px; margin-top: 48px; }
.lead { color: #4a4f55; font-size: 1.1em; }
.question { font-size: 1.2em; font-weight: 600; }
.setup { color: #4a4f55; }
.conclusion { background: #eef5fc; border-left: 4px solid #3f90da; padding: 10px 16px; }
figure { margin: 18px 0; }
figure img { max-width: 100%; border: 1px solid #e4e4e4; }
figcaption { color: #717581; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.92em; margin: 8px 0; }
td, th { border-bottom: 1px solid #e4e4e4; padding: 3px 10px; text-align: left;
         vertical-align: top; }
td.num { font-family: ui-monospace, monospace; }
nav a { margin-right: 14px; }
details summary { cursor: pointer; color: #3f90da; }
"""


def run_all(names=ORDER, quick=False, progress=True, overrides=None, on_result=None):
    """Run the experiments in order; a tqdm progress bar when ``progress``.
    ``on_result(result)`` is called as each experiment finishes."""
    overrides = overrides or {}
    bar = None
    if progress:
        try:
            from tqdm import tqdm  # optional dependency
        except ImportError:       # pragma: no cover - tqdm comes with the plot extra
            tqdm = None
        if tqdm is not None:
            bar = tqdm(total=len(names), desc="experiments", unit="exp")
    results = []
    for name in names:
        if bar is not None:
            bar.set_postfix_str(name)
        mod = module(name)
        kw = {**(mod.QUICK if quick else {}), **overrides.get(name, {})}
        results.append(mod.run(None, **kw))
        if on_result is not None:
            on_result(results[-1])
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return results


def write_report(out_dir, results, seconds=None, extra_figures=True,
                 figure_formats=("svg", "png"), figures=None):
    """Save every figure (SVG and PNG by default) and write index.html and results.json.

    ``figures``: a :class:`FigureWriter` that has drawn (or is drawing) them
    already, as :func:`demo` does while the experiments run; by default they
    are drawn here, one after the other."""
    if figures is None:
        figures = FigureWriter(out_dir, figure_formats, workers=0)
        if extra_figures:
            figures.add_intro()
        for r in results:
            figures.add(r)
    stems = figures.finish()
    intro = stems.pop(None, [])
    sections = [_section(r, stems[r.name], figure_formats) for r in results]
    with open(os.path.join(out_dir, "results.json"), "w") as fh:
        json.dump({"fpemu": __version__, "seconds": round(seconds, 1) if seconds else None,
                   "experiments": [dict(r.to_json(), figures=stems[r.name])
                                   for r in results]}, fh, indent=2)
        fh.write("\n")
    page = _page(results, sections, intro, seconds, figure_formats)
    path = os.path.join(out_dir, "index.html")
    with open(path, "w") as fh:
        fh.write(page)
    return path


def _draw_intro(figdir, formats):
    """The report's two figures of the formats themselves; their stems."""
    import matplotlib.pyplot as plt  # optional dependency
    with lecture_style():
        fig, ax = new_axes(figsize=(13, 4.6))
        plot_number_line(ax=ax)
        save_figure(fig, os.path.join(figdir, "formats-number-line"), formats)
        plt.close(fig)
        fig, ax = new_axes(figsize=(16, 5.6))
        plot_bit_layout(value=0.1, ax=ax)
        save_figure(fig, os.path.join(figdir, "formats-bit-layout"), formats)
        plt.close(fig)
    return ["formats-number-line", "formats-bit-layout"]


def _draw_result(result, figdir, formats):
    """Save an experiment's figures; their stems."""
    import matplotlib.pyplot as plt  # optional dependency
    stems = []
    for key, fig in result.plot().items():
        stem = f"{result.name}-{key}"
        save_figure(fig, os.path.join(figdir, stem), formats)
        plt.close(fig)
        stems.append(stem)
    return stems


class FigureWriter:
    """Draws the report's figures into ``out_dir/figures``, in this process
    (``workers=0``) or in a process of its own while the caller goes on
    (``workers=1``): :func:`demo` hands each experiment's result over as it
    finishes, so matplotlib's layout and rendering (single-threaded Python,
    about 1.5 s a figure in SVG and PNG) overlap the next experiment instead
    of following them all.

    The process is a new interpreter (``python -m fpemu._figure_worker``),
    not a fork (the experiments' process runs PyTorch's and Numba's thread
    pools) nor multiprocessing's spawn (which runs the caller's main script
    again, and a script that calls :func:`demo` at its top level would start
    it twice). It draws with the same functions, so the files are the same
    bytes either way (``tests/test_report.py``)."""

    def __init__(self, out_dir, formats=("svg", "png"), workers=1):
        if workers not in (0, 1):
            raise FpemuValueError(f"FigureWriter: workers is 0 (draw in this process) or 1 "
                                  f"(in a process of its own), got {workers!r}")
        self.figdir = os.path.join(out_dir, "figures")
        os.makedirs(self.figdir, exist_ok=True)
        self.formats = tuple(formats)
        self._order = []
        self._done = {}
        self._proc = self._tmp = None
        if workers:
            self._tmp = tempfile.mkdtemp(prefix="fpemu-figures-")
            here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                filter(None, [here, os.environ.get("PYTHONPATH")])))
            self._proc = subprocess.Popen([sys.executable, "-m", "fpemu._figure_worker"],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          env=env)

    def _submit(self, key, name, *args):
        if self._proc is None:
            self._done[key] = globals()[name](*args)
            return
        path = os.path.join(self._tmp, f"{len(self._order)}.pickle")
        with open(path, "wb") as fh:
            pickle.dump((name, args), fh, protocol=pickle.HIGHEST_PROTOCOL)
        self._order.append(key)
        try:
            self._proc.stdin.write(path.encode() + b"\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            self._died(key)

    def add_intro(self):
        """Draw the formats' number line and bit layout (stems under the key None)."""
        self._submit(None, "_draw_intro", self.figdir, self.formats)

    def add(self, result):
        """Draw one experiment's figures."""
        self._submit(result.name, "_draw_result", result, self.figdir, self.formats)

    def finish(self):
        """Wait for every figure; ``{experiment name (None: the intro): [stems]}``.
        A figure that failed to draw raises its error here."""
        if self._proc is not None:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                self._died(self._order[0])
            out = self._proc.stdout
            for key in self._order:
                head = out.read(8)
                if len(head) < 8:
                    self._died(key)
                status, value = pickle.loads(out.read(struct.unpack("<Q", head)[0]))
                if status == "error":
                    self.close()
                    raise FpemuRuntimeError(f"drawing {_whose(key)} figures failed in the "
                                            f"figure process:\n{value}")
                self._done[key] = value
            self._order = []
            self.close()
        return dict(self._done)

    def _died(self, key):
        code = self._proc.wait()
        self.close()
        raise FpemuRuntimeError(f"the figure process ended (exit code {code}) before drawing "
                                f"{_whose(key)} figures; what it printed, above, may say why")

    def close(self):
        """Stop the figure process (what it has not drawn yet is not drawn)."""
        if self._proc is not None:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:             # it had ended with a path unread
                pass
            if self._proc.poll() is None and self._order:
                self._proc.kill()
            try:
                self._proc.wait(timeout=60)     # it ends at the end of its stdin
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc.stdout.close()
            self._proc = None
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _whose(key):
    return "the formats'" if key is None else f"{key}'s"


def _figure(stem, kinds=("svg", "png")):
    links = " · ".join(f'<a href="figures/{stem}.{k}">{k.upper()}</a>' for k in kinds)
    img = "png" if "png" in kinds else kinds[0]
    return (f'<figure><img src="figures/{stem}.{img}" alt="{html.escape(stem)}">'
            f'<figcaption>{links}</figcaption></figure>')


def _cell(v):
    if isinstance(v, dict):
        return _table(v)
    return f'<span class="num">{html.escape(_show(v))}</span>'


def _table(d):
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td class='num'>{_cell(v)}</td></tr>"
                   for k, v in d.items())
    return f"<table>{rows}</table>"


def _section(r, figs, kinds):
    flat = {k: v for k, v in r.numbers.items() if not isinstance(v, dict)}
    nested = {k: v for k, v in r.numbers.items() if isinstance(v, dict)}
    parts = [f'<section id="{r.name}"><h2>{html.escape(r.title)}</h2>',
             f'<p class="question">{html.escape(r.question)}</p>',
             f'<p class="setup"><b>Set-up.</b> {html.escape(r.setup)}</p>',
             f'<p class="conclusion">{html.escape(r.conclusion)}</p>']
    parts += [_figure(s, kinds) for s in figs]
    parts.append("<h3>Numbers</h3>" + _table(flat))
    for k, v in nested.items():
        parts.append(f"<details><summary>{html.escape(k)}</summary>{_table(v)}</details>")
    options = ", ".join("--" + k.replace("_", "-") for k in _fields(r))
    parts.append(f'<p class="setup">Run time {r.seconds:.2f} s · '
                 f'<code>fpemu run {r.name}</code> runs it again; options: '
                 f'{html.escape(options)}</p></section>')
    return "\n".join(parts)


def _fields(r):
    return [f.name for f in dataclasses.fields(r.config)]


def _page(results, sections, intro, seconds, kinds):
    nav = " ".join(f'<a href="#{r.name}">{html.escape(r.title)}</a>' for r in results)
    when = f"{seconds:.0f} s" if seconds else "—"
    head = (f"<h1>fpemu: mixed precision, measured</h1>"
            f'<p class="lead">Every number below was computed by fpemu {__version__}\'s '
            f"bit-exact emulation of the formats and of PyTorch's CUDA numerics, on "
            f"{html.escape(platform.machine())} in {when}. Each section asks one question, "
            f"runs one experiment, and draws its conclusion from the numbers it got.</p>"
            f"<nav>{nav}</nav>")
    if intro:
        head += ("<h2>The formats</h2><p>Where each format's values lie (log axis: the "
                 "density of ticks is the precision, their extent the range), and the bits "
                 "of 0.1 in each.</p>" + "".join(_figure(s, kinds) for s in intro))
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>fpemu demo report</title><style>{CSS}</style></head><body>"
            f"{head}{''.join(sections)}"
            f"<p class='setup'>Written by <code>fpemu demo</code>; the numbers are in "
            f"<a href='results.json'>results.json</a>.</p></body></html>\n")


def demo(out_dir="out", quick=False, progress=True, figure_formats=("svg", "png"),
         figure_workers=1):
    """Run every experiment and write the report; returns (index path, results, seconds).

    The figures are drawn by ``figure_workers`` processes of their own while
    the experiments run (:class:`FigureWriter`; 0: in this process, after
    them)."""
    t0 = time.perf_counter()
    with FigureWriter(out_dir, figure_formats, figure_workers) as figures:
        figures.add_intro()
        results = run_all(quick=quick, progress=progress, on_result=figures.add)
        seconds = time.perf_counter() - t0
        path = write_report(out_dir, results, seconds, figure_formats=figure_formats,
                            figures=figures)
    return path, results, time.perf_counter() - t0


__all__ = ["run_all", "write_report", "demo", "FigureWriter"]
