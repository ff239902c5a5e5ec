"""The transformers + peft variant of the LoRA bench (bench/lora_bench.py): the issue's anchor path.

    packed_rows(docs, rows, budget, n_steps)      BFD packs as (rows, budget) rows, position_ids restarting
    run_transformers_peft(spec, docs, args, dev)  → the variant's row: real_tok_per_s, useful_mfu, peaks, losses, ...

bf16 weights, peft.get_peft_model (r, alpha, dropout from args) on every decoder linear, gradient checkpointing
(non-reentrant), SDPA, bf16 autocast, fused AdamW over the adapter.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from _lora_shape import LORA_TARGETS, flops_per_real_token, peaks_gib


def packed_rows(docs: list[np.ndarray], rows: int, budget: int, n_steps: int) -> list[dict]:
    """The baseline's batches: BFD packs (packtrain.packing.plan) as (rows, budget) rows, position_ids restart."""
    from hf_baselines import batches_packed_rows

    from packtrain.packing.plan import pack_lengths

    plan = pack_lengths(np.array([len(d) for d in docs]), budget, strategy="bfd")
    packs = [[seg[0] for seg in pack] for pack in plan.to_lists()]
    packs = [packs[i] for i in np.random.default_rng(0).permutation(len(packs))]
    if len(packs) < rows * n_steps:
        raise SystemExit(f"only {len(packs)} packs for {rows} rows × {n_steps} steps: raise the document count")
    return batches_packed_rows(docs, packs, rows, budget, n_steps)


def run_transformers_peft(spec: dict, docs, args, device) -> dict:
    """The issue's anchor path: transformers + peft on packed rows, gradient checkpointing, bf16 weights."""
    import torch
    from hf_baselines import hf_config
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    n_steps = args.warmup + args.steps
    batches = packed_rows(docs, args.rows, args.budget, n_steps)
    torch.manual_seed(args.seed)
    cfg = hf_config(spec, spec["vocab_size"], "sdpa", spec["max_position_embeddings"])
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lcfg = LoraConfig(r=args.r, lora_alpha=args.alpha, lora_dropout=args.dropout, target_modules=LORA_TARGETS,
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lcfg)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    opt = torch.optim.AdamW(trainable, lr=args.lr, fused=device.type == "cuda")
    model.train()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for b in batches:
        t0 = time.perf_counter()
        kw = {k: b[k].to(device, non_blocking=True) for k in ("input_ids", "labels", "position_ids")}
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(**kw, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))   # syncs: the step is done
        sync()
        times.append(time.perf_counter() - t0)
    steady = list(zip(batches, times, strict=True))[args.warmup:]
    rates = [b["real"] / dt for b, dt in steady]
    seq_lens = [s for b, _ in steady for s in b["seq_lens"]]
    useful, hw = flops_per_real_token(spec, args.r, seq_lens)
    tok_s = statistics.median(rates)
    alloc, reserved = peaks_gib(device)
    del model, opt, trainable
    return {"real_tok_per_s": tok_s, "step_time_p50_s": statistics.median(dt for _, dt in steady),
            "useful_mfu": tok_s * useful / (args.peak_tflops * 1e12),
            "mfu_with_recompute": tok_s * hw / (args.peak_tflops * 1e12),
            "peak_alloc_gib": alloc, "peak_reserved_gib": reserved,
            "first_loss": losses[0], "last_loss": losses[-1], "loss_curve": losses,
            "trainable_params": n_trainable, "fill": sum(b["real"] for b, _ in steady) / sum(b["slot"] for b, _ in steady),
            "attention": "sdpa (packed rows, position_ids)", "activation_checkpointing": "gradient_checkpointing",
            "compile": False, "loss": "transformers (full logits)"}

