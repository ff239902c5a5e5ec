"""PNG plots for runs (matplotlib, Agg canvas: no display, no pyplot global state, thread-safe).

    plot_timeseries(path, x, {"GPU util %": util, "memory GiB": {"used": used, "reserved": res}})
    plot_system(sampler.samples, path)          utilization + memory (+ fragmentation) over time
    plot_throughput(meter.records, path)        real/slot tokens/s and useful/dense MFU over steps
    plot_length_histogram(lengths, fill, path)  document lengths with the pack fill annotated

Every function writes via a temp file + rename and returns the path; ~50-150 KB per PNG at 110 dpi.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

Series = Sequence[float] | Mapping[str, Sequence[float]]


def _figure(n_panels: int, width: float = 8.0, height_per: float = 2.4):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, max(2.8, height_per * n_panels)), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_panels, 1, sharex=True, squeeze=False)[:, 0]
    return fig, list(axes)


def save_figure(fig, path: str | Path) -> Path:
    """`fig` laid out and written as PNG to `path` through a temporary file beside it and a rename: a reader sees
    the earlier image or the new one, whole. Returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.tight_layout()
    fig.savefig(tmp, format="png")
    tmp.replace(path)
    return path


def plot_timeseries(path: str | Path, x: Sequence[float], series: Mapping[str, Series], *,
                    xlabel: str = "step", title: str = "") -> Path:
    """One panel per entry of `series`: a list of y values, or {label: ys} overlaid with a legend."""
    if not series:
        raise ValueError("plot_timeseries needs at least one series")
    fig, axes = _figure(len(series))
    for ax, (name, ys) in zip(axes, series.items(), strict=True):
        lines = ys if isinstance(ys, Mapping) else {name: ys}
        for label, vals in lines.items():
            ax.plot(list(x)[: len(vals)], list(vals), label=label, linewidth=1.2)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        if isinstance(ys, Mapping) and len(ys) > 1:
            ax.legend(loc="best", fontsize=8)
    axes[-1].set_xlabel(xlabel)
    if title:
        axes[0].set_title(title)
    return save_figure(fig, path)


def plot_system(samples: Sequence[Mapping], path: str | Path, title: str = "") -> Path:
    """Utilization and memory over time from `SystemSampler.samples` (GPU or CPU kind)."""
    if not samples:
        raise ValueError("plot_system needs at least one sample")
    t = [s["t"] for s in samples]
    gpu = "power_w" in samples[0]
    util_label = "GPU util %" if gpu else "CPU util % (process)"
    util: Series = [s["util"] for s in samples]
    if not gpu and "sys_util" in samples[0]:
        util = {"process": cast(Sequence[float], util), "system": [s.get("sys_util", 0.0) for s in samples]}
    mem: dict[str, list[float]] = {"used (NVML)" if gpu else "RSS": [s["mem_used_gib"] for s in samples]}
    if all("reserved_gib" in s for s in samples):
        mem["reserved"] = [s["reserved_gib"] for s in samples]
        mem["allocated"] = [s["alloc_gib"] for s in samples]
    series: dict[str, Series] = {util_label: util, "memory GiB": mem}
    if all("fragmentation" in s for s in samples):
        series["fragmentation"] = [s["fragmentation"] for s in samples]
    return plot_timeseries(path, t, series, xlabel="seconds", title=title or "system utilization and memory")


def plot_throughput(records: Sequence[Mapping], path: str | Path, title: str = "") -> Path:
    """Tokens/s and MFU per step from `ThroughputMeter.records`."""
    if not records:
        raise ValueError("plot_throughput needs at least one record")
    steps = [r["step"] for r in records]
    series: dict[str, Series] = {
        "tokens/s": {"real": [r["real_tokens_per_s"] for r in records],
                     "slot": [r["slot_tokens_per_s"] for r in records]},
        "MFU": {"useful": [r["useful_mfu"] for r in records], "dense": [r["dense_mfu"] for r in records]},
    }
    return plot_timeseries(path, steps, series, xlabel="step", title=title or "throughput")


def plot_length_histogram(lengths: Sequence[int], fill: float, path: str | Path, budget: int | None = None,
                          bins: int = 60) -> Path:
    """Histogram of document lengths (tokens, log-count axis), annotated with the pack fill and budget."""
    import numpy as np

    arr = np.asarray(lengths, dtype=np.int64)
    if arr.size == 0:
        raise ValueError("plot_length_histogram needs at least one length")
    fig, (ax,) = _figure(1, height_per=3.6)
    ax.hist(arr, bins=bins, color="#4477aa")
    ax.set_yscale("log")
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel("documents")
    if budget:
        ax.axvline(budget, color="#cc3311", linestyle="--", linewidth=1.2, label=f"budget {budget}")
        ax.legend(loc="upper right", fontsize=8)
    text = (f"fill {fill:.2%}  ·  {arr.size:,} docs  ·  median {int(np.median(arr)):,}"
            f"  ·  p99 {int(np.percentile(arr, 99)):,}  ·  max {int(arr.max()):,}")
    ax.set_title(text, fontsize=9)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
