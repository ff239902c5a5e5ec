"""LoRA on an 8B-class model, one H200: packtrain against transformers + peft, side by side in one process.

    python -m bench lora --steps 10 --warmup 4 --out bench/results      # H200, ~4-6 min
    python -m bench lora --smoke --out /tmp/lora                        # CPU, tiny shape, seconds

Both variants train the same random-init Llama-3-8B shape (hidden 4096, 32 layers, 32 heads, 8 KV heads,
intermediate 14336, vocabulary 128,256, untied head, RoPE base 5e5) with LoRA r=16, alpha=32 on every linear
layer of the decoder (q/k/v/o, gate/up/down; not the LM head), on the same lognormal documents (median 300,
σ=1, clipped to [16, budget]) packed best-fit-decreasing into rows of `budget` tokens:

  transformers+peft  bf16 weights, peft.get_peft_model, gradient checkpointing (non-reentrant), SDPA on
                     (rows, budget) packed rows with position_ids restarting per document, use_cache=False,
                     bf16 autocast, fused AdamW over the adapter — the anchor path (5,894 real tok/s
                     at 43.3 GiB peak, measured earlier on an H200).
  packtrain          the product's `train()` (packtrain.testing.gpu_smoke.smoke_run): the same documents written as a
                     token store and packed by the pack stage's library, `train.adapter` LoRA (apply_adapter),
                     varlen attention on the flattened (1, rows·budget) micro-batch, fused/chunked loss, full
                     activation checkpointing, per-layer torch.compile, bf16.

Reported per variant (a row each in OUT/lora.json, and one JSON file each as before, "lora": true): real tok/s (median of the per-step rates over the
steps after --warmup), step time p50, useful MFU, peak allocated/reserved memory (torch.cuda.max_memory_*
over the training steps), loss of the first/last steps; for packtrain also the memory planner's predicted
peak and its error against the measured one (target ±10%) and the speed-up over the baseline.

Useful FLOPs of LoRA per real token: bench/lora_flops.py (the frozen base has no weight gradients).

Activation checkpointing recomputes the decoder's forward (+2·N and 4·L·w·Σ s² more): that is work, not useful
work, so it is reported separately as `mfu_with_recompute`. Peak for MFU: 790 TFLOP/s bf16 (measured on the
H200, DESIGN.md). A failing variant (an OOM) is recorded with its error and does not lose the other.

Where it lives: this module (the shapes, the run), bench/lora_flops.py (the parameter and FLOP counts) and
bench/lora_variants.py (the transformers+peft variant and packtrain's).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import traceback
from pathlib import Path

from bench.harness import Record, cuda_peaks_gib, machine_info
from bench.lora_flops import LORA_TARGETS, adapter_params

SUMMARY = "LoRA on a Llama-3-8B shape: packtrain against transformers + peft with gradient checkpointing"
DEVICE = "gpu"
SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128_256, rope_theta=500_000.0, tie_word_embeddings=False,
                      max_position_embeddings=8192),
    # --smoke: the same structure (GQA, untied head), small enough for a CPU in seconds
    "smoke": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, rope_theta=500_000.0, tie_word_embeddings=False,
                  max_position_embeddings=1024),
}


ANCHOR = {"variant": "transformers+peft", "real_tok_per_s": 5894, "peak_gib": 43.3,
          "source": "the anchor measured earlier on the H200 (r=16 all linear, gradient checkpointing, packed rows "
                    "8×2048, bf16)"}
GOAL = {"speedup_vs_baseline": 1.5, "peak_gib_max": 40.0, "planner_error_max": 0.10}
FILES = {"transformers+peft": "lora_bench_transformers_peft.json", "packtrain": "lora_bench_packtrain.json"}


def make_documents(n_docs: int, budget: int, vocab: int, seed: int) -> list:
    """Lognormal lengths (median 300, σ=1: the anchors' distribution) of Markov-chain tokens (the loss falls)."""
    import numpy as np

    from packtrain.testing.synthetic_inputs import markov_documents

    rng = np.random.default_rng(seed)
    lens = np.clip(np.exp(rng.normal(np.log(min(300, budget // 4)), 1.0, n_docs)).astype(np.int64), 16, budget)
    return markov_documents(lens, vocab, rng, eos_id=1)


def add_arguments(p) -> None:
    p.add_argument("--shape", choices=list(SHAPES), default="llama3-8b")
    p.add_argument("--variants", default="transformers+peft,packtrain",
                   help="comma-separated, run in this order (the baseline first: it leaves no compile caches)")
    p.add_argument("--steps", type=int, default=10, help="measured optimizer steps after the warm-up")
    p.add_argument("--warmup", type=int, default=4, help="steps before measuring (compile happens here)")
    p.add_argument("--rows", default="8", help="packs per micro-batch, or 'auto' (packtrain: the planner's choice)")
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32.0)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--attention", default="varlen", help="packtrain backend: varlen | flex | sdpa")
    p.add_argument("--loss", default="fused", help="packtrain loss: fused (Liger; chunked fallback) | chunked")
    p.add_argument("--ac", default="full",
                   help="packtrain activation checkpointing: full | every_k | count | selective | none")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--packtrain-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra recipe overrides for the packtrain variant")


def _settle(args) -> None:
    """--smoke: the tiny shape on the CPU (sdpa, chunked loss, no compile, 2 rows × 128, 2 + 1 steps)."""
    if args.smoke:
        args.shape, args.device, args.attention, args.loss, args.no_compile = "smoke", "cpu", "sdpa", "chunked", True
        args.budget = 128
        args.rows = "2" if args.rows == "8" else args.rows
        args.steps, args.warmup = min(args.steps, 2), min(args.warmup, 1)
    if args.rows != "auto":
        args.rows = int(args.rows)


def run(args, out: Path) -> Record:
    import torch

    from bench.lora_variants import run_packtrain, run_transformers_peft

    runners = {"transformers+peft": run_transformers_peft, "packtrain": run_packtrain}
    _settle(args)
    device = torch.device(args.device)
    spec = SHAPES[args.shape]
    rows_for_data = args.rows if isinstance(args.rows, int) else 16
    n_docs = max(400, (args.steps + args.warmup) * rows_for_data * (args.budget // 150 + 2))
    docs = make_documents(n_docs, args.budget, spec["vocab_size"], args.seed)
    machine = machine_info(args.peak_tflops)
    rows_out = []
    for name in [v.strip() for v in args.variants.split(",") if v.strip()]:
        if name not in runners:
            raise SystemExit(f"--variants: {name!r} is not one of {', '.join(runners)}")
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        base = {"lora": True, "variant": name, "model": args.shape, "shape": spec,
                "adapter": {"type": "lora", "r": args.r, "alpha": args.alpha, "dropout": args.dropout,
                            "target_modules": LORA_TARGETS, "params": adapter_params(spec, args.r)},
                "steps": args.steps, "warmup": args.warmup,
                "rows": args.rows if name == "packtrain" or isinstance(args.rows, int) else 8,
                "budget": args.budget, "precision": "bf16", "command": args.command, "machine": machine,
                "anchor": ANCHOR, "goal": GOAL}
        try:   # the baseline has no planner: --rows auto is packtrain's, the baseline uses 8 rows
            variant_args = args if isinstance(args.rows, int) else argparse.Namespace(**{**vars(args), "rows": 8})
            row = {**base, **runners[name](spec, docs, variant_args if name != "packtrain" else args, device)}
        except Exception as e:  # noqa: BLE001 - one variant failing (an OOM) must not lose the other
            traceback.print_exc()
            alloc, reserved = cuda_peaks_gib()
            row = {**base, "error": f"{type(e).__name__}: {str(e)[:600]}",
                   "oom": isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()
                   or type(e).__name__ == "TrainOutOfMemory",
                   "peak_alloc_gib": alloc or 0.0, "peak_reserved_gib": reserved or 0.0}
        row["variant_wall_s"] = time.perf_counter() - t0
        rows_out.append(row)
        (out / FILES[name]).write_text(json.dumps(row, indent=2) + "\n")   # now: a later timeout keeps it
        print(json.dumps({k: v for k, v in row.items() if k not in ("loss_curve", "shape", "machine")}), flush=True)
    goal_met = _compare(rows_out)
    for row in rows_out:
        (out / FILES[row["variant"]]).write_text(json.dumps(row, indent=2) + "\n")
    _print_table(rows_out)
    slim = [{k: v for k, v in r.items() if k not in ("machine", "command", "anchor", "goal")} for r in rows_out]
    return Record(suite="lora", study="LoRA on a Llama-3-8B shape, packtrain vs transformers + peft",
                  command=args.command, machine=machine, rows=slim, goals=GOAL, goal_met=goal_met,
                  settings={k: getattr(args, k) for k in ("shape", "variants", "steps", "warmup", "rows", "budget",
                                                           "r", "alpha", "dropout", "lr", "attention", "loss", "ac",
                                                           "no_compile", "seed", "device", "packtrain_set")},
                  extra={"anchor": ANCHOR, "files": [FILES[r["variant"]] for r in rows_out]})


def _compare(rows: list[dict]) -> dict:
    """packtrain's speed-up over the baseline measured in the same run (and over the anchor); the goals met."""
    by = {r["variant"]: r for r in rows}
    ours, base = by.get("packtrain", {}), by.get("transformers+peft", {})
    if not ours.get("real_tok_per_s"):
        return {}
    ours["speedup_vs_anchor"] = ours["real_tok_per_s"] / ANCHOR["real_tok_per_s"]
    if base.get("real_tok_per_s"):
        ours["speedup_vs_baseline"] = ours["real_tok_per_s"] / base["real_tok_per_s"]
    ours["goal_met"] = {
        "speedup": ours.get("speedup_vs_baseline", 0) >= GOAL["speedup_vs_baseline"],
        "peak": (ours.get("peak_alloc_gib") or 0) <= GOAL["peak_gib_max"],
        "planner": abs(ours.get("planner_error", 1.0)) <= GOAL["planner_error_max"]}
    return ours["goal_met"]


def _print_table(rows: list[dict]) -> None:
    from bench.workload import print_rows

    def cells(name: str, r: dict) -> str:
        pl, sp = r.get("planner_peak_alloc_gib"), r.get("speedup_vs_baseline")
        return (f"{r['real_tok_per_s']:>10,.0f} {r['useful_mfu'] or 0:>10.3f} {r['peak_alloc_gib']:>9.1f} "
                f"{r['peak_reserved_gib']:>8.1f} {'-' if pl is None else f'{pl:.1f}':>11} "
                f"{r['first_loss']:>7.3f} → {r['last_loss']:<6.3f} {'-' if sp is None else f'{sp:.2f}×':>8}")

    print_rows(rows, None, f"{'variant':<18} {'real tok/s':>10} {'useful MFU':>10} {'alloc GiB':>9} {'resv GiB':>8} "
               f"{'planner GiB':>11} {'loss first→last':>16} {'speed-up':>8}", 18, cells)
    print(f"anchor: transformers+peft {ANCHOR['real_tok_per_s']:,} tok/s at {ANCHOR['peak_gib']} GiB")
