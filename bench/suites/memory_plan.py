"""Calibrate the memory planner on a GPU: predicted vs measured `torch.cuda.max_memory_allocated`.

    python -m bench memory-plan --out bench/results/memory_plan_calibration.json [--only NAME,...]
                                [--steps 3] [--max-seconds 220] [--child-timeout 150] [--dry-run]
    python -m bench memory-plan --smoke --out /tmp/mp    # CPU: every prediction + one tiny row measured eagerly

For each configuration (125M / 350M / 1B Llama, vocab 32768, bf16 autocast over fp32 params, AdamW fused,
grad clip 1.0, transformers SDPA on packed rows with restarting position_ids, HF loss via labels):
builds the model on CUDA, makes synthetic packed batches (lognormal documents, several per row), resets the
peak counter, runs `--steps` train steps and records

    {config, size, engine, zero_stage, offload, checkpointing, rows, budget, tokens,
     predicted_gib, measured_gib, error, within_10pct, reserved_gib, plan_phase, seconds, status, message}

`error` = predicted / measured − 1. ZeRO rows go through the train room's DeepSpeed path
(packtrain.train.deepspeed_engine + packtrain.train.loss) in a child process each, when deepspeed is
importable; otherwise they are recorded as skipped. One configuration failing (OOM, exception, timeout)
never stops the others; the JSON is rewritten (atomically) after every row. Needs torch + transformers
(+ optional deepspeed); not mlflow or kfp. Budget: < 4 min on an H200.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import GIB, Record, machine_info

SUMMARY = "memory planner calibration: predicted vs measured max_memory_allocated, 9 configurations"
DEVICE = "gpu"
REPO = Path(__file__).resolve().parents[2]
GOALS = {"max_abs_error": 0.10}

VOCAB = 32768
SIZES = {   # hidden, intermediate, layers, heads
    "tiny": (64, 176, 2, 4),   # --smoke
    "125m": (768, 2048, 12, 12),
    "350m": (1024, 2816, 24, 16),
    "1b": (2048, 5632, 16, 16),
}
# name: size, engine, zero stage, offload, checkpointing, rows, budget
CONFIGS = [
    ("125m-none-8x2048", "125m", "torch", None, False, "none", 8, 2048),
    ("125m-full-8x4096", "125m", "torch", None, False, "full", 8, 4096),
    ("350m-none-8x1024", "350m", "torch", None, False, "none", 8, 1024),
    ("350m-none-8x2048", "350m", "torch", None, False, "none", 8, 2048),
    ("350m-full-8x4096", "350m", "torch", None, False, "full", 8, 4096),
    ("1b-none-8x2048", "1b", "torch", None, False, "none", 8, 2048),
    ("1b-full-8x4096", "1b", "torch", None, False, "full", 8, 4096),
    ("350m-zero2-4x2048", "350m", "deepspeed", 2, False, "none", 4, 2048),
    ("1b-zero3-offload-4x2048", "1b", "deepspeed", 3, True, "full", 4, 2048),
]
SMOKE_CONFIG = ("tiny-none-2x128", "tiny", "torch", None, False, "none", 2, 128)


def configs_for(name: str, size: str, engine: str, zero, offload: bool, ckpt: str, rows: int, budget: int):
    """(ModelConfig, TrainConfig, PlanConfig) of one row, as the planner sees it. Without pydantic on the GPU
    box (packtrain.config needs it; the planner itself does not) plain namespaces with the same fields."""
    h, i, layers, heads = SIZES[size]
    model = dict(pretrained_dir=None, hidden_size=h, intermediate_size=i, num_layers=layers, num_heads=heads,
                 num_kv_heads=None, max_position_embeddings=max(4096, budget), tie_word_embeddings=True)
    ds = dict(zero_stage=zero if zero is not None else 2, offload_optimizer=offload,
              offload_params=offload and zero == 3, overlap_comm=True, contiguous_gradients=True)
    train = dict(engine=engine, device="cuda", attention="sdpa", precision="bf16", activation_checkpointing=ckpt,
                 ac_every_k=2, rows=rows, grad_accum=1, fused_optimizer=True, loss="standard",
                 loss_chunk_tokens=2048, grad_clip=1.0, gpus=1)
    try:
        from packtrain.config import DeepSpeedOptions, ModelConfig, PlanConfig, TrainConfig
    except ImportError:
        from types import SimpleNamespace as NS

        plan = NS(device_memory_gib=None, target_fraction=0.85, allocator_overhead=0.05,
                  cuda_context_gib=0.5, vocab_size=VOCAB, global_batch_tokens=None, max_rows=64)
        return NS(**model), NS(**train, deepspeed=NS(**ds)), plan
    return (ModelConfig(**model), TrainConfig(**train, deepspeed=DeepSpeedOptions(**ds)), PlanConfig())


def packed_batch(rows: int, budget: int, seed: int, device):
    """input_ids, position_ids, labels (rows, budget): lognormal documents (median 600, σ 1) laid end to end,
    position ids restarting per document, -100 at each document's first token."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, size=(rows, budget))
    pos = np.zeros((rows, budget), np.int64)
    labels = ids.copy()
    for r in range(rows):
        t = 0
        while t < budget:
            n = int(min(budget - t, max(2, round(np.exp(rng.normal(np.log(600), 1.0))))))
            pos[r, t:t + n] = np.arange(n)
            labels[r, t] = -100
            t += n
    to = lambda a: torch.as_tensor(a, dtype=torch.long, device=device)  # noqa: E731
    return to(ids), to(pos), to(labels)


def llama(size: str, budget: int, device, dtype=None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    h, i, layers, heads = SIZES[size]
    lc = LlamaConfig(vocab_size=VOCAB, hidden_size=h, intermediate_size=i, num_hidden_layers=layers,
                     num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max(4096, budget),
                     tie_word_embeddings=True, use_cache=False, attn_implementation="sdpa")
    with torch.device(device):
        model = LlamaForCausalLM(lc)
    return model.to(dtype) if dtype is not None else model


def enable_checkpointing(model) -> None:
    """Every decoder layer's forward under torch.utils.checkpoint(use_reentrant=False), as
    packtrain.train.techniques.apply_activation_checkpointing does (independent of the transformers version)."""
    from torch.utils.checkpoint import checkpoint

    for layer in model.model.layers:
        def forward(*args, _inner=layer.forward, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        layer.forward = forward


def measure_torch(row, steps: int) -> dict:
    """Plain torch: fp32 params, bf16 autocast, fused AdamW; peak over `steps` steps after setup (on the CPU,
    --smoke: the same steps, no peak)."""
    import torch

    name, size, _, _, _, ckpt, rows, budget = row
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev.type == "cuda"
    model = llama(size, budget, dev).train()
    if ckpt != "none":
        enable_checkpointing(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    batches = [packed_batch(rows, budget, s, dev) for s in range(steps)]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    try:
        for ids, pos, labels in batches:
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = model(input_ids=ids, position_ids=pos, labels=labels, use_cache=False).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if not cuda:
            return {"measured_gib": None, "reserved_gib": None, "loss": float(loss)}
        torch.cuda.synchronize()
        return {"measured_gib": torch.cuda.max_memory_allocated() / GIB,
                "reserved_gib": torch.cuda.max_memory_reserved() / GIB, "loss": float(loss)}
    finally:
        del model, opt, batches
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def measure_deepspeed(row, steps: int) -> dict:
    """The train room's DeepSpeed path: PackedCausalLM (loss sum) + DeepSpeedStepper, one process per row."""
    import torch

    from packtrain.train.deepspeed_engine import DeepSpeedStepper
    from packtrain.train.loss import packed_causal_lm

    name, size, _, zero, offload, ckpt, rows, budget = row
    model_cfg, train_cfg, _ = configs_for(*row)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    lm = llama(size, budget, dev).train()
    if ckpt != "none":
        enable_checkpointing(lm)
    module = packed_causal_lm(lm, "standard")
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=not offload)
    stepper = DeepSpeedStepper(module, opt, train_cfg, dev, world_size=1, rows=rows, grad_accum=1)
    batches = [packed_batch(rows, budget, s, dev) for s in range(steps)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for ids, pos, labels in batches:
        loss = stepper.module(labels=labels, input_ids=ids, position_ids=pos, use_cache=False)
        stepper.backward(loss, last=True)
        stepper.step()
    torch.cuda.synchronize()
    return {"measured_gib": torch.cuda.max_memory_allocated() / GIB,
            "reserved_gib": torch.cuda.max_memory_reserved() / GIB, "loss": float(loss)}


def predict(row, device_gib: float) -> dict:
    from packtrain.planner import plan_memory

    model, train, plan_cfg = configs_for(*row)
    plan = plan_memory(model, train, row[7], plan_cfg, device_memory_gib=device_gib, vocab_size=VOCAB,
                       suggest=False)
    return {"predicted_gib": plan.peak_allocated_gib, "plan_phase": plan.peak_phase,
            "plan_components_gib": {k: round(v / GIB, 3) for k, v in plan.components.items() if v}}


def base_record(row) -> dict:
    name, size, engine, zero, offload, ckpt, rows, budget = row
    return {"config": name, "size": size, "engine": engine, "zero_stage": zero, "offload": offload,
            "checkpointing": ckpt, "rows": rows, "budget": budget, "tokens": rows * budget}


def run_child(row, steps: int, timeout: float) -> dict:
    """A DeepSpeed row in its own process (DeepSpeed's global state, a fresh allocator, a crash-proof parent)."""
    cmd = [sys.executable, "-m", "bench.suites.memory_plan", "--child", json.dumps(row), "--steps", str(steps)]
    try:   # from the repository root, where `bench` is
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "message": f"no result within {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{") and '"measured_gib"' in line:
            return {"status": "ok", **json.loads(line)}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"status": "oom" if "OutOfMemory" in proc.stderr else "error", "message": " | ".join(tail)[-600:]}


def child_main(argv: list[str] | None = None) -> int:
    """One DeepSpeed row in this process; prints one JSON line."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", required=True)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args(argv)
    print(json.dumps(measure_deepspeed(tuple(json.loads(a.child)), a.steps)), flush=True)
    return 0


def add_arguments(ap) -> None:
    ap.add_argument("--only", help="comma-separated config names")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=220.0, help="skip the remaining rows after this")
    ap.add_argument("--child-timeout", type=float, default=150.0)
    ap.add_argument("--dry-run", action="store_true", help="predictions only (no GPU needed)")


def _record(args, doc: dict) -> Record:
    ok = [r for r in doc["rows"] if r.get("status") == "ok" and "error" in r]
    return Record(suite="memory-plan", study="memory planner vs max_memory_allocated", command=args.command,
                  machine=machine_info(), rows=doc["rows"], goals=GOALS,
                  goal_met={"within_10pct": all(abs(r["error"]) <= GOALS["max_abs_error"] for r in ok)} if ok else {},
                  settings={"steps": args.steps, "only": args.only, "dry_run": args.dry_run},
                  extra={k: v for k, v in doc.items() if k != "rows"})


def run(args, out: Path) -> Record:
    if args.dry_run or args.smoke:
        rows = [{**base_record(r), **predict(r, 141.0)} for r in CONFIGS if not args.only or r[0] in args.only]
        for r in rows:
            print(f"{r['config']:<26} predicted {r['predicted_gib']:.2f} GiB at {r['plan_phase']}")
        if args.smoke:   # the measuring path once, eagerly on the CPU (no peak there)
            rows.append({**base_record(SMOKE_CONFIG), **predict(SMOKE_CONFIG, 141.0), "status": "ok",
                         **measure_torch(SMOKE_CONFIG, 1)})
        return _record(args, {"device": "planned for 141 GiB (dry run)", "rows": rows})
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("error: needs a CUDA device (or --dry-run, --smoke)")
    props = torch.cuda.get_device_properties(0)
    device_gib = props.total_memory / GIB
    import importlib.util

    has_ds = importlib.util.find_spec("deepspeed") is not None
    import transformers

    from packtrain.publish import write_json

    wanted = set(args.only.split(",")) if args.only else None
    doc = {"device": props.name, "device_memory_gib": round(device_gib, 2), "torch": torch.__version__,
           "transformers": transformers.__version__, "steps": args.steps,
           "measure": "torch.cuda.max_memory_allocated after setup, over the steps", "rows": []}
    start = time.time()
    for row in CONFIGS:
        if wanted and row[0] not in wanted:
            continue
        rec = base_record(row)
        try:
            rec.update(predict(row, device_gib))
        except Exception as e:  # noqa: BLE001 - a planner failure is recorded, the measurement still runs
            rec.update(predicted_gib=None, plan_error=f"{type(e).__name__}: {e}")
        t0 = time.time()
        if t0 - start > args.max_seconds:
            rec.update(status="skipped", message=f"time budget of {args.max_seconds:.0f} s spent")
        elif row[2] == "deepspeed" and not has_ds:
            rec.update(status="skipped", message="deepspeed is not importable")
        elif row[2] == "deepspeed":
            rec.update(run_child(row, args.steps, min(args.child_timeout, max(30.0, args.max_seconds - (t0 - start)))))
        else:
            try:
                rec.update(status="ok", **measure_torch(row, args.steps))
            except torch.cuda.OutOfMemoryError as e:
                rec.update(status="oom", message=str(e).splitlines()[0][:300])
            except Exception as e:  # noqa: BLE001 - one config must not stop the others
                rec.update(status="error", message=f"{type(e).__name__}: {e}"[:600])
            finally:
                gc.collect()
                torch.cuda.empty_cache()
        rec["seconds"] = round(time.time() - t0, 1)
        if rec.get("measured_gib") and rec.get("predicted_gib"):
            rec["error"] = round(rec["predicted_gib"] / rec["measured_gib"] - 1, 4)
            rec["within_10pct"] = abs(rec["error"]) <= 0.10
            rec["measured_gib"], rec["predicted_gib"] = round(rec["measured_gib"], 3), round(rec["predicted_gib"], 3)
        doc["rows"].append(rec)
        write_json(args.record_path.with_suffix(".partial.json"), doc)
        print(f"{rec['config']:<26} {rec.get('status'):<8} predicted {rec.get('predicted_gib')} GiB  measured "
              f"{rec.get('measured_gib')} GiB  error {rec.get('error')}  ({rec['seconds']} s)", flush=True)
    ok = [r for r in doc["rows"] if r.get("status") == "ok"]
    doc["summary"] = {"measured": len(ok), "within_10pct": sum(bool(r.get("within_10pct")) for r in ok),
                      "max_abs_error": max((abs(r["error"]) for r in ok if "error" in r), default=None),
                      "seconds": round(time.time() - start, 1)}
    args.record_path.with_suffix(".partial.json").unlink(missing_ok=True)
    print(json.dumps(doc["summary"]))
    return _record(args, doc)


if __name__ == "__main__":
    sys.exit(child_main())
