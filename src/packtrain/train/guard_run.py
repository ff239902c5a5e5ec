"""`RunGuard`: the utilization guard (packtrain.telemetry.guard) wired into one training run.

    the loop                                 RunGuard
    top of step t                            begin(t, "data")   the hang watchdog's mark (armed after warm-up)
    its micro-batches fetched                begin(t, "step")
    step t recorded (_finish)                observe(t)         every interval_steps after telemetry.warmup_steps:
                                                                stats (→ all-gathered over ranks) → Guard.check
    after step t, when events are pending    act(t)             report; checkpoint at t; fallback or GuardStopped
    checkpoints, evaluations                 idle()
    the end                                  summary()          train_result.json `guard`

Reports (rank 0): each event one line on stderr, MLflow metrics at its step (guard.events = events so far,
guard.<signal> = its headline number, guard.fallback = 1 where a fallback changed the run), tags
packtrain.guard.events ("2; last: recompile at step 12 (recompile) → fallback compile_off") and
packtrain.guard.fallbacks ("compile_off@12"), and out_dir/guard_events.json, rewritten at each event (so a killed
run keeps them; a resumed run continues the list) and logged as an artifact at the end or at the stop.

Fallbacks (at most telemetry.guard.max_fallbacks a run, each after a checkpoint at that step; the loop then goes
on with the next batch, so every batch is still trained on once, in order):
    compile_off     torch.compiler.set_stance("force_eager"): compiled layers run eagerly from here on (undone
                    when the run ends); the steady state is learned again
    release_cache   gc + torch.cuda.empty_cache() + peak counters reset; the next interval re-measures
                    fragmentation and allocator retries (the fallback's `after`)
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtrain.errors import GuardStopped
from packtrain.faults import fault_arg
from packtrain.telemetry.guard import (
    Guard,
    GuardEvent,
    IntervalStats,
    NvmlDevice,
    fallback_change,
    interval_stats,
)
from packtrain.telemetry.watchdog import Hang, Watchdog, stuck_order
from packtrain.train.techniques import guard_failure_reasons

if TYPE_CHECKING:
    from packtrain.config import TelemetryConfig
    from packtrain.train.session import TrainSession

EVENTS_FILE = "guard_events.json"


class RunGuard:
    def __init__(self, s: TrainSession, telemetry_cfg: TelemetryConfig, start: int):
        cfg = telemetry_cfg.guard
        self.s, self.cfg, self.on = s, cfg, cfg.enabled
        self.main = s.dist.is_main
        self.armed_at = start + telemetry_cfg.warmup_steps   # the last warm-up step
        self.nvml = NvmlDevice.open(s.device.index or 0) if self.on and s.device.type == "cuda" else None
        self.guard = Guard(cfg, telemetry_cfg.max_fragmentation, self.nvml.probe if self.nvml else None)
        self.path = s.out_dir / EVENTS_FILE
        self.previous = _previous_events(self.path, start) if self.main and self.on else []
        self.events: list[GuardEvent] = []
        self.pending: list[GuardEvent] = []
        self.fallbacks: list[dict] = []
        self.stopped: dict | None = None
        self.overhead_s = 0.0
        self._armed = False
        self._fake_retries = 0                 # fault point train.alloc_retry
        self._seen_failures: dict[Any, int] = {}
        self._eager = False
        self._hung: Hang | None = None         # several ranks: this rank's flagged step, gathered at the next interval
        self.watchdog: Watchdog | None = None
        if self.on and cfg.hang_s > 0:
            stop = cfg.actions.hang == "checkpoint_and_stop"
            beats = s.out_dir / ".guard" if s.dist.world_size > 1 else None
            self.watchdog = Watchdog(cfg.hang_s, self._on_hang, s.dist.rank, beats,
                                     exit_after_s=2 * cfg.hang_s if stop else None,
                                     before_exit=self._before_exit).start()

    # ------------------------------------------------------------------------------------------ loop marks
    def begin(self, step: int, phase: str) -> None:
        if self.watchdog is not None and step > self.armed_at:
            self.watchdog.begin(step, phase)

    def idle(self) -> None:
        if self.watchdog is not None:
            self.watchdog.idle()

    def global_sum(self, x: float) -> float:
        """s.global_sum, marked "sync" for the watchdog on several ranks: a rank waiting here for the others is
        not the stuck one (its heartbeat says so)."""
        if self.watchdog is None or self.s.dist.world_size == 1:
            return self.s.global_sum(x)
        was = self.watchdog.phase("sync")
        try:
            return self.s.global_sum(x)
        finally:
            self.watchdog.phase(was)

    # ------------------------------------------------------------------------------------------ per step
    def observe(self, step: int) -> None:
        """Step `step` is recorded (its numbers are in the meter): at interval ends, check."""
        if not self.on or step < self.armed_at:
            return
        t0 = time.perf_counter()
        if self.watchdog is not None:
            self.watchdog.done(step)
        if fault_arg("train.alloc_retry", step) is not None:   # fault-injection test hook (packtrain.faults)
            self._fake_retries += 1
        if not self._armed:
            self._armed = True
            self.guard.arm(self._stats(step, []))
            guard_failure_reasons(self._seen_failures)   # what compiled during the warm-up is not an event
        for h in self.watchdog.take() if self.watchdog is not None else []:
            if self.s.dist.world_size == 1:
                self.pending.append(self._hang_event(h))
            elif self._hung is None or h.step < self._hung.step:
                self._hung = h
        if step > self.armed_at and (step - self.armed_at) % self.cfg.interval_steps == 0:
            self._interval(step)
        self.overhead_s += time.perf_counter() - t0

    def _stats(self, step: int, records: list[dict]) -> IntervalStats:
        from packtrain.telemetry.memory import cuda_memory_stats

        mem = cuda_memory_stats(self.s.device if self.s.device.type == "cuda" else None)
        counter = self.s.parts.compile_counter
        clock, util = self.nvml.now() if self.nvml is not None else (None, None)
        counters = {"alloc_retries": mem["alloc_retries"] + self._fake_retries, "ooms": mem["ooms"],
                    "fragmentation": mem["fragmentation"], "compiles": counter.compiles if counter else None,
                    "sm_clock_mhz": clock, "util": util}
        if not records:
            return IntervalStats(last_step=step, tok_s=0.0, step_s=0.0, wait_s=0.0, wait_share=0.0, **counters)
        h = self._hung
        return interval_stats(records, hung_step=h.step if h else None, hung_s=h.open_s if h else None,
                              hung_in_data=float(h.phase == "data") if h else None, **counters)

    def _interval(self, step: int) -> None:
        from packtrain.train.distributed import gather_floats

        recs = [r for r in self.s.telemetry.meter.records[-self.cfg.interval_steps:]
                if r["step"] > step - self.cfg.interval_steps]
        mine = self._stats(step, recs)
        local, self._hung = self._hung, None
        if self.s.dist.world_size == 1:
            ranks = [mine]
        else:
            was = self.watchdog.phase("sync") if self.watchdog is not None else ""
            try:
                ranks = [IntervalStats.from_vector(v) for v in gather_floats(mine.vector(), self.s.dist)]
            finally:
                if self.watchdog is not None:
                    self.watchdog.phase(was)
        for f in self.fallbacks:
            if f["after"] is None and f["step"] < step:   # the fallback's change, measured over this interval
                f["after"] = {"tok_s": mine.tok_s, "step_s": mine.step_s, "fragmentation": mine.fragmentation,
                              "alloc_retries": mine.alloc_retries, "compiles": mine.compiles}
        events = self.guard.check(ranks, guard_failure_reasons(self._seen_failures))
        flagged = [i for i, r in enumerate(ranks) if r.hung_step is not None]
        if flagged:   # several ranks: a rank's watchdog flagged a step; every rank acts on it together
            first = min(flagged, key=lambda i: (ranks[i].hung_step or 0, -(ranks[i].hung_s or 0)))
            r = ranks[first]
            h = local if local is not None and local.step == r.hung_step else \
                Hang(int(r.hung_step or 0), "data" if r.hung_in_data else "step", r.hung_s or 0.0, first)
            events.append(self._hang_event(h, flagged=flagged))
        for e in events:
            e.action = getattr(self.cfg.actions, e.signal)
        self.pending += events

    # ------------------------------------------------------------------------------------------ hangs
    def _on_hang(self, h: Hang) -> None:
        """The watchdog thread, at once: a line naming the step (the event follows when the step returns)."""
        print(f"guard: rank {h.rank} step {h.step} has been running {h.open_s:.1f} s > hang_s {self.cfg.hang_s:g} s "
              f"(in {h.phase}; {h.stuck()})", file=sys.stderr, flush=True)

    def _hang_event(self, h: Hang, flagged: list[int] | None = None) -> GuardEvent:
        cause = "data_wait" if h.phase == "data" else "slow_step"
        rec = next((r for r in reversed(self.s.telemetry.meter.records) if r["step"] == h.step), None)
        took = f", {rec['step_time_s']:.1f} s in all" if rec and self.s.dist.world_size == 1 else ""
        who = h.stuck() + (f"; flagged by rank(s) {', '.join(map(str, flagged))}" if flagged else "")
        return GuardEvent(h.step, "hang", cause, f"step {h.step} ran {h.open_s:.1f} s > hang_s {self.cfg.hang_s:g} s"
                          f"{took} ({who})", h.open_s,
                          {"open_s": h.open_s, "hang_s": self.cfg.hang_s, "phase": h.phase, "heartbeats": h.ranks,
                           "step_time_s": rec["step_time_s"] if rec else None,
                           "data_wait_s": rec["data_wait_s"] if rec else None},
                          action=self.cfg.actions.hang, rank=_stuck_rank(h))

    def _before_exit(self, h: Hang) -> None:
        """The watchdog, when a step is still stuck after 2 × hang_s under checkpoint_and_stop: say so, dump every
        thread's stack, keep the events; the process then exits 6 (no checkpoint can be saved from here)."""
        import faulthandler
        import os

        from packtrain.error_record import ERROR_FILE_ENV, write_error_record

        e = self._hang_event(h)
        last = self.s.checkpoints.last
        resume = f"`packtrain train --resume` continues from {last}" if last else "no checkpoint was saved before it"
        e.outcome = f"process ended (exit 6) after {h.open_s:.1f} s: a stuck step cannot be checkpointed; {resume}"
        print(e.line(), file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):   # a launcher or KFP component waiting for this process: exit 6, why
            write_error_record(os.environ.get(ERROR_FILE_ENV), GuardStopped(
                f"the utilization guard ended the process: step {h.step} stuck for {h.open_s:.1f} s (hang_s "
                f"{self.cfg.hang_s:g}; {h.stuck()}); {resume}"), "train")
        faulthandler.dump_traceback(all_threads=True)
        self.events.append(e)
        self.stopped = {"step": h.step, "signal": "hang", "checkpoint": str(last) if last else None}
        if self.main:
            self._write()
            if self.s.tracker is not None:
                with contextlib.suppress(Exception):
                    self._log(e)
                    self.s.tracker.flush()

    # ------------------------------------------------------------------------------------------ actions
    def act(self, step: int) -> None:
        """Report the pending events; checkpoint at `step` when one stops or falls back; apply the fallbacks;
        raise GuardStopped (exit 6) for a checkpoint_and_stop."""
        evs, self.pending = self.pending, []
        stop = [e for e in evs if e.action == "checkpoint_and_stop"]
        changes: dict[str, list[GuardEvent]] = {}
        for e in evs:
            change = fallback_change(e) if e.action == "fallback" else None
            if e.action != "fallback":
                continue
            if change is None:
                e.outcome = f"warned: no fallback for cause {e.cause}"
            elif change not in changes and len(self.fallbacks) + len(changes) >= self.cfg.max_fallbacks:
                e.outcome = f"warned: telemetry.guard.max_fallbacks {self.cfg.max_fallbacks} reached"
            else:
                changes.setdefault(change, []).append(e)
        ckpt = self._checkpoint(step) if stop or changes else None
        for change, trigger in changes.items():
            before = self._apply(change, trigger)
            self.fallbacks.append({"step": step, "change": change, "signals": [e.signal for e in trigger],
                                   "checkpoint": ckpt, "before": before, "after": None})
            for e in trigger:
                e.outcome = f"fallback {change} (checkpoint {Path(ckpt).name})" if ckpt else f"fallback {change}"
        for e in stop:
            e.outcome = f"checkpoint {Path(ckpt).name if ckpt else '?'}, stopped (exit 6)"
        for e in evs:
            e.outcome = e.outcome or "warned"
        self.events += evs
        if self.main:
            from tqdm import tqdm

            for e in evs:
                tqdm.write(e.line(), file=sys.stderr)   # above the progress bar, not through it
                self._log(e)
            self._write()
        if stop:
            e = stop[0]
            self.stopped = {"step": step, "signal": e.signal, "checkpoint": ckpt}
            if self.main:
                self._write()
                if self.s.tracker is not None:
                    self.s.tracker.log_artifact(self.path)
            raise GuardStopped(f"the utilization guard stopped training after step {step}: {e.signal} ({e.cause}) "
                               f"at step {e.step}: {e.detail}. Checkpoint {ckpt} is kept: `packtrain train --resume` "
                               f"continues from it (telemetry.guard.actions.{e.signal}=checkpoint_and_stop; the "
                               f"events: {self.path})")

    def _checkpoint(self, step: int) -> str | None:
        s = self.s
        last = s.checkpoints.last
        if last is None or not last.name.endswith(f"{step:06d}"):
            self.idle()
            s.save_checkpoint(step)
        return str(s.checkpoints.last) if s.checkpoints.last else None

    def _apply(self, change: str, trigger: list[GuardEvent]) -> dict:
        """Make the change; returns what it changed from."""
        import gc

        import torch

        from packtrain.telemetry.memory import cuda_memory_stats, reset_peak_memory

        dev = self.s.device if self.s.device.type == "cuda" else None
        mem = cuda_memory_stats(dev)
        before = {k: mem[k] for k in ("fragmentation", "reserved_gib", "alloc_gib", "alloc_retries", "ooms")}
        if change == "compile_off":
            torch.compiler.set_stance("force_eager")
            self._eager = True
            self.guard.relearn()   # eager steps are slower: a new steady state, not a drop
        else:   # release_cache
            gc.collect()
            if dev is not None:
                torch.cuda.empty_cache()
                reset_peak_memory(dev)
        for e in trigger:
            self.guard.close(e.signal)
        return before

    # ------------------------------------------------------------------------------------------ reports
    def _log(self, e: GuardEvent) -> None:
        t = self.s.tracker
        if t is None:
            return
        n = len(self.previous) + len(self.events)
        metrics = {"guard.events": n, f"guard.{e.signal}": e.value}
        if e.outcome.startswith("fallback"):
            metrics["guard.fallback"] = 1.0
        t.log_metrics(metrics, step=e.step)
        tags = {"packtrain.guard.events": f"{n}; last: {e.signal} at step {e.step} ({e.cause}) → {e.outcome}"}
        if self.fallbacks:
            tags["packtrain.guard.fallbacks"] = ", ".join(f"{f['change']}@{f['step']}" for f in self.fallbacks)
        t.set_tags(tags)

    def summary(self) -> dict:
        """train_result.json `guard`: the settings, the steady state, every event (a resumed run's earlier ones
        first), the fallbacks with their before/after, and the guard's own cost."""
        from dataclasses import asdict

        steady = self.guard.steady
        train_s = sum(r["step_time_s"] for r in self.s.telemetry.meter.records) or 1.0
        return {"enabled": self.on, "interval_steps": self.cfg.interval_steps, "intervals": self.guard.intervals,
                "steady": asdict(steady) if steady else None,
                "events": self.previous + [e.to_dict() for e in self.events], "fallbacks": self.fallbacks,
                "stopped": self.stopped, "overhead_s": round(self.overhead_s, 6),
                "overhead_frac": round(self.overhead_s / train_s, 6)}

    def finish(self) -> dict:
        """The run ended: out_dir/guard_events.json (rank 0) and the summary for train_result.json."""
        if self.main and self.on:
            self._write()
        return self.summary()

    def _write(self) -> None:
        from packtrain.publish import atomic_write_text

        atomic_write_text(self.path, json.dumps(self.summary(), indent=2, default=str) + "\n")

    def close(self) -> None:
        """Stop the watchdog, undo compile_off (the stance is global to the process), close NVML (idempotent)."""
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
        if self._eager:
            import torch

            torch.compiler.set_stance("default")
            self._eager = False
        if self.nvml is not None:
            self.nvml.close()
            self.nvml = None


def _stuck_rank(h: Hang) -> int:
    """The rank a hang names: from the heartbeats (the one a step behind, or still in data), else the flagging one."""
    if len(h.ranks) < 2:
        return h.rank
    return int(min(h.ranks, key=stuck_order)["rank"])


def _previous_events(path: Path, start: int) -> list[dict]:
    """A resumed run continues the events its earlier attempt wrote (those up to the checkpoint it resumes from);
    a fresh run keeps an earlier run's file as guard_events.before-resume-0.json (nothing deleted implicitly)."""
    if not path.is_file():
        return []
    if start == 0:
        dst, k = path.with_name("guard_events.before-resume-0.json"), 1
        while dst.exists():
            k += 1
            dst = path.with_name(f"guard_events.before-resume-0-{k}.json")
        path.rename(dst)
        return []
    try:
        return [e for e in json.loads(path.read_text(encoding="utf-8")).get("events", []) if e["step"] <= start]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def inject_recompile(s: TrainSession, batch: Any, compiled: bool) -> None:
    """Fault point train.recompile@N: one forward of the step's first micro-batch without gradients, before the
    step. Grad mode is a dynamo guard, so the compiled layers recompile (a real guard failure); nothing is
    updated and no RNG is drawn (no dropout), so the step that follows trains as it would have."""
    import torch

    from packtrain.model.attention import model_inputs

    m = s.parts
    b = batch.to(s.device)
    with torch.no_grad(), m.autocast():
        m.module(labels=b.labels, **model_inputs(b, m.backend, compiled))
