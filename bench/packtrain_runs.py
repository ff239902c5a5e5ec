"""packtrain's own `train()` observed from outside, and variants run in turn (long-context, fp8, fsdp2 suites);
`packtrain run` as a subprocess (cpu-run, gpu-pipeline, seed-spread suites).

    run_packtrain_cli(cmd, cwd, label, env)  `cmd` in `cwd` under a clean environment (clean_env: no tracking
                                      server or parent run of the calling shell), 1 h at most → (finished
                                      process, wall s); SystemExit naming `label`, the command and its output
    run_seconds(stdout, wall)         the run summary's own "N stages in X s", else the wall time (rounded)

    run_packtrain(cfg, inputs, ...)   packtrain's `train()` (smoke_run) + what smoke_run does not return: the loss
                                      curve, the steps' peak memory (after setup), Σs and Σs² per step, the
                                      planner's prediction for the same shape and its error
    planner_prediction(cfg, ...)      the memory planner's peak for the run's shape (the call `packtrain plan` makes)
    run_variants(record, write, names, run)  record.rows gets {"variant": name, **run(name)} in turn; an OOM or a
                                      refusal is recorded (failure_row) and the next one runs on freed memory;
                                      SIGTERM cuts a row to the steps it logged (cut_row)
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

from bench.harness import GIB, Record, write_record
from bench.workload import loss_tail_mean


def clean_env() -> dict[str, str]:
    """os.environ without the calling shell's MLFLOW_TRACKING_URI and PACKTRAIN_PARENT_RUN_ID: a bench run tracks
    into its own working directory, never into the developer's server or under the developer's run."""
    return {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PACKTRAIN_PARENT_RUN_ID")}


def run_packtrain_cli(cmd: list[str], cwd: Path, label: str,
                      env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """`cmd` (a packtrain command line) in `cwd` under `env` (default clean_env()), an hour at most: (the finished
    process, its wall seconds). A failed run is a SystemExit naming `label`, the command, its exit code and the
    tails of its stdout (4,000 characters) and stderr (6,000)."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=clean_env() if env is None else env, capture_output=True, text=True,
                       timeout=3600)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{label}: `{' '.join(map(str, cmd))}` failed (exit {r.returncode}):\n{r.stdout[-4000:]}\n"
                         f"{r.stderr[-6000:]}")
    return r, wall


def run_seconds(stdout: str, wall: float) -> float:
    """The run summary's own figure ("packtrain run — tiny-cpu — 7 stages in 27.9 s" → 27.9), else `wall` rounded
    to 0.1 s (a command that prints no summary)."""
    m = re.search(r"stages in ([\d.]+) s", stdout)
    return float(m.group(1)) if m else round(wall, 1)


def free_device() -> None:
    """Drop compile caches, garbage and cached blocks, reset the peak counters (between variants, after an OOM)."""
    import torch

    torch._dynamo.reset()   # compiled graphs hold the last run's module (and its parameters) alive
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def failure_row(e: BaseException) -> dict:
    """{"error", "oom", "peak_alloc_gib_at_failure"} of a failed variant (run_variants frees the memory after)."""
    import torch

    oom = (isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()
           or type(e).__name__ == "TrainOutOfMemory")
    peak = torch.cuda.max_memory_allocated() / GIB if torch.cuda.is_available() else 0.0
    return {"error": f"{type(e).__name__}: {str(e)[:800]}", "oom": oom, "peak_alloc_gib_at_failure": peak}


@contextlib.contextmanager
def observe_train(steady_from: int = 0, skip_save: bool = True, skip_checkpoint: bool = False):
    """What smoke_run does not return, observed by wrapping packtrain.train.loop's run_step and train (restored
    on exit): the steps' peak memory — step_peak: reset before the first step, after the model, compile wrappers
    and optimizer are built; steady_peak: reset again before step `steady_from` (0-based), so compile-time
    workspace of the first steps is left out (the planner's quantity) — Σs and Σs² of each step's documents, and
    the TrainResult (its loss_curve, per-step history). Yields a dict filled as the run goes.

    skip_save: TrainSession.save_model returns None instead of writing model/ — after the timed steps, so no
    number changes, but a 3B fp32 save (12.8 GB gathered, serialized, written) costs ~20 s of a short lease.
    skip_checkpoint: TrainSession.save_checkpoint does nothing — the resumable checkpoint a run writes after its
    last step (3B: parameters + Adam states, 40-60 s on an H100:
    history/fp8_bench_3b_h100_run1_rows_auto_bf16_fp8nomix.json) is not timed either."""
    import torch

    from packtrain.train import loop
    from packtrain.train.session import TrainSession

    obs: dict = {"fp8_linears": None, "module": None, "setup_peak_alloc_gib": None, "step_peak_alloc_gib": 0.0,
                 "step_peak_reserved_gib": 0.0, "steady_peak_alloc_gib": 0.0, "steady_peak_reserved_gib": 0.0,
                 "sum_s": [], "sum_s2": [], "result": None, "progress": [], "warmup": steady_from}
    inner_step, inner_train, inner_save = loop.run_step, loop.train, TrainSession.save_model
    inner_record, inner_checkpoint = TrainSession.record, TrainSession.save_checkpoint
    cuda = torch.cuda.is_available()

    def run_step(m, window, *a, **kw):
        if not obs["sum_s"]:   # first step: what setup built
            fp8 = getattr(m, "fp8_linears", None)
            obs["fp8_linears"] = len(fp8) if fp8 is not None else None
            obs["module"] = type(m.module).__name__
            if cuda:
                obs["setup_peak_alloc_gib"] = torch.cuda.max_memory_allocated() / GIB
                torch.cuda.reset_peak_memory_stats()
        n = len(obs["sum_s"])   # this step's index
        if cuda and n == steady_from and n:
            torch.cuda.reset_peak_memory_stats()
        lens = [s for b in window for s in b.seq_lens]
        obs["sum_s"].append(sum(lens))
        obs["sum_s2"].append(sum(s * s for s in lens))
        out = inner_step(m, window, *a, **kw)
        if cuda:
            obs["step_peak_alloc_gib"] = max(obs["step_peak_alloc_gib"], torch.cuda.max_memory_allocated() / GIB)
            obs["step_peak_reserved_gib"] = max(obs["step_peak_reserved_gib"],
                                                torch.cuda.max_memory_reserved() / GIB)
            if n >= steady_from:
                obs["steady_peak_alloc_gib"] = max(obs["steady_peak_alloc_gib"],
                                                   torch.cuda.max_memory_allocated() / GIB)
                obs["steady_peak_reserved_gib"] = max(obs["steady_peak_reserved_gib"],
                                                      torch.cuda.max_memory_reserved() / GIB)
        return out

    def train(*a, **kw):
        obs["result"] = inner_train(*a, **kw)
        return obs["result"]

    def record(self, step, window, n_labels, loss, *a, **kw):   # each step as it is logged (a cut run keeps them)
        m = inner_record(self, step, window, n_labels, loss, *a, **kw)
        obs["progress"].append({"step": step, "loss": loss, "real_tokens_per_s": m.get("real_tokens_per_s"),
                                "useful_mfu": m.get("useful_mfu")})
        return m

    loop.run_step, loop.train, TrainSession.record = run_step, train, record
    _LIVE["obs"] = obs
    if skip_save:
        TrainSession.save_model = lambda self: None
    if skip_checkpoint:
        TrainSession.save_checkpoint = lambda self, step: None
    try:
        yield obs
    finally:
        loop.run_step, loop.train, TrainSession.save_model = inner_step, inner_train, inner_save
        TrainSession.record, TrainSession.save_checkpoint = inner_record, inner_checkpoint


def causal_fraction(cfg, vocab: int, sum_s: list[int], sum_s2: list[int]) -> float:
    """useful FLOPs with the attention term halved (what a causal kernel executes) over packtrain's convention
    (full s², telemetry.mfu), summed over the measured steps. 1B, documents of 32k: attention is ~half the
    work, so this is ~0.75; at 2k budgets ~0.95."""
    from packtrain.model.build import llama_config
    from packtrain.planner.shapes import shape_of_config
    from packtrain.telemetry.mfu import model_flop_dims

    hf = llama_config(cfg.model, vocab, "sdpa")
    dims = model_flop_dims(hf)
    per_tok = 6.0 * shape_of_config(hf).n_params_nonembed + 6.0 * dims["hidden_size"] * dims["vocab_size"]
    attn = 12.0 * dims["n_layers"] * dims["attn_width"] * sum(sum_s2)
    lin = per_tok * sum(sum_s)
    return (lin + attn / 2) / (lin + attn) if lin + attn else 1.0


def run_packtrain(cfg, tokens_dir: Path, packs_dir: Path, out_dir: Path, steps: int, warmup: int,
                  vocab: int, skip_checkpoint: bool = False) -> dict:
    """`steps` optimizer steps of `cfg` through packtrain's `train()` (smoke_run; the first `warmup` are not
    measured). Returns smoke_run's numbers (tokens/s and MFU = the meter's steady-state medians) plus
    loss_curve, step_times_s, the steps' peak memory, useful_mfu_causal (attention halved) and the planner's
    predicted peak for the run's shape with its error (planner_peak_alloc_gib / steady_peak_alloc_gib − 1, the
    peak over the measured steps; planner_error_vs_step_peak: against every step's, compile included).
    skip_checkpoint: observe_train's (no resumable checkpoint after the last step)."""
    import shutil

    from packtrain.testing.gpu_smoke import smoke_run

    t = cfg.train
    planned = planner_prediction(cfg, cfg.pack.budget, vocab, "cpu" if t.device == "cpu" else "cuda")
    try:
        with observe_train(steady_from=warmup, skip_checkpoint=skip_checkpoint) as obs:
            r = smoke_run(cfg, tokens_dir, packs_dir, out_dir, t.attention, steps, engine=t.engine,
                          compile=t.compile, warmup_steps=warmup)
    finally:   # the saved model (12.8 GB at 3B in fp32) is not evidence: free the disk for the next row
        shutil.rmtree(out_dir, ignore_errors=True)
    res = obs["result"]
    hist = res.history if res is not None else []
    m = warmup + (len(obs["sum_s"]) - len(hist))  # (a resumed run would have fewer history rows)
    frac = causal_fraction(cfg, vocab, obs["sum_s"][m:], obs["sum_s2"][m:]) if obs["sum_s"][m:] else None
    return {**r, "useful_mfu_causal": r["useful_mfu"] * frac if r.get("useful_mfu") and frac else None,
            "causal_fraction": frac, "setup_peak_alloc_gib": obs["setup_peak_alloc_gib"],
            "fp8_linears": obs["fp8_linears"], "module": obs["module"], "model_saved": False,
            "step_peak_alloc_gib": obs["step_peak_alloc_gib"] or None,
            "step_peak_reserved_gib": obs["step_peak_reserved_gib"] or None,
            "steady_peak_alloc_gib": obs["steady_peak_alloc_gib"] or None,
            "steady_peak_reserved_gib": obs["steady_peak_reserved_gib"] or None,
            "loss_curve": list(res.loss_curve) if res is not None else [],
            "loss_tail10": loss_tail_mean(list(res.loss_curve)) if res is not None else None,
            "step_times_s": [h["step_time_s"] for h in hist], "setup": res.setup if res is not None else {},
            "params": res.params if res is not None else {}, "timings": res.timings if res is not None else {},
            "sum_sq_over_sum": sum(obs["sum_s2"][m:]) / max(1, sum(obs["sum_s"][m:])), **planned,
            "planner_error": (planned["planner_peak_alloc_gib"] / obs["steady_peak_alloc_gib"] - 1
                              if obs["steady_peak_alloc_gib"] and planned.get("planner_peak_alloc_gib") else None),
            "planner_error_vs_step_peak": (planned["planner_peak_alloc_gib"] / obs["step_peak_alloc_gib"] - 1
                                           if obs["step_peak_alloc_gib"] and planned.get("planner_peak_alloc_gib")
                                           else None)}


def planner_prediction(cfg, budget: int, vocab: int, device: str) -> dict:
    """The planner's peak for this run's shape: choose_shape + plan_shape, the calls `packtrain plan` and
    `train()` make (packtrain.planner.micro_batch). A planner failure is recorded, the run still measures."""
    try:
        from packtrain.planner import choose_shape, plan_shape

        shape = choose_shape(cfg.model, cfg.train, budget, cfg.plan, vocab, device=device)
        plan = plan_shape(cfg.model, cfg.train, shape, cfg.plan, vocab, device=device)
        return {"planner_rows": shape.rows, "planner_peak_alloc_gib": plan.peak_allocated_gib,
                "planner_peak_gib": plan.peak_gib, "planner_peak_phase": plan.peak_phase,
                "planner_components_gib": {k: v / GIB for k, v in plan.components.items() if v}}
    except Exception as e:  # noqa: BLE001
        return {"planner_failure": f"{type(e).__name__}: {e}"}


class Cut(BaseException):
    """SIGTERM (what `timeout` sends) arrived during a variant: record what it did and stop."""


_LIVE: dict = {}
"""The observation of the run in progress (observe_train), for a row cut by SIGTERM."""


def cut_row(obs: dict | None) -> dict:
    """A variant stopped by SIGTERM: the steps it logged — their loss curve, the median per-step tok/s and useful
    MFU after the warm-up (the meter's statistic over fewer steps), the last step reached."""
    prog = (obs or {}).get("progress", [])
    steady = [p for p in prog if p["step"] > (obs or {}).get("warmup", 0)]

    def median(key: str) -> float | None:
        vals = [p[key] for p in steady if p[key] is not None]
        return statistics.median(vals) if vals else None

    last = prog[-1]["step"] if prog else 0
    curve = [p["loss"] for p in prog]
    return {"error": f"cut by SIGTERM (the part's timeout) after step {last}", "cut": True, "cut_at_step": last,
            "real_tokens_per_s": median("real_tokens_per_s"), "useful_mfu": median("useful_mfu"),
            "loss_curve": curve, "loss_tail10": loss_tail_mean(curve), "measured_steps": len(steady)}


def by_variant(record: Record) -> dict[str, dict]:
    """{variant name: row} of a record's rows."""
    return {r["variant"]: r for r in record.rows}


def run_variants(record: Record, out: Path, names: list[str], run) -> Record:
    """record.rows += {"variant": name, **run(name)} for each name in turn; a failure (an OOM, a refusal) becomes
    failure_row(e) and
    the next variant still runs on freed memory. The record is rewritten after every variant, so a timeout of a
    later one keeps what was measured; SIGTERM (`timeout`'s signal) during a variant records it as cut_row (the
    steps it logged) and skips the rest, so the caller still compares and writes. Prints one JSON line per
    variant (without the curves)."""
    import signal
    import traceback

    from packtrain.errors import ConfigError

    def on_term(signum, frame):
        raise Cut()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        for name in names:
            free_device()
            t0 = time.perf_counter()
            _LIVE.clear()
            try:
                row = run(name)
            except Cut:
                row = cut_row(_LIVE.get("obs"))
                record.extra["cut"] = f"{name} cut by SIGTERM after step {row['cut_at_step']}; later variants not run"
            except Exception as e:  # noqa: BLE001
                if not isinstance(e, ConfigError):   # a refusal says all in its message
                    traceback.print_exc()
                row = {**failure_row(e), "refused": isinstance(e, ConfigError)}
            free_device()   # after the except block: the failed frames are gone, their tensors collectable
            row["variant_wall_s"] = time.perf_counter() - t0
            record.rows.append({"variant": name, **row})
            print(json.dumps({name: {k: v for k, v in row.items() if k not in ("loss_curve", "step_times_s")}},
                             default=str), flush=True)
            write_record(out, record)
            if "cut" in record.extra:
                break
    finally:
        signal.signal(signal.SIGTERM, previous)
    return record


def run_compared(record: Record, out: Path, names: list[str], run, compare, show) -> Record:
    """run_variants(record, out, names, run), then compare(record) (comparisons and goal_met) and show(record)
    (the console table); returns the record."""
    run_variants(record, out, names, run)
    compare(record)
    show(record)
    return record
