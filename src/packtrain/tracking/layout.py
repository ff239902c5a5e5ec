"""What goes where in MLflow: run names, the few per-step charts, the system series (docs/tracking.md, "The
MLflow layout").

    tiny-cpu · data 791d2730        pipeline run: the config as params, every stage's final numbers as
    │                               metrics <stage>.<key> (the gate's canonical names)
    ├── ingest … evaluate, register stage runs
    └── train                       charts: loss, eval_loss, real_tokens_per_s, useful_mfu at their optimizer
                                    step; system/train_* (and MLflow's system/*) at their sample time;
                                    datasets train_packs (training), eval_packs (eval); the logged model, its
                                    registered version; summary.json, train_log.jsonl, telemetry/, plots/

    >>> pipeline_run_name("tiny-cpu", "791d2730c58fc40a69c6a6a9d5b14553.dir")
    'tiny-cpu · data 791d2730'
    >>> pipeline_run_name("tiny-cpu", None)
    'tiny-cpu'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STEP_CHARTS: tuple[str, ...] = ("loss", "real_tokens_per_s", "useful_mfu")
"""The per-step series the train run logs as MLflow metrics (step = optimizer step): loss, tokens/s, MFU. With
train.eval_every_steps also `eval_loss` at each evaluation's step. Every other per-step number (lr, grad_norm,
step time, data wait, padding, slot tokens/s, dense MFU, TFLOP/s, skipped, loss scale, eval perplexity) is in
the artifacts train_log.jsonl and telemetry/telemetry.json ("steps"), not a chart of its own."""

SYSTEM_SERIES: dict[str, str] = {"util": "system/train_utilization_percentage",
                                 "mem_used_gib": "system/train_memory_used_gib",
                                 "fragmentation": "system/train_fragmentation",
                                 "power_w": "system/train_power_watts",
                                 "sm_clock_mhz": "system/train_sm_clock_mhz",
                                 "alloc_gib": "system/train_allocated_gib",
                                 "reserved_gib": "system/train_reserved_gib"}
"""The train loop's sampler records (packtrain.telemetry.sampler) → MLflow system metrics, logged at the time
of each sample (step = its index): the UI's "System metrics" tab draws them against wall-clock time next to
MLflow's own `system/cpu_utilization_percentage`, `system/gpu_0_*`, .... `util` is NVML's kernel-running
share on a GPU, this process's CPU share on a CPU; `mem_used_gib` NVML memory used, or the process RSS."""

OLD_SYSTEM_SERIES: dict[str, str] = {"system/train_utilization_percentage": "system.utilization_pct",
                                     "system/train_memory_used_gib": "system.memory_used_gib",
                                     "system/train_allocated_gib": "system.allocated_gib",
                                     "system/train_reserved_gib": "system.reserved_gib"}
"""The names runs logged before (step = milliseconds since the sampler started), still read by compare."""


def pipeline_run_name(recipe: str, data_version: str | None) -> str:
    """The pipeline run's name: the recipe, and the data version's first 8 characters once known (module doc).
    The data version is the DVC md5 of the ingest source (lineage `data_version`, the registry's dataset_md5
    tag, the Airflow DAG's data version)."""
    short = (data_version or "").removesuffix(".dir")[:8]
    return f"{recipe} · data {short}" if short else recipe


def data_version_of(stats: Mapping[str, Any] | None) -> str | None:
    """A stage's stats → its lineage's data version (None when it has none)."""
    lineage = (stats or {}).get("lineage")
    value = lineage.get("data_version") if isinstance(lineage, Mapping) else None
    return str(value) if value else None


def system_rows(samples: list[dict], t0_unix: float | None) -> list[tuple[str, float, int, int]]:
    """Sampler records → (key, value, timestamp ms, step) points of MLflow system metrics (SYSTEM_SERIES): the
    timestamp is when the sample was taken (`t0_unix` + its t), the step its index. With several GPUs sampled,
    also system/train_gpu<i>_utilization_percentage and system/train_gpu<i>_memory_used_gib per GPU. Without
    `t0_unix` (a report made before the sampler recorded it) the samples are placed before now.

    >>> system_rows([{"t": 1.5, "util": 97.0, "mem_used_gib": 60.0}], 1_700_000_000.0)
    [('system/train_utilization_percentage', 97.0, 1700000001500, 0), ('system/train_memory_used_gib', 60.0, 1700000001500, 0)]
    """
    import time

    if t0_unix is None and samples:
        t0_unix = time.time() - float(samples[-1]["t"])
    rows = []
    for i, r in enumerate(samples):
        ts = int(round((float(t0_unix or 0.0) + float(r["t"])) * 1000))
        m = {name: float(r[k]) for k, name in SYSTEM_SERIES.items() if isinstance(r.get(k), (int, float))}
        gpus = r.get("gpus") or []
        if len(gpus) > 1:   # data-parallel: each GPU's own line next to the node's mean
            for g in gpus:
                m[f"system/train_gpu{g['index']}_utilization_percentage"] = float(g["util"])
                m[f"system/train_gpu{g['index']}_memory_used_gib"] = float(g["mem_used_gib"])
        rows += [(k, v, ts, i) for k, v in m.items()]
    return rows
