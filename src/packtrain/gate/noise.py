"""Noise-aware default rules: each threshold from the recorded run-to-run noise of the device kind.

`python -m bench gate-noise` (bench/suites/gate_noise.py) repeats an unchanged training run N times and records,
per canonical metric,

    noise = (max − min) / |median|          e.g. H200 real tokens/s, 5 repeats: 155,149 … 155,608 → 0.30%

in bench/baselines/noise-<kind>.json; `NOISE` below holds the same figures (a test keeps them equal). A
default rule allows

    max(floor, SAFETY · noise)  rounded up to a whole percent; SAFETY = 2 (a handful of repeats sees less
                                 spread than the gate meets over many runs: 5 normal draws span 2.3σ on
                                 average, a 1-in-1000 difference of two runs is 4.7σ ≈ 2 × 2.3σ)

and a metric whose allowance would exceed REPORT_ONLY_ABOVE (50%) is only reported on that device kind: it
cannot tell a regression from noise there. So is CPU utilization, whatever its figure: the CPU share a
process gets depends on everything else the machine runs (4% to 59% between runs of one command on the
2-core CI machine, bench/baselines/noise-cpu.json), so on a CPU, utilization alone never fails a gate.
Deterministic metrics (pack fill, padding: the same data and seed give the same packs) have noise 0 and keep
their floor.

Only the figures and the arithmetic live here (nothing from packtrain.gate is imported); the `Rule`s they give
are built by packtrain.gate.rules.noise_rules.
"""

from __future__ import annotations

import math

NOISE_FILES = {"cpu": "bench/baselines/noise-cpu.json", "gpu": "bench/baselines/noise-gpu.json"}
SAFETY = 2.0
REPORT_ONLY_ABOVE = 0.5

NOISE: dict[str, dict[str, tuple[float, float]]] = {
    "cpu": {
        "train.throughput.real_tokens_per_s": (1.2592, 24483),
        "train.throughput.useful_mfu": (1.0277, 0.137976),
        "train.throughput.step_time_p50_s": (6.0584, 0.0441357),
        "train.throughput.data_wait_frac": (1.3186, 0.00909564),
        "train.throughput.padding": (0.0, 0.0306641),
        "train.system.utilization": (0.5916, 0.8655),
        "train.memory.peak_alloc_gib": (0.0, 0),
        "train.memory.cpu_peak_rss_gib": (0.0742, 0.57172),
        "pack.fill": (0.0, 0.964661),
    },
    "gpu": {
        "train.throughput.real_tokens_per_s": (0.003, 155236),
        "train.throughput.useful_mfu": (0.0065, 0.477707),
        "train.throughput.step_time_p50_s": (0.0035, 0.105539),
        "train.throughput.data_wait_frac": (0.7116, 0.000270962),
        "train.throughput.padding": (0.0, 0.000203857),
        "train.system.utilization": (0.0, 1),
        "train.memory.peak_alloc_gib": (0.0, 18.5589),
        "train.memory.fragmentation": (0.0, 0.0127625),
        "train.memory.cpu_peak_rss_gib": (0.0213, 2.86972),
    },
}
"""(noise, median) per device kind and canonical metric: bench/baselines/noise-<kind>.json `metrics.*`."""

# (metric, floor of the allowed relative change, abs_tol, note) — direction from packtrain.gate.metrics
GATED: tuple[tuple[str, float, float], ...] = (
    ("train.throughput.real_tokens_per_s", 0.05, 0.0),
    ("train.throughput.useful_mfu", 0.05, 0.0),
    ("train.throughput.step_time_p50_s", 0.05, 0.0),
    ("train.throughput.data_wait_frac", 0.10, 0.01),
    ("train.throughput.padding", 0.05, 0.001),
    ("train.system.utilization", 0.05, 0.0),
    ("train.memory.peak_alloc_gib", 0.05, 0.01),
    ("train.memory.fragmentation", 0.10, 0.01),
    ("train.memory.cpu_peak_rss_gib", 0.05, 0.01),
    ("pack.fill", 0.005, 0.0),
)
REPORTED: dict[str, str] = {
    "evaluate.eval_loss": "quality: the register step's champion rule decides",
}
ALWAYS_REPORT_ONLY: dict[str, dict[str, str]] = {
    "cpu": {"train.system.utilization": "CPU share depends on the machine's other load"},
}


def allowance(kind: str, metric: str, floor: float, abs_tol: float = 0.0) -> float | None:
    """The allowed relative change of `metric` on device kind `kind`; None → report only. Noise measured on
    values below `abs_tol` (GPU data wait 0.0003 ± 71%) is inside the absolute tolerance: the floor applies.

    >>> allowance("cpu", "pack.fill", 0.005), allowance("gpu", "train.throughput.real_tokens_per_s", 0.05)
    (0.005, 0.05)
    >>> allowance("cpu", "train.throughput.real_tokens_per_s", 0.05) is None     # 126% run to run
    True
    """
    noise, median = NOISE.get(kind, {}).get(metric, (0.0, 0.0))
    if abs(median) < abs_tol:
        noise = 0.0
    allowed = max(floor, math.ceil(100 * SAFETY * noise - 1e-9) / 100)
    return None if allowed > REPORT_ONLY_ABOVE else allowed


def device_kind(device: str | None) -> str | None:
    """"cpu" for the `packtrain.gpu` tag value "cpu", "gpu" for a GPU name, None when unknown."""
    if not device:
        return None
    return "cpu" if device.strip().lower() == "cpu" else "gpu"
