"""Data-parallel scaling on one node: `packtrain train --gpus N` against the same run on one GPU.

    python -m bench scaling --out bench/results/scaling_1b_h200x2.json [--gpus 2] [--configs zero2,zero3,ddp,fsdp2]
        [--recipe 1b-h200] [--steps 24] [--rows 8] [--global-accum 4] [--docs 6000] [--timeout 300]
    python -m bench scaling --smoke --out /tmp/sc    # CPU: ddp config, tiny model, the 1-"GPU" run only

For each config (zero2 / zero3: `train.engine=deepspeed`, compile off; ddp: `train.engine=torch`; fsdp2:
`train.engine=fsdp2`; ddp and fsdp2 with the recipe's compile), two runs of the recipe through the real CLI — one GPU with grad_accum = G, N GPUs with G / N each —
so both see the same global batch (rows × budget × G tokens, the same packs per optimizer step: the loader
gives rank r the packs order[(s·N + r)·rows …], the 1-GPU run walks the same order micro-batch by micro-batch).
MLflow points at a dead server, so each run buffers its tracking locally; the buffer shows how many runs
were opened (only rank 0 opens one).

Per config the JSON holds both runs (tokens/s per GPU from every rank, peak allocated memory per rank, the
planner's prediction for 1 and N GPUs, NVML utilization per GPU, loss curves) and the comparison:
  scaling_efficiency = mean per-GPU real tokens/s at N GPUs / real tokens/s at 1 GPU   (target ≥ 0.90)
  loss_max_rel_diff  = max over steps |loss_N − loss_1| / loss_1                      (bf16: ≤ 1e-2)
  memory: measured vs predicted peak per GPU at 1 and N GPUs, and the fall between them.
goal_met says whether every run finished and met the targets. Needs CUDA and ≥ N GPUs, deepspeed for the
zero configs, mlflow(-skinny).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import GIB, Record, machine_info

SUMMARY = "data-parallel scaling on one node: packtrain train --gpus N vs one GPU, same global batch"
DEVICE = "gpu"
SMOKE = ["model.hidden_size=64", "model.intermediate_size=176", "model.num_layers=2", "model.num_heads=4",
         "model.num_kv_heads=2", "train.device=cpu", "train.precision=fp32", "train.attention=sdpa",
         "train.loss=chunked", "train.compile=false", "pack.budget=256", "tokenize.vocab_size=512"]
"""--smoke: the recipe at a tiny size on the CPU."""
EFFICIENCY_TARGET = 0.90
LOSS_REL_TOL = 1e-2
CONFIGS = {
    "zero2": ["train.engine=deepspeed", "train.deepspeed.zero_stage=2", "train.compile=false"],
    "zero3": ["train.engine=deepspeed", "train.deepspeed.zero_stage=3", "train.compile=false"],
    "ddp": ["train.engine=torch"],
    "fsdp2": ["train.engine=fsdp2"],   # compiled (the recipe's compile), fully_shard per layer
}


def predicted_peak_gib(recipe: str, overrides: list[str], gpus: int, vocab_size: int) -> dict:
    """The memory planner's per-GPU peak (allocated) for this run on `gpus` GPUs."""
    from packtrain.config import load_run_config
    from packtrain.planner.plan import plan_memory

    cfg = load_run_config(recipe, overrides)
    train_cfg = cfg.train.model_copy(update={"gpus": gpus})
    p = plan_memory(cfg.model, train_cfg, cfg.pack.budget, cfg.plan, vocab_size=vocab_size, suggest=False)
    return {"peak_alloc_gib": round(p.peak_allocated / GIB, 3), "peak_phase": p.peak_phase,
            "components_gib": {k: round(v / GIB, 3) for k, v in p.components.items()}}


def run_bounded(cmd: list[str], env: dict, timeout: float) -> tuple[int | None, str]:
    """(exit code or None on timeout, stderr). The launch gets its own session; on timeout torchrun gets
    SIGTERM (it stops its workers, which run in sessions of their own), then the whole group SIGKILL, so no
    rank is left holding a GPU for the next configuration."""
    import signal

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
        return None, err or ""


def run_one(name: str, gpus: int, a, data: Path, work: Path) -> dict:
    ga = a.global_accum // gpus
    out, buf = work / f"{name}-{gpus}gpu", work / f"{name}-{gpus}gpu-mlbuf"
    overrides = CONFIGS[name] + a.smoke_overrides + [
        f"train.rows={a.rows}", f"train.grad_accum={ga}", f"train.max_steps={a.steps}",
        f"telemetry.warmup_steps={a.warmup}", "train.checkpoint.every_steps=0", f"workdir={work}",
        f"tracking.buffer_dir={buf}", "tracking.retry_after_s=3600"]
    cmd = [sys.executable, "-m", "packtrain.cli", "train", "--recipe", a.recipe, "--gpus", str(gpus),
           "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out", str(out)]
    for o in overrides:
        cmd += ["--set", o]
    env = {**os.environ, "MLFLOW_TRACKING_URI": "http://127.0.0.1:9", "TQDM_DISABLE": "1"}
    row: dict = {"config": name, "gpus": gpus, "grad_accum_per_gpu": ga, "overrides": overrides,
                 "command": " ".join(cmd[1:])}
    t0 = time.perf_counter()
    code, stderr = run_bounded(cmd, env, a.timeout)
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    if code is None:
        return {**row, "error": f"timed out after {a.timeout} s", "stderr_tail": stderr[-4000:]}
    if code != 0 or not (out / "train_result.json").exists():
        return {**row, "error": f"exit {code}", "stderr_tail": stderr[-4000:]}
    r = json.loads((out / "train_result.json").read_text())
    mem, tp, sysm = r["memory"], r.get("throughput") or {}, r.get("system") or {}
    per_rank = mem.get("per_rank") or [{"rank": 0, "peak_alloc_gib": mem["peak_alloc_gib"],
                                        "peak_reserved_gib": mem["peak_reserved_gib"],
                                        "real_tokens_per_s": tp.get("real_tokens_per_s", 0.0)}]
    row.update(
        steps=r["steps"], tokens=r["tokens"], loss_curve=r["loss_curve"], final_loss=r["final_loss"],
        real_tokens_per_s_per_gpu=sum(x["real_tokens_per_s"] for x in per_rank) / len(per_rank),
        real_tokens_per_s_total=sum(x["real_tokens_per_s"] for x in per_rank),
        useful_mfu_rank0=tp.get("useful_mfu"), step_time_p50_s=tp.get("step_time_p50_s"),
        peak_alloc_gib_max=max(x["peak_alloc_gib"] for x in per_rank), per_rank=per_rank,
        nvml_utilization=sysm.get("utilization"), nvml_per_gpu=sysm.get("per_gpu"),
        recompiles=r.get("recompiles"), timings=r.get("timings"), setup=r.get("setup"),
        predicted=predicted_peak_gib(a.recipe, overrides, gpus, a.vocab_size),
        mlflow_runs_opened=len(list(buf.glob("*.jsonl"))) if buf.is_dir() else 0,   # one file per opened run
        mlflow_buffer=sorted(p.name for p in buf.iterdir()) if buf.is_dir() else [],
    )
    row["memory_error"] = round(row["peak_alloc_gib_max"] / row["predicted"]["peak_alloc_gib"] - 1, 4)
    return row


def compare(one: dict, many: dict) -> dict:
    eff = many["real_tokens_per_s_per_gpu"] / one["real_tokens_per_s"] if one.get("real_tokens_per_s") else None
    l1, ln = one["loss_curve"], many["loss_curve"]
    rel = max(abs(a - b) / abs(a) for a, b in zip(l1, ln, strict=True)) if l1 and len(l1) == len(ln) else None
    m1, mn = one["peak_alloc_gib_max"], many["peak_alloc_gib_max"]
    p1, pn = one["predicted"]["peak_alloc_gib"], many["predicted"]["peak_alloc_gib"]
    return {"scaling_efficiency": eff, "efficiency_ok": eff is not None and eff >= EFFICIENCY_TARGET,
            "loss_max_rel_diff": rel, "loss_ok": rel is not None and rel <= LOSS_REL_TOL,
            "memory_measured_gib": [m1, mn], "memory_predicted_gib": [p1, pn],
            "memory_fall_measured_gib": round(m1 - mn, 3), "memory_fall_predicted_gib": round(p1 - pn, 3),
            "memory_ok": abs(mn / pn - 1) <= 0.10 and abs(m1 / p1 - 1) <= 0.10}


def add_arguments(p) -> None:
    p.add_argument("--recipe", default="1b-h200")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--configs", default="zero2,zero3")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--warmup", type=int, default=8, help="telemetry warmup steps (excluded from tokens/s)")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--global-accum", type=int, default=4, help="micro-batches per optimizer step over all GPUs")
    p.add_argument("--docs", type=int, default=6000)
    p.add_argument("--timeout", type=int, default=300, help="seconds per run")


def run(a, out: Path) -> Record:
    a.smoke_overrides = SMOKE if a.smoke else []
    if a.smoke:
        a.configs, a.gpus, a.steps, a.warmup, a.rows, a.global_accum, a.docs = "ddp", 1, 2, 1, 2, 2, 200
    names = [c for c in a.configs.split(",") if c]
    bad = [c for c in names if c not in CONFIGS]
    if bad or a.global_accum % a.gpus:
        raise SystemExit(f"--configs {bad} not in {sorted(CONFIGS)}" if bad else
                         f"--global-accum {a.global_accum} must be a multiple of --gpus {a.gpus}")

    import torch

    from packtrain.config import load_run_config
    from packtrain.testing.gpu_smoke import cuda_environment
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    if not a.smoke and torch.cuda.device_count() < a.gpus:
        raise SystemExit(f"error: {torch.cuda.device_count()} CUDA devices < --gpus {a.gpus}")
    cfg = load_run_config(a.recipe, a.smoke_overrides)
    a.vocab_size = cfg.tokenize.vocab_size
    work = Path(tempfile.mkdtemp(prefix="packtrain-scaling-"))
    print(f"synthetic data → {work}", file=sys.stderr, flush=True)
    make_synthetic_inputs(work / "data", n_docs=a.docs, vocab_size=a.vocab_size, budget=cfg.pack.budget)
    record = Record(suite="scaling", study=f"data-parallel scaling, 1 vs {a.gpus} GPUs", command=a.command,
                    machine=machine_info(), goals={"scaling_efficiency_min": EFFICIENCY_TARGET,
                                                   "loss_max_rel_diff": LOSS_REL_TOL, "memory_error_max": 0.10},
                    settings={"recipe": a.recipe, "gpus": a.gpus, "configs": names, "steps": a.steps,
                              "warmup": a.warmup, "rows": a.rows, "global_accum": a.global_accum, "docs": a.docs},
                    extra={"recipe": a.recipe, "gpus": a.gpus, "environment": cuda_environment(),
                           "global_batch_tokens": a.rows * cfg.pack.budget * a.global_accum, "configs": {}})
    failed = False
    for name in names:
        entry: dict = {}
        for g in sorted({1, a.gpus}):
            print(f"→ {name} on {g} GPU", file=sys.stderr, flush=True)
            row = run_one(name, g, a, work / "data", work)
            if g == 1 and "error" not in row:
                row["real_tokens_per_s"] = row["real_tokens_per_s_per_gpu"]
            entry["1gpu" if g == 1 else f"{g}gpu"] = row
            record.rows.append({"config_gpus": f"{name}-{g}gpu", **{k: v for k, v in row.items()
                                                                    if k not in ("loss_curve", "stderr_tail")}})
            failed |= "error" in row
            print(json.dumps({k: v for k, v in row.items() if k not in ("loss_curve", "overrides", "command")}),
                  file=sys.stderr, flush=True)
        one, many = entry.get("1gpu", {}), entry.get(f"{a.gpus}gpu", {})
        if "error" not in one and "error" not in many and one and many:
            entry["comparison"] = compare(one, many)
        record.extra["configs"][name] = entry
    cmps = [e["comparison"] for e in record.extra["configs"].values() if "comparison" in e]
    record.goal_met = {"runs": not failed, "efficiency": bool(cmps) and all(c["efficiency_ok"] for c in cmps),
                       "loss": bool(cmps) and all(c["loss_ok"] for c in cmps),
                       "memory": bool(cmps) and all(c["memory_ok"] for c in cmps)}
    print_table(record.extra, a.gpus)
    return record


def print_table(report: dict, gpus: int) -> None:
    print(f"| config | tok/s 1 GPU | tok/s/GPU at {gpus} | efficiency | peak GiB 1→{gpus} (planned) "
          "| max loss rel diff |")
    print("|---|---|---|---|---|---|")
    for name, e in report["configs"].items():
        c = e.get("comparison")
        if not c:
            print(f"| {name} | failed: {e.get('1gpu', {}).get('error')} / {e.get(f'{gpus}gpu', {}).get('error')} |")
            continue
        eff, rel = c["scaling_efficiency"], c["loss_max_rel_diff"]
        print(f"| {name} | {e['1gpu']['real_tokens_per_s']:,.0f} | {e[f'{gpus}gpu']['real_tokens_per_s_per_gpu']:,.0f}"
              f" | {'n/a' if eff is None else f'{eff:.3f}'}"
              f" | {c['memory_measured_gib'][0]:.1f}→{c['memory_measured_gib'][1]:.1f}"
              f" ({c['memory_predicted_gib'][0]:.1f}→{c['memory_predicted_gib'][1]:.1f})"
              f" | {'n/a' if rel is None else f'{rel:.2e}'} |")
