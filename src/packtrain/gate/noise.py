"""Noise-aware default rules: each threshold from the recorded run-to-run noise of the device kind.

`bench/gate_noise.py` repeats an unchanged training run N times and records, per canonical metric,

    noise = (max − min) / |median|          e.g. CPU real tokens/s 6 repeats: 4,610 … 5,380 → 15.6%

in bench/baselines/noise-<kind>.json; `NOISE` below holds the same figures (a test keeps them equal). A
default rule allows

    max(floor, SAFETY · noise)  rounded up to a whole percent; SAFETY = 2 (few repeats underestimate the
                                 spread: the widest of 6 draws covers ~70% of a normal's 2σ range)

and a metric whose allowance would exceed REPORT_ONLY_ABOVE (50%) is only reported on that device kind: it
cannot tell a regression from noise there. So is CPU utilization, whatever its figure: the CPU share a
process gets depends on everything else the machine runs (run to run ~12% on a 2-core CI machine), so
on a CPU, utilization alone never fails a gate. Deterministic metrics (pack fill, padding: the same data
and seed give the same packs) have noise 0 and keep their floor.
"""

from __future__ import annotations

import math

from packtrain.gate.rules import Rule

NOISE_FILES = {"cpu": "bench/baselines/noise-cpu.json", "gpu": "bench/baselines/noise-gpu.json"}
SAFETY = 2.0
REPORT_ONLY_ABOVE = 0.5

NOISE: dict[str, dict[str, float]] = {
    "cpu": {},
    "gpu": {},
}
"""Recorded noise per device kind and canonical metric (bench/baselines/noise-<kind>.json "metrics.*.noise")."""

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


def allowance(kind: str, metric: str, floor: float) -> float | None:
    """The allowed relative change of `metric` on device kind `kind`; None → report only.

    >>> allowance("cpu", "pack.fill", 0.005)
    0.005
    """
    noise = NOISE.get(kind, {}).get(metric, 0.0)
    allowed = max(floor, math.ceil(100 * SAFETY * noise - 1e-9) / 100)
    return None if allowed > REPORT_ONLY_ABOVE else allowed


def noise_rules(kind: str) -> dict[str, Rule]:
    """{canonical name: Rule} of the built-in rules for device kind "cpu" or "gpu" (module doc)."""
    from packtrain.gate.metrics import BY_NAME

    rules: dict[str, Rule] = {}
    for name, floor, abs_tol in GATED:
        m = BY_NAME[name]
        noise = NOISE.get(kind, {}).get(name)
        why = ALWAYS_REPORT_ONLY.get(kind, {}).get(name)
        allowed = None if why else allowance(kind, name, floor)
        if allowed is None:
            note = why or f"{kind} noise {100 * (noise or 0):.0f}%: report only"
            rules[name] = Rule(name, m.direction, required=False, note=note)
            continue
        note = f"{kind} noise {100 * noise:.1f}%" if noise else ""
        higher = m.direction == "higher"
        rules[name] = Rule(name, m.direction, abs_tol=abs_tol, required=False, note=note,
                           max_drop=allowed if higher else None, max_rise=None if higher else allowed)
    for name, why in REPORTED.items():
        rules[name] = Rule(name, BY_NAME[name].direction, required=False, note=why)
    return rules


def device_kind(device: str | None) -> str | None:
    """"cpu" for the `packtrain.gpu` tag value "cpu", "gpu" for a GPU name, None when unknown."""
    if not device:
        return None
    return "cpu" if device.strip().lower() == "cpu" else "gpu"
