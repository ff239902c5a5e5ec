"""The utilization guard on the GPU: tokens/s with the guard on and off in one bench run, and an induced slowdown the
guard must detect and classify (docs/guard.md).

    python -m bench guard --out bench/results/guard_350m.json [--recipe 350m-h200] [--steps 40] [--repeats 1]
        [--docs 6000] [--interval 5] [--fault-step 25] [--delay-factor 1.0]
    python -m bench guard --smoke --out /tmp/guard      # CPU: a tiny model, the same runs, in ~30 s

1. Synthetic packed data once: lognormal document lengths at the recipe's budget (packtrain.testing.synthetic_inputs).
2. `--steps` steps of the recipe with the guard off, then on (interval `--interval` steps, steady state over 3
   intervals after telemetry.warmup_steps), `--repeats` times alternating; each run in a fresh interpreter where
   mlflow and kfp cannot be imported (the GPU image has neither: the guard must not need them).
3. The slowdown: the guard on and, from step `--fault-step` on, the loop waits `--delay-factor` × the guard-on median
   step time longer for its micro-batches (fault point train.slow_data, packtrain.faults), as a throttled loader.
4. One record: per run tokens/s, step time, MFU, NVML utilization, the guard's own time (overhead_frac) and its
   events. Goals: the guard's own time < 1% of the step time; guard-on tokens/s within 1% of guard-off (medians
   over the repeats); the slowdown detected within 3 intervals of its start and classified data_wait.

Needs torch (CUDA), transformers, numpy, pydantic, pyyaml, tokenizers, safetensors, tqdm (nvidia-ml-py for NVML
clocks in the events). Not mlflow, not kfp.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench.harness import Record, machine_info

SUMMARY = "the utilization guard: tok/s with it on vs off, and a throttled loader detected and classified"
DEVICE = "gpu"
REPO = Path(__file__).resolve().parents[2]
SMOKE_MODEL = ["model.hidden_size=64", "model.intermediate_size=176", "model.num_layers=2", "model.num_heads=4",
               "model.num_kv_heads=2", "train.device=cpu", "train.precision=fp32", "train.compile=false",
               "train.attention=sdpa", "train.loss=chunked",
               "pack.budget=256", "train.rows=2", "tokenize.vocab_size=512", "telemetry.peak_tflops=1"]
"""--smoke: the recipe at a tiny size on the CPU (peak given: no FLOP/s probe)."""
BLOCKED = ("mlflow", "kfp")
"""Modules a run's interpreter refuses to import: what the GPU image does not have."""
MAX_OVERHEAD = 0.01
DETECT_INTERVALS = 3


def run_spec(spec: dict) -> dict:
    """One run of `spec` in this interpreter: {"label", "recipe", "overrides", "data", "out", "steps", "guard",
    "interval", "fault"} → its numbers and the guard's events."""
    import torch

    from packtrain.config import load_run_config
    from packtrain.train.loop import train

    if spec.get("fault"):
        os.environ["PACKTRAIN_FAULT"] = spec["fault"]
    else:
        os.environ.pop("PACKTRAIN_FAULT", None)
    torch._dynamo.reset()   # runs sharing an interpreter (--smoke) compile afresh
    cfg = load_run_config(spec["recipe"], spec["overrides"])
    steps, t = spec["steps"], cfg.train
    train_cfg = t.model_copy(update={"max_steps": steps, "warmup_steps": min(t.warmup_steps, max(1, steps // 4)),
                                     "checkpoint": t.checkpoint.model_copy(update={"every_steps": 0})})
    guard = cfg.telemetry.guard.model_copy(update={"enabled": spec["guard"], "interval_steps": spec["interval"],
                                                   "window": 3})
    tel = cfg.telemetry.model_copy(update={"warmup_steps": min(5, max(0, steps - 2)), "guard": guard})
    data, t0 = Path(spec["data"]), time.perf_counter()
    try:
        r = train(cfg.model, train_cfg, cfg.pack, tel, data / "pack", data / "tokenize" / "tokenizer", spec["out"])
    finally:
        os.environ.pop("PACKTRAIN_FAULT", None)
    tp, g = r.throughput, r.guard or {}
    events = [{k: e.get(k) for k in ("step", "signal", "cause", "detail", "value", "rank")} for e in g.get("events", [])]
    return {"label": spec["label"], "guard": spec["guard"], "fault": spec.get("fault"), "steps": r.steps,
            "grad_accum": r.setup["grad_accum"], "real_tokens_per_s": tp.get("real_tokens_per_s"),
            "step_time_p50_s": tp.get("step_time_p50_s"), "data_wait_frac": tp.get("data_wait_frac"),
            "useful_mfu": tp.get("useful_mfu"), "nvml_util": (r.system or {}).get("utilization"),
            "recompiles": r.recompiles, "guard_overhead_s": g.get("overhead_s"),
            "guard_overhead_frac": g.get("overhead_frac"), "guard_intervals": g.get("intervals"),
            "steady_tok_s": (g.get("steady") or {}).get("tok_s"), "n_events": len(events), "events": events,
            "wall_s": round(time.perf_counter() - t0, 2)}


def _child(specs: list[dict], timeout: int) -> list[dict]:
    """Run `specs` in one fresh interpreter that cannot import BLOCKED; their rows come back through a file."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as f:
        result = Path(f.name)
    cmd = [sys.executable, "-m", "bench.suites.guard", "--run-one", json.dumps(specs), "--result", str(result)]
    try:
        proc = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True, cwd=REPO)
        text = result.read_text() if result.stat().st_size else ""
        if proc.returncode == 0 and text:
            return json.loads(text)
        return [{**s, "error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-4000:]} for s in specs]
    except subprocess.TimeoutExpired:
        return [{**s, "error": f"timed out after {timeout} s"} for s in specs]
    finally:
        result.unlink(missing_ok=True)


def slowdown_delay(rows: list[dict], delay_factor: float) -> float:
    """The loader delay of the slowdown run: `delay_factor` × the guard-on runs' median step time per micro-batch."""
    on = [r for r in rows if r.get("guard") and "error" not in r]
    step_s = _median(on, "step_time_p50_s") or 0.0
    grad_accum = (on[0]["grad_accum"] if on else 1) or 1
    return round(delay_factor * step_s / grad_accum, 6)


def slow_spec(spec: dict, delay: float) -> dict:
    """`spec` (its "fault_step" given) as the slowdown run: the guard on, the loader `delay` s slower from then on."""
    spec = dict(spec)
    return {**spec, "label": "slowdown", "guard": True, "delay_s": delay,
            "fault": f"train.slow_data@{spec.pop('fault_step')}-={delay}"}


def child_main(argv: list[str] | None = None) -> int:
    """`python -m bench.suites.guard --run-one SPECS --result FILE`: the specs in this interpreter, mlflow and kfp
    made unimportable first (an `import mlflow` anywhere on the path fails the run)."""
    p = argparse.ArgumentParser()
    p.add_argument("--run-one", required=True)
    p.add_argument("--result", required=True)
    a = p.parse_args(argv)
    for name in BLOCKED:
        sys.modules[name] = None   # type: ignore[assignment]   # `import mlflow` → ImportError
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rows = []
    for spec in json.loads(a.run_one):
        try:
            if "slow_from_on" in spec:   # the slowdown run after the on/off runs of this interpreter (--smoke)
                spec = slow_spec(spec, slowdown_delay(rows, spec.pop("slow_from_on")))
            rows.append(run_spec(spec))
            if "delay_s" in spec:
                rows[-1]["delay_s"] = spec["delay_s"]
        except Exception:  # noqa: BLE001 - recorded, the next run goes on
            rows.append({**spec, "error": traceback.format_exc()[-3000:]})
    Path(a.result).write_text(json.dumps(rows))
    return 0


def add_arguments(p) -> None:
    p.add_argument("--recipe", default="350m-h200")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=1, help="guard off/on pairs, alternating")
    p.add_argument("--docs", type=int, default=6000, help="synthetic documents (median budget/4 tokens)")
    p.add_argument("--interval", type=int, default=5, help="telemetry.guard.interval_steps")
    p.add_argument("--fault-step", type=int, default=25, help="the first step of the throttled loader")
    p.add_argument("--delay-factor", type=float, default=1.0,
                   help="extra wait per step for the micro-batches, × the guard-on median step time")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")


def _median(rows: list[dict], key: str) -> float | None:
    xs = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def run(a, out: Path) -> Record:
    import torch

    from packtrain.config import load_run_config
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    overrides: list[str] = []
    if a.smoke:
        overrides, a.docs, a.steps, a.interval, a.fault_step, a.repeats = SMOKE_MODEL, 200, 30, 3, 15, 1
    elif not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device: this suite runs on the GPU machine (or pass --smoke)")
    cfg = load_run_config(a.recipe, overrides)
    work = Path(tempfile.mkdtemp(prefix="packtrain-guard-"))
    print(f"synthetic data → {work}", file=sys.stderr)
    make_synthetic_inputs(work, n_docs=a.docs, vocab_size=cfg.tokenize.vocab_size, budget=cfg.pack.budget)
    base = {"recipe": a.recipe, "overrides": overrides, "data": str(work), "steps": a.steps, "interval": a.interval}
    specs = [{**base, "label": f"guard {'on' if on else 'off'} #{i + 1}", "guard": on,
              "out": str(work / f"run-{'on' if on else 'off'}-{i}")} for i in range(a.repeats) for on in (False, True)]
    record = Record(suite="guard", study="the utilization guard: its cost and one induced slowdown",
                    command=a.command, machine=machine_info(),
                    settings={"recipe": a.recipe, "overrides": overrides, "steps": a.steps, "repeats": a.repeats,
                              "interval_steps": a.interval, "fault_step": a.fault_step,
                              "delay_factor": a.delay_factor, "docs": a.docs, "blocked_imports": list(BLOCKED)},
                    goals={"guard_overhead_frac_max": MAX_OVERHEAD, "tok_s_on_vs_off_min": 1 - MAX_OVERHEAD,
                           "detect_within_intervals": DETECT_INTERVALS, "classified_as": "data_wait"})
    slow = {**base, "out": str(work / "run-slow"), "fault_step": a.fault_step}
    # --smoke: every run in one interpreter (one start-up), the slowdown's delay from its on runs; the GPU: one
    # interpreter per run (its own CUDA state), the slowdown's delay from the on runs before it
    if a.smoke:
        rows = _child([*specs, {**slow, "slow_from_on": a.delay_factor}], a.timeout * (len(specs) + 1))
        delay = rows[-1].get("delay_s", slowdown_delay(rows[:-1], a.delay_factor))
    else:
        rows = [r for s in specs for r in _child([s], a.timeout)]
        delay = slowdown_delay(rows, a.delay_factor)
        rows += _child([slow_spec(slow, delay)], a.timeout)
        rows[-1].setdefault("delay_s", delay)
    on = [r for r in rows[:-1] if r.get("guard") and "error" not in r]
    off = [r for r in rows[:-1] if r.get("guard") is False and "error" not in r]
    record.rows = rows
    for r in rows:
        print(json.dumps({k: r.get(k) for k in ("label", "real_tokens_per_s", "guard_overhead_frac", "n_events",
                                                 "error")}), file=sys.stderr)
    s = rows[-1]
    first = next((e for e in s.get("events") or [] if e["signal"] == "data_wait" or
                  (e["signal"] == "throughput" and e["cause"] == "data_wait")), None)
    ratio = (_median(on, "real_tokens_per_s") or 0.0) / (_median(off, "real_tokens_per_s") or float("inf"))
    record.extra = {"tok_s_on_vs_off": round(ratio, 4), "slowdown_delay_s": delay,
                    "detected_at_step": first["step"] if first else None,
                    "detected_after_steps": first["step"] - a.fault_step + 1 if first else None,
                    "detected_as": f"{first['signal']} ({first['cause']})" if first else None}
    record.goal_met = {
        "guard_overhead_under_1pct": bool(on) and all((r["guard_overhead_frac"] or 0) < MAX_OVERHEAD for r in on),
        "tok_s_on_within_1pct_of_off": bool(on and off) and ratio >= 1 - MAX_OVERHEAD,
        "slowdown_detected": first is not None and first["step"] - a.fault_step < DETECT_INTERVALS * a.interval,
        "slowdown_classified_data_wait": first is not None and first["cause"] == "data_wait",
        "runs_without_error": not any("error" in r for r in rows)}
    print(json.dumps({"goal_met": record.goal_met, **record.extra}, indent=1))
    return record


if __name__ == "__main__":
    from packtrain.process_exit import freeze_heap_at_exit

    freeze_heap_at_exit()   # no teardown collection of torch + transformers (~1.3 CPU-s)
    sys.exit(child_main())
