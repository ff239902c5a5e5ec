"""The comparison as text (terminal), Markdown (CI summary) and one self-contained HTML file.

    format_table(comp)    runs, params that differ by stage, headline numbers, gate verdicts, curves drawn
    render_markdown(comp) the same as Markdown tables
    write_report(comp, out_dir) -> {"html", "json", "md": Path}   the three files in out_dir
    render_html(comp)     the same + one figure per curve group (loss, eval loss, tokens/s, MFU, utilization,
                          memory): a subplot per metric (≤ 3), a line per run (its own dash style), axes labelled
                          with their unit, one x range per group; PNGs base64-embedded
                          (`data:image/png;base64,…`), so the file opens from an MLflow artifact view, a CI
                          artifact or a mail attachment with nothing next to it (~40 KB a figure at 90 dpi)

A curve group without any series (e.g. MFU of runs logged before telemetry existed) is shown as a sentence
saying so, never as an empty picture. tests/stages/test_compare_html.py opens the HTML in headless Chromium.
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

from packtrain.publish import atomic_write_text, write_json

if TYPE_CHECKING:
    from packtrain.gate.compare import Comparison


def _num(v: float | None) -> str:
    if v is None:
        return "–"
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _grid(rows: list[list[str]], indent: str = "") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(v.ljust(widths[i]) for i, v in enumerate(r)).rstrip() for r in rows]


def run_rows(comp: Comparison) -> list[list[str]]:
    """[["", label...], ["name", ...], ["run id", ...], ["train run", ...], ["experiment", ...], ["status", ...]]."""
    rs = comp.runs
    return [["", *(r.label + (" (baseline)" if i == 0 and len(rs) > 1 else "") for i, r in enumerate(rs))],
            ["name", *(r.name or "–" for r in rs)],
            ["run id", *(r.run_id for r in rs)],
            ["train run", *((r.train_run_id or "–") if r.train_run_id != r.run_id else "(itself)" for r in rs)],
            ["experiment", *(r.experiment for r in rs)],
            ["status", *(r.status for r in rs)]]


def param_rows(comp: Comparison) -> list[tuple[str, list[list[str]]]]:
    """(stage, [[param, value per run]]) for each stage with a differing param."""
    return [(stage, [[k, *("–" if v is None else str(v)[:60] for v in vals)] for k, vals in params.items()])
            for stage, params in comp.params_differ.items()]


def delta(base: float | None, v: float | None) -> str:
    """A candidate's change against the baseline: '+1,200 (+15.0%)'; from 0 the absolute change alone
    ('+0.0102 (from 0)'), never '+inf'.

    >>> delta(8000.0, 9200.0), delta(0.0, 0.0102), delta(0.5, 0.5), delta(None, 1.0)
    ('+1,200 (+15.0%)', '+0.0102 (from 0)', '0 (+0.0%)', '–')
    """
    if base is None or v is None or not (math.isfinite(base) and math.isfinite(v)):
        return "–"
    d = v - base
    absolute = "0" if d == 0 else (f"{d:+,.0f}" if abs(d) >= 1000 else f"{d:+.4g}")
    if base == 0:
        return absolute if d == 0 else f"{absolute} (from 0)"
    return f"{absolute} ({d / abs(base):+.1%})"


def headline_header(comp: Comparison) -> list[str]:
    """["metric", label per run, "Δ <label>" per run after the baseline]."""
    labels = [r.label for r in comp.runs]
    return ["metric", *labels, *(f"Δ {lab} vs baseline" for lab in labels[1:])]


def headline_cells(comp: Comparison) -> list[list[str]]:
    """A row per headline number: each run's value, then each candidate's change against the baseline."""
    return [[f"{label} [{name}]", *(_num(v) for v in vals), *(delta(vals[0], v) for v in vals[1:])]
            for label, name, vals in comp.headline]


def gate_line(comp: Comparison, i: int) -> str:
    """Verdict of candidate runs[i + 1] vs the baseline runs[0], e.g. 'REGRESSION: pipeline·75d35eb2 vs
    baseline pipeline·01943b11 (built-in defaults): 2 of 31 metrics regressed (summary.useful_mfu dropped
    9.1% > 5%, ...); 0 missing'."""
    g = comp.gates[i]
    regs = ", ".join(f"{r.metric} {r.reason}".strip() for r in g.regressions[:6])
    more = f" (+{len(g.regressions) - 6})" if len(g.regressions) > 6 else ""
    miss = ", ".join(r.metric for r in g.missing[:6])
    return (f"{g.verdict}: {comp.runs[i + 1].label} vs baseline {comp.runs[0].label} ({g.rules}): "
            f"{len(g.regressions)} of {len(g.rows)} metrics regressed" + (f" ({regs}{more})" if regs else "")
            + f"; {len(g.missing)} missing" + (f" ({miss})" if miss else ""))


def gate_rows(g) -> list[list[str]]:
    """The gate's rows (GateRow: metric, baseline, candidate, change, rule, verdict, reason) with a header."""
    def change(r):
        if r.change is None:
            return "–"
        return f"{r.change:+.2%}" if math.isfinite(r.change) else delta(r.baseline, r.candidate)   # from 0

    return [["metric", "baseline", "candidate", "change", "rule", "verdict", "why"],
            *([r.metric, _num(r.baseline), _num(r.candidate), change(r), r.rule, r.verdict, r.reason or ""]
              for r in g.rows)]


def format_table(comp: Comparison) -> str:
    """The terminal view (see the module docstring)."""
    out = [f"compare: {len(comp.runs)} runs" + (", the first is the gate's baseline" if len(comp.runs) > 1 else "")]
    out += _grid(run_rows(comp), "  ")
    out.append(f"params that differ: {comp.n_differ} of {comp.n_params}" + (", by stage:" if comp.n_differ else ""))
    for stage, rows in param_rows(comp):
        out.append(f"  {stage}")
        out += _grid(rows, "    ")
    if comp.headline:
        out.append("headline (the gate's metric names):")
        out += _grid([headline_header(comp), *headline_cells(comp)], "  ")
    out += [f"gate {gate_line(comp, i)}" for i in range(len(comp.gates))]
    drawn = " · ".join(f"{t}: {', '.join(ms) or 'none'}" for t, ms in comp.curves.items())
    out.append(f"curves: {drawn}")
    out += [f"note: {n}" for n in comp.notes]
    return "\n".join(out)


def _md_table(rows: list[list[str]]) -> list[str]:
    esc = [[c.replace("|", "\\|") for c in r] for r in rows]
    return ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(esc[0])] + ["| " + " | ".join(r) + " |"
                                                                            for r in esc[1:]]


def render_markdown(comp: Comparison) -> str:
    labels = [r.label for r in comp.runs]
    out = [f"## packtrain compare: {len(comp.runs)} runs", ""] + _md_table(run_rows(comp)) + [""]
    out.append(f"### Params that differ ({comp.n_differ} of {comp.n_params})")
    for stage, rows in param_rows(comp):
        out += ["", f"**{stage}**", ""] + _md_table([["param", *labels], *rows])
    if comp.headline:
        out += ["", "### Headline", ""] + _md_table([headline_header(comp), *headline_cells(comp)])
    if comp.gates:
        out += ["", "### Gate", ""] + [f"- {gate_line(comp, i)}" for i in range(len(comp.gates))]
    out += [""] + [f"- note: {n}" for n in comp.notes]
    return "\n".join(out) + "\n"


# -- figures -------------------------------------------------------------------------------------------------
def curve_figure(comp: Comparison, title: str) -> str | None:
    """Base64 PNG of one curve group: a subplot per drawn metric, a line per run; None when nothing to draw."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = comp.curves.get(title) or []
    if not names:
        return None
    fig = Figure(figsize=(4.2 * len(names), 3.2), dpi=90)
    FigureCanvasAgg(fig)
    from packtrain.gate.compare import x_label, y_label

    # one x range for the whole group (the runs' series side by side, not each subplot zoomed on its own)
    axes = fig.subplots(1, len(names), squeeze=False, sharex=len({x_label(n) for n in names}) == 1)[0]
    styles = ("-", "--", ":", "-.")   # a later run's line never hides an earlier one's completely
    for ax, name in zip(axes, names, strict=True):
        for k, (run, hist) in enumerate(zip(comp.runs, comp.histories[name], strict=True)):
            if hist:
                xs, ys = zip(*hist, strict=True)
                ax.plot(xs, ys, linestyle=styles[k % len(styles)], alpha=0.85, linewidth=1.6 if k else 2.2,
                        marker="o" if len(hist) == 1 else "." if len(hist) < 40 else None, label=run.label)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(x_label(name), fontsize=8)
        ax.set_ylabel(y_label(name), fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _table(rows: list[list[str]], head: bool = True) -> str:
    esc = [[html.escape(c) for c in r] for r in rows]
    thead = "<thead><tr>" + "".join(f"<th>{c}</th>" for c in esc[0]) + "</tr></thead>" if head else ""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in (esc[1:] if head else esc))
    return f"<table>{thead}<tbody>{body}</tbody></table>"


_CSS = ("body{font-family:system-ui,sans-serif;margin:2em;color:#222;background:#fff}"
        "table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;"
        "text-align:left}th{background:#f3f3f3}img{max-width:100%;display:block;margin:.6em 0}"
        ".PASS{color:#1a7f37}.REGRESSION,.MISSING{color:#cf222e}.note{color:#7a5a00}"
        ".curves{display:flex;flex-wrap:wrap;gap:0 2em}.curves h3{margin:.8em 0 0}.curves p.note{max-width:30em}")


def render_html(comp: Comparison) -> str:
    """The whole report as one HTML string (no external resource: CSS inline, images as data: URIs)."""
    labels = [r.label for r in comp.runs]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>packtrain compare</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>packtrain compare: {len(comp.runs)} runs</h1>",
             _table(run_rows(comp)),
             f"<h2>Params that differ ({comp.n_differ} of {comp.n_params})</h2>"]
    for stage, rows in param_rows(comp):
        parts += [f"<h3>{html.escape(stage)}</h3>", _table([["param", *labels], *rows])]
    if comp.headline:
        parts += ["<h2>Headline</h2>", _table([headline_header(comp), *headline_cells(comp)])]
    if comp.gates:
        parts.append("<h2>Gate</h2>")
        for i, g in enumerate(comp.gates):
            cls = g.verdict.split()[0]
            parts.append(f"<p class='gate {cls}'><b>{html.escape(g.verdict)}</b> "
                         f"{html.escape(gate_line(comp, i).split(': ', 1)[1])}</p>")
            rows = gate_rows(g)
            failed = [r for r in rows[1:] if r[5] != "pass"]
            if failed:
                parts.append(_table([rows[0], *failed]))
            parts.append(f"<details><summary>all {len(rows) - 1} gated metrics</summary>{_table(rows)}</details>")
    parts.append("<h2>Curves (train stage runs)</h2><div class='curves'>")
    for title in comp.curves:
        png = curve_figure(comp, title)
        if png is None:
            parts.append(f"<div><h3>{html.escape(title)}</h3><p class='note'>no {html.escape(title)} series in "
                         "these runs' metric histories</p></div>")
        else:
            said = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in comp.notes if n.startswith(f"{title}: "))
            parts.append(f"<div><h3>{html.escape(title)}</h3><img alt='{html.escape(title)} curves' "
                         f"src='data:image/png;base64,{png}'>{said}</div>")
    parts.append("</div>")
    parts += [f"<p class='note'>note: {html.escape(n)}</p>" for n in comp.notes
              if not any(n.startswith(f"{t}: ") and comp.curves[t] for t in comp.curves)]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(comp: Comparison, out_dir: Path) -> dict[str, Path]:
    """compare.html (self-contained: PNGs base64-embedded), compare.json and compare.md in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"html": out_dir / "compare.html", "json": out_dir / "compare.json", "md": out_dir / "compare.md"}
    atomic_write_text(paths["html"], render_html(comp))
    write_json(paths["json"], comp.to_dict())
    atomic_write_text(paths["md"], render_markdown(comp))
    return paths
