"""The gate's metric names: one scheme, `<stage>.<key>`, the names a pipeline run logs.

A `packtrain run` keeps every final number once, on the pipeline (parent) run, prefixed by its stage; the stage
run holds its per-step series (docs/tracking.md, "The MLflow layout"). The gate, its rules files and
docs/metrics.md speak the pipeline run's names; `GATE_METRICS` says under which key the stage knows each one
(the train run's summary.json, and its metric in runs of their own or logged before this layout, where
`summary.*` repeated the train summary) and which per-step series is its history:

    canonical (rules, gate table)        pipeline run                            stage run "train"
    train.throughput.real_tokens_per_s   train.throughput.real_tokens_per_s      summary.json throughput.real_tokens_per_s,
                                                                                 real_tokens_per_s (one point per step)

    >>> canonical_name("train", "summary.real_tokens_per_s")
    'train.throughput.real_tokens_per_s'
    >>> canonical_name("pack", "fill"), canonical_name("evaluate", "eval_tokens_per_s")
    ('pack.fill', 'evaluate.tokens_per_s')

Any other stage-run metric maps to `<stage>.<its name>` (`pack` run `train.n_packs` → `pack.train.n_packs`),
which is again the pipeline run's name. Regenerate the table of docs/metrics.md (a test fails when it differs):

    python -c "import packtrain.gate.doc_tables as m; m.main(['--write', 'docs/metrics.md'])"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Direction = Literal["higher", "lower", "equal"]


@dataclass(frozen=True)
class GateMetric:
    """One canonical metric: where it is logged and which way is better."""

    name: str                      # canonical: the pipeline run's name, `<stage>.<key>`
    stage: str                     # the stage run that logs it
    key: str                       # its name in that stage run (the final value)
    direction: Direction
    unit: str
    meaning: str
    series: str | None = None      # the stage run's per-step series of the same quantity (the history)
    aliases: tuple[str, ...] = ()  # other names of the same final value in the stage run


def _train(key: str, direction: Direction, unit: str, meaning: str, series: str | None = None,
           summary: str | None = None) -> GateMetric:
    """A train-run metric `section.key` whose summary copy is `summary.<summary>`."""
    return GateMetric(f"train.{key}", "train", key, direction, unit, meaning, series,
                      (f"summary.{summary}",) if summary else ())


GATE_METRICS: tuple[GateMetric, ...] = (
    _train("throughput.real_tokens_per_s", "higher", "tokens/s",
           "real (non-padding) tokens per second, median over the steady-state steps",
           "real_tokens_per_s", "real_tokens_per_s"),
    _train("throughput.slot_tokens_per_s", "higher", "tokens/s",
           "slot tokens (real + padding) per second, steady-state median", "slot_tokens_per_s",
           "slot_tokens_per_s"),
    _train("throughput.useful_mfu", "higher", "fraction",
           "model FLOPs utilization counting only real tokens' attention, steady-state median",
           "useful_mfu", "useful_mfu"),
    _train("throughput.dense_mfu", "higher", "fraction",
           "MFU counting every slot token as dense attention, steady-state median", "dense_mfu", "dense_mfu"),
    _train("throughput.step_time_p50_s", "lower", "s", "median optimizer-step wall time (data wait included)",
           "step_time_s", "step_time_p50_s"),
    _train("throughput.data_wait_frac", "lower", "fraction", "share of step time spent waiting for batches",
           "data_wait_frac", "data_wait_frac"),
    _train("throughput.padding", "lower", "fraction", "1 − real / slot tokens of the trained batches",
           "padding", "padding"),
    _train("system.utilization", "higher", "fraction",
           "device busy fraction: NVML kernel-running share on a GPU, process CPU share on a CPU",
           None, "utilization"),
    _train("memory.peak_alloc_gib", "lower", "GiB", "CUDA allocator peak (0 on a CPU run)", None,
           "peak_alloc_gib"),
    _train("memory.peak_reserved_gib", "lower", "GiB", "CUDA reserved peak (0 on a CPU run)", None,
           "peak_reserved_gib"),
    _train("memory.fragmentation", "lower", "fraction", "1 − allocated / reserved at the CUDA peak (GPU runs)"),
    _train("memory.cpu_peak_rss_gib", "lower", "GiB",
           "peak resident memory of the train stage (its own: reset as it starts)", None, "cpu_peak_rss_gib"),
    _train("final_loss", "lower", "nats/token", "training loss of the last step"),
    GateMetric("pack.fill", "pack", "fill", "higher", "fraction", "real tokens / slot tokens of the train packs"),
    GateMetric("pack.padding_fraction", "pack", "padding_fraction", "lower", "fraction",
               "padding tokens / slot tokens of the train packs"),
    GateMetric("pack.n_packs", "pack", "n_packs", "lower", "packs", "packs of the train split"),
    GateMetric("evaluate.eval_loss", "evaluate", "eval_loss", "lower", "nats/token", "held-out loss"),
    GateMetric("evaluate.perplexity", "evaluate", "perplexity", "lower", "", "exp(held-out loss)"),
    GateMetric("evaluate.tokens_per_s", "evaluate", "eval_tokens_per_s", "higher", "tokens/s",
               "evaluation throughput (real tokens)"),
)
"""Every canonical gate metric (docs/metrics.md is generated from this)."""

BY_NAME: dict[str, GateMetric] = {m.name: m for m in GATE_METRICS}
STAGES: tuple[str, ...] = tuple(dict.fromkeys(m.stage for m in GATE_METRICS))
"""Stage runs a run tree's metrics are read from: ('train', 'pack', 'evaluate')."""

_FROM_STAGE: dict[tuple[str, str], str] = {(m.stage, k): m.name for m in GATE_METRICS for k in (m.key, *m.aliases)}


def canonical_name(stage: str, key: str) -> str:
    """The canonical name of metric `key` logged by stage run `stage` (module doc)."""
    return _FROM_STAGE.get((stage, key), f"{stage}.{key}")


def is_duplicate(stage: str, key: str) -> bool:
    """Whether stage-run metric `key` only repeats another one (`summary.*` of the train run), so a run
    tree lists it once, under the canonical name of what it repeats."""
    return key.startswith("summary.") and stage == "train"


def series_names(stage: str) -> set[str]:
    """The stage run's per-step series that are a canonical metric's history (not metrics of their own)."""
    return {m.series for m in GATE_METRICS if m.stage == stage and m.series}


def metrics_table() -> str:
    """The Markdown table of docs/metrics.md (between its markers)."""
    from packtrain.tracking.layout import STEP_CHARTS

    rows = ["| canonical name (pipeline run, rules, gate) | better | unit | stage run: its key | stage run: "
            "per-step series (chart) | meaning |", "|---|---|---|---|---|---|"]
    for m in GATE_METRICS:
        final = f"`{m.key}`" + (" (older runs also " + ", ".join(f"`{a}`" for a in m.aliases) + ")"
                                if m.aliases else "")
        if not m.series:
            series = "–"
        elif m.stage != "train" or m.series in STEP_CHARTS:
            series = f"`{m.series}`"
        else:   # no longer a chart: telemetry.json's "steps"; older runs logged it
            series = f"– (older runs: `{m.series}`)"
        rows.append(f"| `{m.name}` | {m.direction} | {m.unit or '–'} | {m.stage}: {final} | {series} | "
                    f"{m.meaning} |")
    return "\n".join(rows)


BEGIN, END = "<!-- BEGIN generated from packtrain.gate.metrics.GATE_METRICS -->", "<!-- END generated -->"


def render_doc(text: str, begin: str = BEGIN, table: str | None = None) -> str:
    """`text` with the part between `begin` and END replaced by `table` (default: `metrics_table()`)."""
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"the document lacks the markers {begin!r} … {END!r}")
    return f"{head}{begin}\n{metrics_table() if table is None else table}\n{END}{tail}"
