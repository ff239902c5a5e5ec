"""`ThroughputMeter`: per-step throughput, MFU and data-wait, and a steady-state summary.

A step is what the caller times (one optimizer step over `grad_accum` micro-batches, or one micro-batch):
`step_time_s` is its whole wall time *including* `data_wait_s`, the time spent waiting on the loader.
Per step::

    real_tokens_per_s = real_tokens / step_time_s          slot_tokens_per_s = slot_tokens / step_time_s
    padding           = 1 − real_tokens / slot_tokens      data_wait_frac    = data_wait_s / step_time_s
    useful_mfu        = useful_flops / step_time_s / peak  dense_mfu         = dense_flops / step_time_s / peak

MFU is never reported above 1: steps whose useful FLOP rate exceeds the peak prove the peak estimate low (a
CPU peak measured while other processes held the cores), so the peak is raised to their rate. In the summary
`peak_scale` is the MEDIAN steady step's useful_flops / step_time_s / peak when above 1 (`typical`), not the
fastest step's: on CUDA the loop reads each step's numbers one step late, so a host hiccup shows as one long
step followed by one short one (measured on an H200: a 0.47 s step, then 0.02 s, around steps of 0.15 s) —
their sum is right, but the short one's rate is fiction, and scaling by it divided a 43% MFU by 3.2. Per step,
each value is capped at 1 on its own (`fastest` keeps the largest raw rate, for the record). Example: peak
1e12, steps of 0.9e12, 1.2e12, 1.0e12 useful FLOP/s → per-step useful MFU 0.9, 1.0, 1.0; summary peak_scale
1.0 (the median), useful MFU 1.0.
Dense MFU is divided by the same factor but may stay above 1: it counts every slot and the whole budget² score
matrix, work a document-skipping kernel (varlen, flex) never runs.

The summary drops the first `warmup_steps` records (compile, allocator growth, cuDNN autotune) and reports
medians, so one slow checkpoint save does not move it. Example: 2 warmup steps of 1.0 s and 4 steps of
0.10, 0.12, 0.10, 0.11 s at 4,000 real tokens → step_time_p50_s 0.105, real_tokens_per_s (median of 40,000, 33,333, 40,000, 36,364) 38,182.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default): percentile([1, 2, 3, 4], 90) → 3.7."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class ThroughputMeter:
    """Collect per-step metrics; `summary()` over steps after the first `warmup_steps` records."""

    def __init__(self, warmup_steps: int = 2):
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be ≥ 0, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        self.records: list[dict] = []
        self.fastest = 0.0                            # the largest useful MFU against the peaks given (may be > 1)
        self._floor = 1.0                             # a later, faster probe of the peak: raise_peak
        self._raw: list[tuple[float, float]] = []     # per record: (useful, dense) MFU against the peaks given

    def record(self, step: int, step_time_s: float, data_wait_s: float, real_tokens: int, slot_tokens: int,
               useful_flops: float, dense_flops: float, peak_flops: float,
               dense_peak_flops: float | None = None) -> dict:
        """Store one step and return its metrics (MLflow-ready floats, `step` excluded). `dense_peak_flops`:
        the dense MFU's own peak where it differs (fp8's time-weighted peaks, docs/fp8.md); default peak_flops."""
        dense_peak = peak_flops if dense_peak_flops is None else dense_peak_flops
        if step_time_s <= 0:
            raise ValueError(f"step_time_s must be > 0, got {step_time_s}")
        if not 0 <= real_tokens <= slot_tokens:
            raise ValueError(f"need 0 ≤ real_tokens ({real_tokens}) ≤ slot_tokens ({slot_tokens})")
        wait = min(max(float(data_wait_s), 0.0), step_time_s)
        raw_u = useful_flops / step_time_s / peak_flops if peak_flops > 0 else 0.0
        raw_d = dense_flops / step_time_s / dense_peak if dense_peak > 0 else 0.0
        self._raw.append((raw_u, raw_d))
        self.fastest = max(self.fastest, raw_u)
        m = {
            "step_time_s": float(step_time_s),
            "data_wait_frac": wait / step_time_s,
            "real_tokens_per_s": real_tokens / step_time_s,
            "slot_tokens_per_s": slot_tokens / step_time_s,
            "padding": 1.0 - real_tokens / slot_tokens if slot_tokens else 0.0,
            "useful_tflops": useful_flops / step_time_s / 1e12,
            "useful_mfu": raw_u / max(1.0, self._floor, raw_u),     # capped at 1 on its own (module doc)
            "dense_mfu": raw_d / max(1.0, self._floor, raw_u),
        }
        self.records.append({"step": int(step), "data_wait_s": wait, "real_tokens": int(real_tokens),
                             "slot_tokens": int(slot_tokens), **m})
        return m

    @property
    def typical(self) -> float:
        """The median steady step's useful FLOP rate over the peak it was recorded with (0 before any step)."""
        raw = self._raw[self.warmup_steps:] if len(self._raw) > self.warmup_steps else self._raw
        return statistics.median(u for u, _ in raw) if raw else 0.0

    @property
    def peak_scale(self) -> float:
        """The summary's peak over the peak the steps were recorded with: ≥ 1, the median steady step's rate
        (`typical`) or a later probe's (`raise_peak`) when either exceeds it."""
        return max(1.0, self._floor, self.typical)

    def raise_peak(self, factor: float) -> None:
        """A later, faster probe of the peak (packtrain.telemetry.mfu.PeakEstimate.reprobe): the summary's MFU is
        against `factor` × the peak the steps were recorded with (or the median step's rate, if faster)."""
        self._floor = max(self._floor, float(factor))

    @property
    def steady(self) -> list[dict]:
        """Records after warmup; all records when the run was shorter than the warmup."""
        return self.records[self.warmup_steps:] or self.records

    def summary(self) -> dict:
        """Steady-state summary (keys below; empty dict before the first record).

        steps, steady_steps, steady_state (False when every step was warmup), step_time_p50_s/_p90_s/_p99_s,
        step_time_mean_s, real_tokens_per_s / slot_tokens_per_s / useful_mfu / dense_mfu / useful_tflops
        (medians; MFU against the peak × peak_scale), data_wait_frac = Σ wait / Σ step time, padding =
        1 − Σ real / Σ slot, real_tokens, slot_tokens (totals over all steps), peak_scale.
        """
        if not self.records:
            return {}
        st = self.steady
        times = [r["step_time_s"] for r in st]
        out = {
            "steps": len(self.records),
            "steady_steps": len(st) if len(self.records) > self.warmup_steps else 0,
            "steady_state": len(self.records) > self.warmup_steps,
            "step_time_p50_s": percentile(times, 50),
            "step_time_p90_s": percentile(times, 90),
            "step_time_p99_s": percentile(times, 99),
            "step_time_mean_s": statistics.fmean(times),
            "data_wait_frac": sum(r["data_wait_s"] for r in st) / sum(times),
            "padding": 1.0 - sum(r["real_tokens"] for r in st) / max(1, sum(r["slot_tokens"] for r in st)),
            "real_tokens": sum(r["real_tokens"] for r in self.records),
            "slot_tokens": sum(r["slot_tokens"] for r in self.records),
        }
        for key in ("real_tokens_per_s", "slot_tokens_per_s", "useful_tflops"):
            out[key] = statistics.median(r[key] for r in st)
        raw = self._raw[self.warmup_steps:] if len(self.records) > self.warmup_steps else self._raw
        out["useful_mfu"] = statistics.median(u for u, _ in raw) / self.peak_scale
        out["dense_mfu"] = statistics.median(d for _, d in raw) / self.peak_scale
        out["peak_scale"] = self.peak_scale
        return out
