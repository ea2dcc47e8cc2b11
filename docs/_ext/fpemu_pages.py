"""Pages generated from the code at build time, into docs/_generated/.

Nothing in them is written by hand: the formats reference is read from
``fpemu.FORMATS`` (and the overflow columns of PyTorch and ml_dtypes are
measured by casting, when those packages are installed); the CLI reference is
``fpemu.cli.build_parser()``'s own help; the gallery runs the experiments and
saves their figures; the fidelity page replays every committed trace folder
with ``fpemu.reference.parity``; the lessons are the notebooks of
``notebooks/``, executed here (nbclient, as myst-nb would) and written with
their outputs, so that the gallery can show the figures of the lessons that
draw their own.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
OUT = DOCS / "_generated"


def _write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:      # keep mtimes: no needless rebuilds
        path.write_text(text)


def _num(v: float) -> str:
    if v != v:
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    e = math.log2(abs(v))
    if e == int(e) and abs(e) > 4:
        return f"2^{int(e)} ≈ {v:.4g}"
    return f"{v:.6g}"


# -- formats -------------------------------------------------------------------------

def _overflow_in(lib, fmt):
    """What ``lib`` gives for 2 x max (measured), or why there is nothing to measure."""
    import numpy as np
    big = 2.0 * fmt.max
    try:
        if lib == "torch":
            import torch
            dt = getattr(torch, fmt.long_name, None)
            if dt is None:
                return "no dtype"
            got = float(torch.tensor(big, dtype=torch.float64).to(dt).to(torch.float64))
        else:
            import ml_dtypes
            if fmt.long_name in ("float32", "float16"):
                dt = np.dtype(fmt.long_name)
            else:
                dt = getattr(ml_dtypes, fmt.long_name, None)
                if dt is None:
                    return "no dtype"
            with np.errstate(over="ignore"):
                got = float(np.array(big, dtype=np.float64).astype(dt).astype(np.float64))
    except ImportError:
        return "not installed"
    if got != got:
        return "NaN"
    if math.isinf(got):
        return "inf"
    return f"saturate ({_num(got)})" if got == fmt.max else _num(got)


#: What the OCP specifications define for overflow, by format (with the clause).
_OCP = {
    "e4m3fn": "saturate or NaN: both modes defined (OFP8 v1.0)",
    "e5m2": "saturate or inf: both modes defined (OFP8 v1.0)",
    "e2m3": "no inf or NaN encodings: saturate (MX v1.0)",
    "e3m2": "no inf or NaN encodings: saturate (MX v1.0)",
    "e2m1": "no inf or NaN encodings: saturate (MX v1.0)",
    "e8m0": "0xFF is NaN (MX v1.0 scale)",
}


def _yes(b):
    return "yes" if b else "no"


def formats_page():
    import fpemu
    layout = ["| format | also | bits | sign | E | M | bias | inf | NaN | −0 |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    ranges = ["| format | largest | smallest normal | smallest subnormal | spacing at 1 "
              "| precision (bits) | finite positive values |",
              "|---|---|---|---|---|---|---|"]
    for f in fpemu.FORMATS:
        nan = {"ieee": "exponent all ones", "fn": "all-ones code", "fnuz": "0x80",
               "none": "none"}[f.nan_encoding]
        sub = _num(f.min_subnormal) if f.has_subnormals else "none"
        layout.append(
            f"| `{f.name}` | `{f.long_name}` | {f.bits} | {_yes(f.signed)} | {f.exponent_bits} "
            f"| {f.mantissa_bits} | {f.bias} | {_yes(f.has_inf)} | {nan} "
            f"| {_yes(f.has_negative_zero)} |")
        ranges.append(
            f"| `{f.name}` | {_num(f.max)} | {_num(f.min_normal)} | {sub} | {_num(f.eps)} "
            f"| {f.precision} | {f.num_finite_positive} |")
    lines = layout + [""] + ranges
    pol = ["| format | fpemu default (`overflow=None`) | PyTorch cast (measured) "
           "| ml_dtypes cast (measured) | OCP |", "|---|---|---|---|---|"]
    for f in fpemu.FORMATS:
        pol.append(f"| `{f.name}` | {f.default_overflow} | {_overflow_in('torch', f)} | "
                   f"{_overflow_in('ml_dtypes', f)} | {_OCP.get(f.name, 'not an OCP format')} |")
    try:
        import torch
        tv = f"PyTorch {torch.__version__}"
    except ImportError:
        tv = "PyTorch (not installed in this build)"
    try:
        import ml_dtypes
        mv = f"ml_dtypes {ml_dtypes.__version__}"
    except ImportError:
        mv = "ml_dtypes (not installed in this build)"
    _write(OUT / "formats-table.md", "\n".join(lines) + "\n")
    _write(OUT / "overflow-table.md",
           f"Measured in this build with {tv} and {mv}: each casts 2 × max (a float64) to "
           "the format.\n\n" + "\n".join(pol) + "\n")


# -- CLI -----------------------------------------------------------------------------

def cli_page():
    import argparse

    from fpemu.cli import build_parser
    parser = build_parser()
    parts = ["```text", parser.format_help().rstrip(), "```", ""]
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in subs.choices.items():
        parts += [f"## `fpemu {name}`", "", "```text", sp.format_help().rstrip(), "```", ""]
    _write(OUT / "cli-commands.md", "\n".join(parts))


# -- gallery -------------------------------------------------------------------------

def gallery_page():
    import matplotlib
    matplotlib.use("Agg", force=True)          # this process only; kernels use inline
    import matplotlib.pyplot as plt

    from fpemu import experiments, plotting
    folder = OUT / "gallery"
    folder.mkdir(parents=True, exist_ok=True)
    entries = []

    def save(fig, stem, caption):
        plotting.save_figure(fig, folder / stem, formats=("png", "svg"), dpi=110)
        plt.close(fig)
        entries.append((stem, caption))

    fig, ax = plotting.new_axes(figsize=(11, 4.6))
    plotting.plot_bit_layout(ax=ax, value=0.1)
    save(fig, "bit-layouts", "The bit fields of seven formats, with the bits of 0.1 in each "
         "(`plot_bit_layout`).")
    fig, ax = plotting.new_axes(figsize=(11, 4.2))
    plotting.plot_number_line(ax=ax)
    save(fig, "number-line", "Every positive value of four formats on a log axis: range and "
         "density at once (`plot_number_line`).")
    fig, ax = plotting.new_axes(figsize=(11, 4.2))
    plotting.plot_rounding(2.5, "e2m1", ax=ax)
    save(fig, "rounding-modes", "A tie in FP4 (E2M1) under the six rounding modes "
         "(`plot_rounding`).")
    for name in experiments.ORDER:
        r = experiments.run(name)
        for key, fig in r.plot().items():
            save(fig, f"{name}-{key}", f"**{r.title}** (`fpemu run {name}`): {r.conclusion}")
    body = ["# Gallery of lecture figures", "",
            "Every figure below is drawn by `fpemu.plotting` in the lecture style "
            "(large type, colour-blind-safe colours, text kept as text in the SVG) when "
            "this site is built; the numbers in the captions are computed, not written. "
            "Each caption of an experiment's figure links to its SVG; the figures of the "
            "lessons follow, as the executed lessons show them.", ""]
    for stem, caption in entries:
        body += [f"```{{figure}} gallery/{stem}.png", f":alt: {stem.replace('-', ' ')}", "",
                 caption + f" [SVG](gallery/{stem}.svg)", "```", ""]
    body += ["## From the lessons", ""]
    for stem, caption in lesson_figures():
        body += [f"```{{figure}} gallery/{stem}.png", f":alt: {stem.replace('-', ' ')}", "",
                 caption, "```", ""]
    _write(OUT / "gallery.md", "\n".join(body))


# -- fidelity ------------------------------------------------------------------------

def fidelity_page():
    from fpemu.reference.parity import load_meta, parity, trace_dirs
    from fpemu.reference.scenarios import SCENARIOS
    out = []
    folders = trace_dirs(str(ROOT / "tests" / "reference"))
    if not folders:
        out.append("No trace folder is committed under `tests/reference/`.")
    for folder in folders:
        meta = load_meta(folder)
        log = io.StringIO()
        results = parity(folder, log=lambda s: print(s, file=log))
        statuses = [c.status for r in results for c in r.comparisons]
        name = os.path.basename(folder)
        out += [f"### `{name}`", "",
                f"- recorded {meta['date']} on {meta['device_name']} "
                f"(device `{meta['device']}`), torch {meta['torch_version']}, CUDA "
                f"{meta['cuda_version'] or 'none (CPU build)'}, numpy "
                f"{meta.get('numpy_version', '?')}, Python {meta.get('python_version', '?')}",
                f"- replayed when this page was built: {len(results)} scenarios, "
                f"{len(statuses)} arrays: " + ", ".join(
                    f"{statuses.count(s)} {s}" for s in sorted(set(statuses))), "",
                "| scenario | group | what it records | arrays: tier → result |",
                "|---|---|---|---|"]
        for r in results:
            info = meta["scenarios"].get(r.name, {})
            sc = SCENARIOS.get(r.name)
            desc = info.get("description") or (sc.description if sc else "")
            cells = "<br>".join(
                f"`{c.name}` {c.tier.describe()} → **{c.status}**"
                + (f" ({c.n_diff}/{c.n} differ)" if c.n_diff else "") for c in r.comparisons)
            out.append(f"| `{r.name}` | {info.get('group', '')} | {desc} | {cells} |")
        out.append("")
    _write(OUT / "fidelity-results.md", "\n".join(out) + "\n")


# -- lessons -------------------------------------------------------------------------

#: the lessons whose figures the gallery shows: these draw figures of their own
#: (the earlier lessons mostly draw the experiments' figures, which it shows already)
GALLERY_LESSONS = ("12", "13", "14")


def _execute_lesson(src: Path, folder: Path):
    """The lesson notebook ``src`` executed in ``folder`` (a failing cell fails the
    build, with its traceback), marked so that myst-nb does not run it again."""
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(src, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    nb.metadata["mystnb"] = {"execution_mode": "off"}
    return nb


def lessons_pages():
    import nbformat
    folder = OUT / "lessons"
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb")):
        nbformat.write(_execute_lesson(nb, folder), folder / nb.name)
        names.append(nb.stem)
    for stale in folder.glob("*.ipynb"):
        if stale.stem not in names:
            stale.unlink()
    toc = ["# Lessons", "",
           f"{len(names)} notebooks, each a question answered by running fpemu. They are executed "
           "when this site is built; every one ends by asserting its key numbers, so a "
           "lesson that taught a wrong number would break the build. To run them yourself "
           "with live widgets: `pip install 'fpemu[lessons]'`, then `jupyter lab "
           "notebooks/` (or `make lab`).", "",
           "```{toctree}", ":maxdepth: 1", ""] + [f"lessons/{n}" for n in names] + ["```", ""]
    _write(OUT / "lessons.md", "\n".join(toc))


def lesson_figures():
    """(stem of the PNG written into the gallery folder, caption) of every figure
    the executed lessons of ``GALLERY_LESSONS`` show, in their order."""
    import base64

    import nbformat
    figures = []
    for path in sorted((OUT / "lessons").glob("[0-9][0-9]-*.ipynb")):
        number = path.name[:2]
        if number not in GALLERY_LESSONS:
            continue
        nb = nbformat.read(path, as_version=4)
        section, k = "opening", 0
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                heads = [ln for ln in cell.source.splitlines() if ln.startswith("## ")]
                section = heads[-1][3:].strip() if heads else section
                continue
            for out in cell.get("outputs", []):
                png = out.get("data", {}).get("image/png")
                if png is None:
                    continue
                k += 1
                stem = f"lesson-{number}-{k}"
                (OUT / "gallery" / f"{stem}.png").write_bytes(base64.b64decode(png))
                figures.append((stem, f"Lesson {{doc}}`lessons/{path.stem}`, *{section}*: "
                                      f"figure {k} of the lesson."))
    return figures


def generate(app=None):
    os.environ["FPEMU_STATIC"] = "1"          # lesson widgets render as static output
    OUT.mkdir(exist_ok=True)
    formats_page()
    cli_page()
    fidelity_page()
    lessons_pages()
    if os.environ.get("FPEMU_DOCS_GALLERY", "1") != "0" or not (OUT / "gallery.md").exists():
        gallery_page()


def check_lesson_figures(app, exception):
    """Fail the build if a lesson that draws figures shows none: the notebook kernels
    must draw with the inline backend (a kernel on Agg prints ``<Figure ...>``)."""
    if exception is not None or app.builder.format != "html":
        return
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb")):
        page = Path(app.outdir) / "_generated" / "lessons" / f"{nb.stem}.html"
        if "plotting." in nb.read_text() and page.exists() and "<img" not in page.read_text():
            raise RuntimeError(f"{page.name} shows no figure although {nb.name} draws some; "
                               "the kernels must run with MPLBACKEND="
                               "module://matplotlib_inline.backend_inline (docs/conf.py)")


def setup(app):
    app.connect("builder-inited", generate)
    app.connect("build-finished", check_lesson_figures)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
