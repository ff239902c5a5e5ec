"""The HTML comparison report: tables + overlaid metric curves + bar charts, one self-contained file.

Every figure is a matplotlib (Agg) PNG embedded as `data:image/png;base64,…`, so the file can be opened from
an MLflow artifact view, a CI artifact or a mail attachment without anything next to it.

    curves   one figure per group (loss, tokens/s, utilization, memory): a subplot per metric (≤ 4),
             a line per run over the metric's steps
    bars     the key metrics' latest values: a subplot per metric (≤ 9), a bar per run
"""

from __future__ import annotations

import base64
import html
import io
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packtrain.gate.compare import Comparison

MAX_CURVES_PER_GROUP = 4
MAX_BARS = 9


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def curve_figures(comp: Comparison) -> list[tuple[str, str]]:
    """(title, base64 PNG) per curve group that has a metric with more than one step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from packtrain.gate.compare import CURVE_GROUPS

    out = []
    for title, pattern in CURVE_GROUPS.items():
        names = [k for k in comp.histories if re.search(pattern, k, re.I)][:MAX_CURVES_PER_GROUP]
        if not names:
            continue
        fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.2), squeeze=False)
        for ax, name in zip(axes[0], names, strict=True):
            for run, hist in zip(comp.runs, comp.histories[name], strict=True):
                if hist:
                    steps, vals = zip(*hist, strict=True)
                    ax.plot(steps, vals, marker="." if len(hist) < 30 else None, label=run.label)
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.suptitle(title)
        out.append((title, _png(fig)))
    return out


def bar_figure(comp: Comparison) -> str | None:
    """Latest value of each key metric, one bar per run; None when no key metric has a value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in comp.key_metrics if any(v is not None for v in comp.metrics[k])][:MAX_BARS]
    if not names:
        return None
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, ax in enumerate(axes.flat):
        if i >= len(names):
            ax.axis("off")
            continue
        vals = [v if v is not None else 0.0 for v in comp.metrics[names[i]]]
        ax.bar(range(len(vals)), vals, color=[colors[j % len(colors)] for j in range(len(vals))])
        ax.set_xticks(range(len(vals)), [r.label for r in comp.runs], rotation=30, ha="right", fontsize=7)
        ax.set_title(names[i], fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def _table(rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(comp: Comparison) -> str:
    """The whole report as one HTML string."""
    runs = [["run", "run id", "experiment", "status"]] + [[r.label, r.run_id, r.experiment, r.status]
                                                          for r in comp.runs]
    figs = curve_figures(comp)
    bars = bar_figure(comp)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>packtrain compare</title><style>",
        "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}",
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}th{background:#f3f3f3}",
        "img{max-width:100%;display:block;margin:1em 0}</style></head><body>",
        f"<h1>packtrain compare: {len(comp.runs)} runs</h1>",
        _table(runs),
        f"<h2>Params that differ ({len(comp.params_differ)}; {comp.n_params_same} equal) and key metrics</h2>",
        _table(comp._rows()),
    ]
    if figs:
        parts.append("<h2>Curves</h2>")
        parts += [f"<h3>{html.escape(t)}</h3><img alt='{html.escape(t)}' src='data:image/png;base64,{b}'>"
                  for t, b in figs]
    if bars:
        parts.append(f"<h2>Key metrics</h2><img alt='key metrics' src='data:image/png;base64,{bars}'>")
    parts.append("</body></html>")
    return "\n".join(parts)
