"""The monitor's HTML report: per-layer underflow histograms, a heat map of the flushed
share per layer and step, the amax history, and a verdict per format."""

from __future__ import annotations

import html
import math
import os

import numpy as np

from .. import plotting as fp
from ..checks import as_format


def _merge(records):
    """Counts of the same format / scale added (records of one tensor kind and step)."""
    total = None
    for r in records:
        total = r.counts if total is None else total + r.counts
    return total


def verdict(mon, fmt, scaling="none"):
    """Would ``fmt`` train this model, and with which loss scale or recipe?

    Returns ``(short, detail)``. The forward values (activations, weights) must fit
    the format; the gradients must not flush. When they would, the largest loss
    scale that keeps the largest gradient one binade below the format's largest
    value is proposed, and the share still flushed at that scale is estimated
    from the log2 histograms (to within one binade: the histogram's bins).
    """
    f = as_format(fmt)
    recs = [r for r in mon.records if r.format == f.name and r.scaling == scaling]
    if not recs:
        return "not recorded", f"{f.name} was not recorded under scaling {scaling!r}"
    fwd = [r for r in recs if r.kind in ("activation", "weight")]
    grads = [r for r in recs if r.kind in ("activation_grad", "weight_grad")]
    nonfinite = sum(r.counts.counts["nan"] + r.counts.counts["inf"] for r in recs)
    fwd_over = sum(r.overflowed for r in fwd)
    fwd_amax = max((r.amax for r in fwd), default=0.0)
    g_over = sum(r.overflowed for r in grads)
    share = _flushed_share(grads)
    g_amax = max((r.amax for r in grads), default=0.0)
    notes = []
    if nonfinite:
        notes.append(f"{nonfinite} real inf/NaN values were recorded")
    if fwd_over:
        detail = (f"{fwd_over} forward values (activations, weights) exceed {f.name}'s largest "
                  f"value {f.max:g} (amax {fwd_amax:.4g}): it needs per-tensor scaling, as the "
                  "FP8 recipes do, or a format with more range")
        cur = [r for r in mon.records if r.format == f.name and r.scaling == "current"]
        if cur:
            over = sum(r.overflowed for r in cur if r.kind in ("activation", "weight"))
            fl = _flushed_share(cur)
            detail += (f"; with current per-tensor scaling {over} values overflow and "
                       f"{fl:.2%} of the nonzero values flush")
        return "no: forward overflow", "; ".join([detail] + notes)
    fwd_flush = _flushed_share(fwd)
    if fwd_flush >= 1e-2:
        detail = (f"{fwd_flush:.2%} of the nonzero forward values (activations, weights) flush "
                  f"to zero in {f.name} (its smallest value is {f.min_subnormal:.3g}): it needs "
                  "per-tensor scaling, as the FP8 recipes do")
        cur = [r for r in mon.records if r.format == f.name and r.scaling == "current"
               and r.kind in ("activation", "weight")]
        if cur:
            detail += f"; with current per-tensor scaling {_flushed_share(cur):.2%} flush"
        return "no: forward values flush", "; ".join([detail] + notes)
    if share < 1e-3 and not g_over:
        return "yes, as it is", "; ".join(
            [f"{share:.3%} of the nonzero gradients flush to zero and none overflow, "
             "without a loss scale"] + notes)
    if g_amax > 0:
        k = math.floor(math.log2(f.max / g_amax)) - 1
        est = _estimate_flushed(grads, f, k)
        if k >= 1 and est < 1e-3:
            return f"yes, with a loss scale of 2^{k}", "; ".join(
                [f"unscaled, {share:.2%} of the nonzero gradients flush; scaled by 2^{k} (the "
                 f"largest gradient, {g_amax:.3g}, then sits a binade below {f.max:g}) about "
                 f"{est:.3%} would (estimated from the log2 histograms)"] + notes)
        return "no single loss scale", "; ".join(
            [f"unscaled, {share:.2%} of the nonzero gradients flush, and even at the largest "
             f"safe scale 2^{k} about {est:.2%} would: the gradients span more binades than "
             f"{f.name} holds; it needs per-tensor (or per-block) scaling"] + notes)
    return "yes, as it is", "; ".join(["no nonzero gradient was recorded"] + notes)


def _flushed_share(records):
    fl = sum(r.counts.counts["flushed"] for r in records)
    nz = sum(r.counts.total - r.counts.counts["zero"] - r.counts.counts["nan"]
             - r.counts.counts["inf"] for r in records)
    return fl / nz if nz else 0.0


def _estimate_flushed(records, f, k):
    """Share of the nonzero values below half the smallest subnormal once scaled by 2**k,
    from the log2 histograms (a value in bin b is in [2**b, 2**(b+1)))."""
    lost = kept = 0
    limit = math.log2(f.min_subnormal if f.has_subnormals else f.min_normal) - 1
    for r in records:
        c = r.counts
        scale_log2 = math.log2(c.scale) if c.scale > 0 else 0.0
        bins = c.bins - scale_log2 + k            # the bins of the unscaled value, then x 2**k
        lost += int(c.hist[bins + 1 <= limit].sum())
        kept += int(c.hist.sum())
    return lost / kept if kept else 0.0


def _modules(mon, kind):
    """The modules with records of ``kind``, in the order of the forward pass (the
    first layer first), then any that only the backward pass reached."""
    have = {r.module for r in mon.records if r.kind == kind}
    seen = []
    for r in mon.records:
        if r.module in have and r.module not in seen and (r.kind == "activation"
                                                          or kind not in ("activation",
                                                                          "activation_grad")):
            seen.append(r.module)
    return seen + sorted(have - set(seen))


#: rows of the per-rank table at most (the rest are in rows.json)
RANK_TABLE_ROWS = 60


def _rank_table(mon, scaling):
    """HTML of the per-rank table: for each layer, tensor kind and format whose
    ranks flushed or overflowed different numbers of values (over every
    recorded step), each rank's flushed share and overflow count."""
    ranks = sorted(mon.rank_records)
    acc = {}                 # (module, kind, format) -> {rank: [flushed, nonzero, overflow]}
    for r in mon.records:
        if r.scaling != scaling or not r.ranks:
            continue
        cell = acc.setdefault((r.sharded, r.module, r.kind, r.format), {})
        for rank, own in r.ranks.items():
            c = own.counts.counts
            v = cell.setdefault(rank, [0, 0, 0])
            v[0] += c["flushed"]
            v[1] += own.counts.total - c["zero"] - c["nan"] - c["inf"]
            v[2] += own.overflowed
    # the tensors each rank holds whole first (activations, local gradients), then shards
    differ = sorted(((k, v) for k, v in acc.items()
                     if len({(x[0], x[2]) for x in v.values()}) > 1 or len(v) < len(ranks)),
                    key=lambda kv: kv[0][0])
    out = ["<h2>Per rank</h2>"]
    if not differ:
        out.append("<p>Every rank flushed and overflowed as many values as the others in every "
                   "recorded tensor.</p>")
        return out
    out.append(f"<p>The tensors whose ranks flushed or overflowed different numbers of values, "
               f"over the {len(ranks)} ranks "
               "and every recorded step (scaling " + html.escape(scaling) + "): the share of "
               "nonzero values flushed to zero / the values that overflow, per rank; a "
               "dash where a rank recorded none. The tensors each rank holds whole come "
               "first, then the shards of sharded ones (each rank's own part).</p>")
    out.append("<table><tr><th>layer</th><th>tensor</th><th>format</th>"
               + "".join(f"<th>rank {k}</th>" for k in ranks) + "</tr>")
    for (sharded, module, kind, fmt), v in differ[:RANK_TABLE_ROWS]:
        cells = []
        for k in ranks:
            if k not in v:
                cells.append("<td>-</td>")
                continue
            fl, nz, ov = v[k]
            cells.append(f"<td>{(fl / nz if nz else 0.0):.2%} / {ov}</td>")
        what = kind.replace("_", " ") + (" (shard)" if sharded else "")
        out.append(f"<tr><td>{html.escape(module)}</td><td>{what}</td>"
                   f"<td><code>{fmt}</code></td>{''.join(cells)}</tr>")
    out.append("</table>")
    if len(differ) > RANK_TABLE_ROWS:
        out.append(f"<p>{len(differ) - RANK_TABLE_ROWS} more rows in rows.json.</p>")
    return out


def write_report(mon, out_dir, kind="activation_grad", scaling=None, dpi=110):
    """Write ``out_dir/index.html`` with its figures (PNG and SVG); returns its path."""
    import matplotlib.pyplot as plt  # optional dependency
    from matplotlib.ticker import MaxNLocator  # optional dependency
    scaling = scaling or mon.scalings[0]
    os.makedirs(out_dir, exist_ok=True)
    figs = []

    def save(fig, stem, caption):
        fp.save_figure(fig, os.path.join(out_dir, stem), formats=("png", "svg"), dpi=dpi)
        plt.close(fig)
        figs.append((stem, caption))

    steps = sorted({r.step for r in mon.records})
    last = steps[-1] if steps else None
    modules = _modules(mon, kind)
    for fname in mon.formats:
        layers = {}
        for m in modules:
            recs = [r for r in mon.records if r.step == last and r.module == m and r.kind == kind
                    and r.format == fname and r.scaling == scaling]
            if recs:
                layers[m] = _merge(recs)
        if layers:
            fig, ax = fp.new_axes(figsize=(12, 1.4 + 0.5 * len(layers)))
            fp.plot_layer_histograms(layers, fname, ax=ax,
                                     title=f"{kind.replace('_', ' ')}s per layer against "
                                           f"{fname}, step {last} (scaling: {scaling})")
            save(fig, f"layers-{fname}", f"Per-layer underflow histogram of the "
                 f"{kind.replace('_', ' ')}s in {fname} at step {last}: the grey band flushes "
                 "to zero, orange is subnormal, blue normal, red overflow.")
    if modules and steps:
        n = len(mon.formats)
        # wide enough for the layer names beside the cells (a Llama layer's
        # "model.layers.22.self_attn.q_proj" with one step collapsed the axes)
        label = max(len(str(m)) for m in modules)
        fig, axes = fp.new_axes(n, 1, figsize=(min(3.5 + 0.08 * label + 0.3 * len(steps), 20),
                                               n * (1.0 + 0.32 * len(modules))))
        axes = np.atleast_1d(axes)
        for ax, fname in zip(axes, mon.formats):
            grid = np.full((len(modules), len(steps)), np.nan)
            for r in mon.records:
                if r.kind == kind and r.format == fname and r.scaling == scaling:
                    i, j = modules.index(r.module), steps.index(r.step)
                    row = r.row()
                    grid[i, j] = row["flushed_fraction"] if np.isnan(grid[i, j]) else \
                        max(grid[i, j], row["flushed_fraction"])
            fp.plot_heatmap(grid, modules, steps, ax=ax, cbar_label="flushed",
                            title=f"{fname}: share of nonzero {kind.replace('_', ' ')}s "
                                  "flushed to zero")
        save(fig, "heatmap", "Share of each layer's nonzero values flushed to zero, per step "
             "(darker: more lost).")
        fig, axes = fp.new_axes(1, 2, figsize=(14, 5))
        for ax, k in zip(axes, ("activation", kind)):
            series = {}
            for m in _modules(mon, k):
                vals = []
                for s in steps:
                    a = [r.amax for r in mon.records if r.module == m and r.kind == k
                         and r.step == s and r.format == mon.formats[0]
                         and r.scaling == scaling]
                    vals.append(max(a) if a else np.nan)
                series[m] = vals
            if series:
                for label, vals in series.items():
                    ax.plot(steps, vals, marker="o", markersize=3, label=label)
                ax.set_yscale("log", base=2)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.set_xlabel("step")
                ax.set_ylabel("amax (largest |value|)")
                ax.set_title(f"amax of the {k.replace('_', ' ')}s", loc="left")
                if len(series) <= 12:
                    ax.legend(fontsize=9, loc="best")
        save(fig, "amax", "The largest magnitude of each layer's activations and gradients per "
             "step: what per-tensor scaling follows.")
    rows = [(f, *verdict(mon, f, scaling)) for f in mon.formats]
    merged = getattr(mon, "rank_records", None) is not None
    first = mon.first_overflow(scaling)
    sampled = sorted({(r.kind, r.counted) for r in mon.records if r.counted < r.numel})
    job = (f"{mon.world} ranks: each rank's counts added up per tensor (activations, "
           "gradients, the shards of sharded tensors), a replicated weight's and optimizer "
           "state's counted once (rank 0's). " if merged else "")
    body = [f"<h1>fpemu monitor: {html.escape(type(mon.model).__name__)}"
            + (f" ({mon.world} ranks)" if merged else "") + "</h1>",
            f"<p>{job}{len(steps)} steps recorded (every {mon.every}), {len(modules)} layers, "
            f"formats {', '.join(mon.formats)}, scaling {', '.join(mon.scalings)}. "
            + (f"Each tensor larger than {mon.sample} elements was counted on a seeded uniform "
               f"sample of {mon.sample} elements (seed {mon.seed})."
               if sampled else "Every element of every tensor was counted.") + "</p>",
            "<h2>Verdict per format</h2>", "<table><tr><th>format</th><th>would it train "
            "here?</th><th>why</th></tr>"]
    for f, short, detail in rows:
        body.append(f"<tr><td><code>{f}</code></td><td><b>{html.escape(short)}</b></td>"
                    f"<td>{html.escape(detail)}</td></tr>")
    body.append("</table>")
    body.append("<h2>First overflow</h2>")
    body.append(f"<pre>{html.escape(str(first))}</pre>" if first else
                "<p>No recorded tensor overflows any format and none holds inf or NaN.</p>")
    if merged:
        body.extend(_rank_table(mon, scaling))
    body.append("<h2>Figures</h2>")
    for stem, caption in figs:
        body.append(f'<figure><img src="{stem}.png" alt="{html.escape(stem)}" '
                    f'style="max-width:100%"><figcaption>{html.escape(caption)} '
                    f'<a href="{stem}.svg">SVG</a></figcaption></figure>')
    body.append("<p>The counts behind these figures, one row per step, module, tensor kind, "
                'format and scaling: <a href="rows.json">rows.json</a>'
                + (" (the job's rows, then each rank's own under <code>rank_rows</code>)"
                   if merged else "") + ".</p>")
    mon.to_json(os.path.join(out_dir, "rows.json"))
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>fpemu monitor</title>"
            "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;"
            "vertical-align:top;text-align:left}figure{margin:1.5em 0}"
            "figcaption{color:#444}</style></head><body>" + "\n".join(body) + "</body></html>")
    path = os.path.join(out_dir, "index.html")
    with open(path, "w") as fh:
        fh.write(page)
    return path
