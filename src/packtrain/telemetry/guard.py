"""The utilization guard: learns a run's steady state, checks each interval for what wastes the GPU, and says why.

    each interval (telemetry.guard.interval_steps steps)  →  IntervalStats per rank (medians of the meter's
    records + the allocator / compile counters + NVML samples), gathered over ranks
    steady state  = medians of the first `window` clean intervals after telemetry.warmup_steps
    signals       throughput     tok/s < (1 − drop_fraction) × steady for `consecutive` intervals
                  data_wait      the data-wait share of the step time > max_data_wait for `consecutive` intervals
                  recompile      a torch.compile (re)compilation after the warm-up (dynamo's guard-failure reason)
                  alloc_retries  CUDA allocator retries or OOMs grew
                  fragmentation  fragmentation at the peak > telemetry.max_fragmentation
                  straggler      one rank waits for its input, or runs at a lower SM clock, than the others
                  hang           one step longer than hang_s (packtrain.telemetry.watchdog)
    cause of a drop, the first the numbers show: recompile, alloc_retries, data_wait (the wait grew by ≥ half the
                  step time's growth), straggler, throttle (SM clock −10% vs steady, or NVML throttle reasons),
                  compute (the step's own work got slower)

Each signal fires once per episode: again only after an interval without it. Worked example (interval 10, steady
40,000 tok/s at 0.100 s/step, 0.002 s of it waiting for data): an interval at 0.250 s/step with 0.150 s wait
runs 16,000 tok/s < 0.7 × 40,000, a drop; the wait grew 0.148 s of the 0.150 s → cause data_wait, "60% of the
step time waiting for input (steady 2%)". This module decides; packtrain.train.guard_run acts (checkpoint,
stop, fallback) and reports (console, MLflow, train_result.json). No torch, no MLflow import here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from packtrain.config import GuardConfig

SIGNALS = ("throughput", "data_wait", "recompile", "alloc_retries", "fragmentation", "straggler", "hang")
FALLBACKS = {"recompile": "compile_off", "alloc_retries": "release_cache", "fragmentation": "release_cache"}
"""The change a fallback makes, by cause (a throughput drop's fallback is its cause's)."""
CLOCK_DROP = 0.10
"""An SM clock this much below the steady state's counts as throttling."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pace:
    """How fast the steps went: one interval's (IntervalStats) or the learned steady state's (SteadyState)."""

    tok_s: float                    # median real tokens/s of a step
    step_s: float                   # median step time, data wait included
    wait_s: float                   # median data wait of a step
    wait_share: float               # Σ data wait / Σ step time
    sm_clock_mhz: float | None = None    # median NVML SM clock (None: no NVML)
    util: float | None = None       # mean sampler utilization 0..1


@dataclass(frozen=True, slots=True, kw_only=True)
class IntervalStats(Pace):
    """One rank's interval: its Pace (medians over its steps, this rank), cumulative counters at its end (None: not
    measured here)."""

    last_step: int
    alloc_retries: float = 0.0      # cumulative: num_alloc_retries (0 on the CPU)
    ooms: float = 0.0               # cumulative: num_ooms
    fragmentation: float | None = None   # at the peak (None: no CUDA)
    compiles: float | None = None   # cumulative dynamo compilations (None: train.compile off)
    hung_step: float | None = None  # a step of this interval the watchdog flagged (gathered, so all ranks act)
    hung_s: float | None = None     # ... open this long when flagged
    hung_in_data: float | None = None   # ... 1.0: while waiting for its micro-batches, 0.0: in the step

    def vector(self) -> list[float]:
        """The numbers as floats (None → nan), in field order: what ranks all-gather."""
        return [math.nan if v is None else float(v) for v in (getattr(self, f.name) for f in fields(self))]

    @classmethod
    def from_vector(cls, v: Sequence[float]) -> IntervalStats:
        vals = {f.name: None if isinstance(x, float) and math.isnan(x) else x for f, x in zip(fields(cls), v, strict=True)}
        return cls(**{**vals, "last_step": int(vals["last_step"] or 0)})   # type: ignore[arg-type]


def interval_stats(records: Sequence[dict], **counters: Any) -> IntervalStats:
    """IntervalStats from the ThroughputMeter records of the interval's steps (+ counters at its end).

    >>> r = [{"step": s, "step_time_s": t, "data_wait_s": w, "real_tokens_per_s": 4000 / t}
    ...      for s, t, w in ((11, 0.1, 0.0), (12, 0.3, 0.2), (13, 0.1, 0.0))]
    >>> st = interval_stats(r); (st.last_step, st.step_s, st.tok_s, round(st.wait_share, 2))
    (13, 0.1, 40000.0, 0.4)
    """
    times = [r["step_time_s"] for r in records]
    return IntervalStats(last_step=int(records[-1]["step"]),
                         tok_s=statistics.median(r["real_tokens_per_s"] for r in records),
                         step_s=statistics.median(times), wait_s=statistics.median(r["data_wait_s"] for r in records),
                         wait_share=sum(r["data_wait_s"] for r in records) / max(sum(times), 1e-12), **counters)


def _opt(values: list[float | None], fn: Callable[[list[float]], float]) -> float | None:
    xs = [v for v in values if v is not None]
    return fn(xs) if xs else None


def combine(ranks: Sequence[IntervalStats]) -> IntervalStats:
    """The run's interval over every rank: the median rank's tokens/s, the slowest rank's step time and wait,
    the largest counters and fragmentation, the lowest SM clock and utilization."""
    if len(ranks) == 1:
        return ranks[0]
    return IntervalStats(last_step=max(r.last_step for r in ranks), tok_s=statistics.median(r.tok_s for r in ranks),
                         step_s=max(r.step_s for r in ranks), wait_s=max(r.wait_s for r in ranks),
                         wait_share=max(r.wait_share for r in ranks), alloc_retries=max(r.alloc_retries for r in ranks),
                         ooms=max(r.ooms for r in ranks), fragmentation=_opt([r.fragmentation for r in ranks], max),
                         compiles=_opt([r.compiles for r in ranks], max),
                         sm_clock_mhz=_opt([r.sm_clock_mhz for r in ranks], min),
                         util=_opt([r.util for r in ranks], min), hung_step=_opt([r.hung_step for r in ranks], min),
                         hung_s=_opt([r.hung_s for r in ranks], max),
                         hung_in_data=_opt([r.hung_in_data for r in ranks], max))


@dataclass(frozen=True, slots=True, kw_only=True)
class SteadyState(Pace):
    """Medians of the learned intervals' Pace."""

    from_step: int                  # the first step of the learned intervals
    until_step: int

    @classmethod
    def learn(cls, intervals: Sequence[IntervalStats], from_step: int) -> SteadyState:
        med = statistics.median
        return cls(tok_s=med(i.tok_s for i in intervals), step_s=med(i.step_s for i in intervals),
                   wait_s=med(i.wait_s for i in intervals), wait_share=med(i.wait_share for i in intervals),
                   sm_clock_mhz=_opt([i.sm_clock_mhz for i in intervals], med),
                   util=_opt([i.util for i in intervals], med), from_step=from_step,
                   until_step=intervals[-1].last_step)


@dataclass
class GuardEvent:
    """One thing the guard saw: where, what, why (from measurements), and what it did about it."""

    step: int                       # the last step of the interval (a hang: the step that hung)
    signal: str                     # one of SIGNALS
    cause: str                      # recompile | alloc_retries | fragmentation | data_wait | straggler | throttle
                                    # | compute | slow_step
    detail: str                     # one sentence with the numbers
    value: float                    # the signal's headline number (MLflow metric guard.<signal>)
    measured: dict[str, Any] = field(default_factory=dict)
    action: str = "warn"            # the configured action: warn | checkpoint_and_stop | fallback
    outcome: str = ""               # what was done ("warned", "fallback compile_off", "stopped: exit 6", ...)
    rank: int | None = None         # the rank it names (straggler, hang), None: the run as a whole

    def line(self) -> str:
        who = f" rank {self.rank}" if self.rank is not None else ""
        return f"guard: step {self.step}{who} {self.signal} ({self.cause}): {self.detail} → {self.outcome or self.action}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fallback_change(e: GuardEvent) -> str | None:
    """The named change a fallback makes for this event: compile_off, release_cache, or None (none exists)."""
    return FALLBACKS.get(e.signal) or (FALLBACKS.get(e.cause) if e.signal == "throughput" else None)


class Guard:
    """The decisions: feed it each interval's per-rank stats (`check`), get the events. Deterministic in its
    inputs, so every rank, fed the same gathered stats, decides the same (no rank waits in a collective alone).

    `probe`: NVML clocks / throttle reasons / power of this node's GPU, read only when a drop needs a cause
    (NvmlDevice.probe; None on the CPU)."""

    def __init__(self, cfg: GuardConfig, max_fragmentation: float, probe: Callable[[], dict] | None = None):
        self.cfg, self.max_fragmentation, self.probe = cfg, max_fragmentation, probe
        self.steady: SteadyState | None = None
        self._learning: list[IntervalStats] = []
        self._prev: IntervalStats | None = None   # counters at the previous check (or at the warm-up's end)
        self._streak = dict.fromkeys(SIGNALS, 0)
        self._open: set[str] = set()             # signals whose episode is reported and not over
        self.intervals = 0

    def arm(self, reference: IntervalStats) -> None:
        """The counters at the end of the warm-up: what the first interval's deltas are against."""
        self._prev = reference

    def relearn(self) -> None:
        """Forget the steady state (a fallback changed the run): the next `window` intervals are learned again."""
        self.steady, self._learning = None, []
        self._open.discard("throughput")
        self._streak["throughput"] = self._streak["data_wait"] = 0

    def close(self, signal: str) -> None:
        """End `signal`'s episode (after its fallback): it may fire again on the next interval that shows it."""
        self._open.discard(signal)
        self._streak[signal] = 0

    def check(self, ranks: Sequence[IntervalStats], reasons: Sequence[str] = ()) -> list[GuardEvent]:
        """The events of one interval. `reasons`: dynamo's guard-failure reasons since the last check."""
        self.intervals += 1
        c, prev = combine(ranks), self._prev or ranks[0]
        self._prev = c
        d_compiles = (c.compiles or 0) - (prev.compiles or 0) if c.compiles is not None else 0
        d_retries, d_ooms = c.alloc_retries - prev.alloc_retries, c.ooms - prev.ooms
        out: list[GuardEvent] = []
        why = "; ".join(reasons[:3]) or "dynamo gave no guard-failure reason"
        self._episode(out, "recompile", d_compiles > 0, c, d_compiles, "recompile",
                      f"{d_compiles:.0f} compilation(s) after the warm-up: {why}",
                      {"compiles": d_compiles, "compiles_total": c.compiles, "reasons": list(reasons[:10])})
        self._episode(out, "alloc_retries", d_retries > 0 or d_ooms > 0, c, d_retries + d_ooms, "alloc_retries",
                      f"the CUDA allocator retried {d_retries:.0f} cudaMalloc(s) after freeing its cache"
                      f" and counted {d_ooms:.0f} OOM(s) in steps {prev.last_step + 1}-{c.last_step}",
                      {"alloc_retries": d_retries, "ooms": d_ooms, "fragmentation": c.fragmentation})
        frag = c.fragmentation
        self._episode(out, "fragmentation", frag is not None and frag > self.max_fragmentation, c, frag or 0.0,
                      "fragmentation", f"fragmentation at the peak {frag or 0:.1%} > telemetry.max_fragmentation "
                      f"{self.max_fragmentation:.0%}", {"fragmentation": frag})
        lag = straggler(ranks, self.cfg.drop_fraction)
        self._episode(out, "straggler", lag is not None, c, lag[1] if lag else 0.0, "straggler",
                      lag[2] if lag else "", lag[3] if lag else {}, rank=lag[0] if lag else None)
        share, s = c.wait_share, self.steady
        steady_share = f"; steady {s.wait_share:.0%}" if s is not None else ""
        self._streaked(out, "data_wait", share > self.cfg.max_data_wait, c, share, "data_wait",
                       f"{share:.0%} of the step time waiting for input, {c.wait_s:.3f} of {c.step_s:.3f} s a step "
                       f"(> max_data_wait {self.cfg.max_data_wait:.0%}{steady_share})",
                       {"wait_share": share, "wait_s": c.wait_s, "step_s": c.step_s,
                        "steady_wait_share": s.wait_share if s is not None else None},
                       rank=max(range(len(ranks)), key=lambda r: ranks[r].wait_share) if len(ranks) > 1 else None)
        if s is None:
            if not any(e.signal != "data_wait" for e in out):   # an interval with a hard signal is not steady
                self._learning.append(c)
                if len(self._learning) == self.cfg.window:
                    first = self._learning[0].last_step - self.cfg.interval_steps + 1
                    self.steady = SteadyState.learn(self._learning, first)
            return out
        ratio = c.tok_s / s.tok_s if s.tok_s > 0 else 1.0
        if self._streak_of("throughput", ratio < 1.0 - self.cfg.drop_fraction):
            cause, detail, extra = self._cause(c, d_compiles, d_retries + d_ooms, lag)
            if not any(e.signal == cause for e in out) and cause not in self._open:   # told already
                self._open.add("throughput")
                out.append(GuardEvent(c.last_step, "throughput", cause,
                                      f"{c.tok_s:,.0f} tok/s = {ratio:.0%} of the steady {s.tok_s:,.0f} for "
                                      f"{self.cfg.consecutive} interval(s); {detail}", ratio,
                                      {"tok_s": c.tok_s, "steady_tok_s": s.tok_s, "step_s": c.step_s,
                                       "steady_step_s": s.step_s, "wait_s": c.wait_s, "steady_wait_s": s.wait_s,
                                       "compute_s": c.step_s - c.wait_s, "steady_compute_s": s.step_s - s.wait_s,
                                       **extra}))
        return out

    # ---------------------------------------------------------------------------------------------- helpers
    def _episode(self, out: list[GuardEvent], signal: str, on: bool, c: IntervalStats, value: float, cause: str,
                 detail: str, measured: dict, rank: int | None = None) -> None:
        if not on:
            self._open.discard(signal)
        elif signal not in self._open:
            self._open.add(signal)
            out.append(GuardEvent(c.last_step, signal, cause, detail, float(value), measured, rank=rank))

    def _streak_of(self, signal: str, on: bool) -> bool:
        """Count `on` intervals in a row; True when the streak is long enough and the episode is not reported."""
        self._streak[signal] = self._streak[signal] + 1 if on else 0
        if not on:
            self._open.discard(signal)
        return self._streak[signal] >= self.cfg.consecutive and signal not in self._open

    def _streaked(self, out: list[GuardEvent], signal: str, on: bool, c: IntervalStats, value: float, cause: str,
                  detail: str, measured: dict, rank: int | None = None) -> None:
        if self._streak_of(signal, on):
            self._open.add(signal)
            out.append(GuardEvent(c.last_step, signal, cause, detail, float(value), measured, rank=rank))

    def _cause(self, c: IntervalStats, d_compiles: float, d_alloc: float, lag: tuple | None
               ) -> tuple[str, str, dict]:
        """(cause, sentence, numbers) of a throughput drop, from what this interval measured against steady."""
        s = self.steady
        assert s is not None
        grew, waited = c.step_s - s.step_s, c.wait_s - s.wait_s
        if d_compiles > 0:
            return "recompile", f"{d_compiles:.0f} compilation(s) in the interval", {}
        if d_alloc > 0:
            return "alloc_retries", f"{d_alloc:.0f} allocator retries/OOMs in the interval", {}
        if grew > 0 and waited >= 0.5 * grew:
            return "data_wait", (f"the data wait grew {waited:.3f} s of the step time's {grew:.3f} s "
                                 f"({c.wait_share:.0%} of the step waiting for input, steady {s.wait_share:.0%})"), {}
        if lag is not None:
            return "straggler", lag[2], {"straggler_rank": lag[0]}
        nv = self.probe() if self.probe is not None else {}
        clock = c.sm_clock_mhz or nv.get("sm_clock_mhz")
        slow_clock = clock is not None and s.sm_clock_mhz and clock < (1 - CLOCK_DROP) * s.sm_clock_mhz
        if slow_clock or nv.get("throttle"):
            why = ", ".join(nv.get("throttle") or []) or "no reason reported"
            return "throttle", (f"SM clock {clock or 0:.0f} MHz (steady {s.sm_clock_mhz or 0:.0f}); NVML throttle "
                                f"reasons: {why}; power {nv.get('power_w', math.nan):.0f} of "
                                f"{nv.get('power_limit_w', math.nan):.0f} W"), {"nvml": nv}
        util = f"; GPU util {c.util:.0%} (steady {s.util:.0%})" if c.util is not None and s.util else ""
        return "compute", (f"the step's own time (without data wait) grew {grew - waited:.3f} s to "
                           f"{c.step_s - c.wait_s:.3f} s with no recompile, allocator retry, data wait or throttling"
                           f" measured{util} (another process on the device? a slower kernel?)"),\
            {"nvml": nv, "util": c.util, "steady_util": s.util}


def straggler(ranks: Sequence[IntervalStats], drop: float) -> tuple[int, float, str, dict] | None:
    """(rank, excess, sentence, numbers) of a rank that holds the others back, or None. DDP makes every rank's step
    time equal (the fast ones wait in the all-reduce), so a straggler shows as its own input wait, or as its GPU's
    lower SM clock: a wait longer than the others' median by > drop × the step time, or a clock < (1 − drop) × the
    others' median.

    >>> iv = dict(last_step=20, tok_s=1e4, step_s=0.40)
    >>> a = IntervalStats(**iv, wait_s=0.01, wait_share=0.02); b = IntervalStats(**iv, wait_s=0.30, wait_share=0.75)
    >>> straggler([a, a, b], 0.3)[:2]
    (2, 0.29)
    """
    if len(ranks) < 2:
        return None
    for r, x in enumerate(ranks):
        others = [o for i, o in enumerate(ranks) if i != r]
        wait = statistics.median(o.wait_s for o in others)
        if x.wait_s - wait > drop * x.step_s:
            return r, round(x.wait_s - wait, 6), (f"rank {r} waits {x.wait_s:.3f} s a step for its input, the others "
                                                  f"{wait:.3f} s (step {x.step_s:.3f} s)"), {"wait_s": x.wait_s,
                                                                                         "others_wait_s": wait}
        clocks = [o.sm_clock_mhz for o in others if o.sm_clock_mhz]
        if x.sm_clock_mhz and clocks and x.sm_clock_mhz < (1 - drop) * statistics.median(clocks):
            med = statistics.median(clocks)
            return r, med - x.sm_clock_mhz, (f"rank {r}'s GPU runs at {x.sm_clock_mhz:.0f} MHz, the others at "
                                             f"{med:.0f}"), {"sm_clock_mhz": x.sm_clock_mhz, "others_mhz": med}
    return None


THROTTLE_BITS = {0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal",
                 0x40: "hw_thermal", 0x80: "hw_power_brake"}
"""NVML clock-event (throttle) reasons that slow a busy GPU (idle 0x1, sync boost 0x10 and display 0x100 do not)."""


class NvmlDevice:
    """This rank's GPU through NVML, opened once: `now()` (SM clock, utilization: two calls, ~20 µs, each
    interval) and `probe()` (+ clock maximum, power and its limit, temperature, active throttle reasons: when a
    drop needs a cause). `open()` is None without nvidia-ml-py or a driver (a CPU run): the guard goes on."""

    def __init__(self, nv: Any, handle: Any):
        self.nv, self.handle = nv, handle

    @classmethod
    def open(cls, ordinal: int) -> NvmlDevice | None:
        try:
            import pynvml

            from packtrain.telemetry.sampler import _nvml_handles

            pynvml.nvmlInit()
            return cls(pynvml, _nvml_handles(pynvml, [ordinal])[0][1])
        except Exception:
            return None

    def now(self) -> tuple[float | None, float | None]:
        """(SM clock MHz, utilization 0..1), None where NVML does not say."""
        try:
            clock = float(self.nv.nvmlDeviceGetClockInfo(self.handle, self.nv.NVML_CLOCK_SM))
            return clock, float(self.nv.nvmlDeviceGetUtilizationRates(self.handle).gpu) / 100.0
        except Exception:
            return None, None

    def probe(self) -> dict:
        nv, h, out = self.nv, self.handle, {}
        reads = {"sm_clock_mhz": lambda: float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                 "sm_clock_max_mhz": lambda: float(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
                 "power_w": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                 "power_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
                 "temperature_c": lambda: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))}
        for key, read in reads.items():
            try:
                out[key] = read()
            except Exception:   # a board that does not report it
                pass
        try:
            fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nv.nvmlDeviceGetCurrentClocksThrottleReasons
            bits = int(fn(h))
            out["throttle"] = [name for bit, name in THROTTLE_BITS.items() if bits & bit]
        except Exception:
            pass
        return out

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass
