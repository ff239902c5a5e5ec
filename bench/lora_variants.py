"""The two variants of the lora suite (bench/suites/lora.py), each returning its row of numbers.

    run_transformers_peft(spec, docs, args, device)   the anchor path: transformers + peft on BFD packed rows
                                                      (position_ids restarting), gradient checkpointing, bf16
                                                      weights, SDPA, bf16 autocast, fused AdamW over the adapter
    run_packtrain(spec, docs, args, device)           the product's own path end to end: token store →
                                                      pack_dataset → train() with train.adapter (smoke_run)

Both report real tok/s, useful MFU (bench/lora_flops.py), the training steps' peak memory and losses;
packtrain's also the memory planner's predicted peak and its error.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.harness import cuda_peaks_gib


def packed_rows(docs: list, rows: int, budget: int, n_steps: int) -> list[dict]:
    """The baseline's batches: BFD packs (packtrain.packing.bins) as (rows, budget) rows, position_ids restart."""
    import numpy as np

    from bench.transformers_baselines import batches_packed_rows
    from packtrain.packing.bins import pack_lengths

    plan = pack_lengths(np.array([len(d) for d in docs]), budget, strategy="bfd")
    packs = [[seg[0] for seg in pack] for pack in plan.to_lists()]
    packs = [packs[i] for i in np.random.default_rng(0).permutation(len(packs))]
    if len(packs) < rows * n_steps:
        raise SystemExit(f"only {len(packs)} packs for {rows} rows × {n_steps} steps: raise the document count")
    return batches_packed_rows(docs, packs, rows, budget, n_steps)


def run_transformers_peft(spec: dict, docs, args, device) -> dict:
    """transformers + peft on packed rows, gradient checkpointing, bf16 weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from bench.lora_flops import LORA_TARGETS, flops_per_real_token
    from bench.transformers_baselines import hf_config

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
    alloc, reserved = cuda_peaks_gib()
    del model, opt, trainable
    return {"real_tok_per_s": tok_s, "step_time_p50_s": statistics.median(dt for _, dt in steady),
            "useful_mfu": tok_s * useful / (args.peak_tflops * 1e12),
            "mfu_with_recompute": tok_s * hw / (args.peak_tflops * 1e12),
            "peak_alloc_gib": alloc or 0.0, "peak_reserved_gib": reserved or 0.0,
            "first_loss": losses[0], "last_loss": losses[-1], "loss_curve": losses,
            "trainable_params": n_trainable,
            "fill": sum(b["real"] for b, _ in steady) / sum(b["slot"] for b, _ in steady),
            "attention": "sdpa (packed rows, position_ids)", "activation_checkpointing": "gradient_checkpointing",
            "compile": False, "loss": "transformers (full logits)"}


def packtrain_overrides(spec: dict, args, device) -> list[str]:
    """The recipe overrides of packtrain's run: the 8B shape, LoRA, the memory techniques."""
    ov = [f"model.hidden_size={spec['hidden_size']}", f"model.intermediate_size={spec['intermediate_size']}",
          f"model.num_layers={spec['num_hidden_layers']}", f"model.num_heads={spec['num_attention_heads']}",
          f"model.num_kv_heads={spec['num_key_value_heads']}", f"model.rope_theta={spec['rope_theta']}",
          f"model.tie_word_embeddings={str(spec['tie_word_embeddings']).lower()}",
          f"model.max_position_embeddings={spec['max_position_embeddings']}",
          f"pack.budget={args.budget}", f"train.rows={args.rows}", f"train.attention={args.attention}",
          f"train.loss={args.loss}", "train.precision=bf16", f"train.compile={str(not args.no_compile).lower()}",
          f"train.activation_checkpointing={args.ac}", f"train.device={device.type}", f"train.lr={args.lr}",
          "train.adapter.type=lora", f"train.adapter.r={args.r}", f"train.adapter.alpha={args.alpha}",
          f"train.adapter.dropout={args.dropout}",
          f"telemetry.peak_tflops={args.peak_tflops}", "telemetry.interval_s=0.2"]
    return ov + list(args.packtrain_set)


def run_packtrain(spec: dict, docs, args, device) -> dict:
    """packtrain's own path end to end: token store → pack_dataset → train() with train.adapter (smoke_run);
    the training steps' peak is packtrain_runs.observe_train's (reset after the model, adapter, compile wrappers
    and optimizer are built, like the baseline's)."""
    import numpy as np

    from bench.lora_flops import flops_per_real_token
    from bench.packtrain_runs import observe_train, planner_prediction
    from bench.workload import load_recipe
    from packtrain.data.token_store import write_token_store
    from packtrain.packing.dataset import pack_dataset
    from packtrain.packing.store import PackStore
    from packtrain.testing.gpu_smoke import smoke_run
    from packtrain.testing.synthetic_inputs import write_tokenizer

    vocab = spec["vocab_size"]
    cfg = load_recipe("350m-h200", packtrain_overrides(spec, args, device))
    predicted = planner_prediction(cfg, args.budget, vocab, device.type)
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        tmp = Path(tmp)
        write_tokenizer(tmp / "tok", vocab)
        n = len(docs)
        write_token_store(tmp / "tokenize", docs, np.arange(n), np.zeros(n, np.uint8),
                          {"vocab_size": vocab, "eos_id": 1, "pad_id": 0}, tokenizer_dir=tmp / "tok")
        stats = pack_dataset(tmp / "tokenize", tmp / "pack", cfg.pack)
        seq_lens = [int(s) for s in PackStore.open(tmp / "pack" / "train", verify=False).segments[:, 2]]
        with observe_train() as obs:
            r = smoke_run(cfg, tmp / "tokenize", tmp / "pack", tmp / "out", cfg.train.attention,
                          args.steps + args.warmup, compile=not args.no_compile, warmup_steps=args.warmup)
    print(json.dumps({"packtrain_smoke_run": r}), flush=True)
    useful, hw = flops_per_real_token(spec, args.r, seq_lens)
    tok_s = r["real_tokens_per_s"]
    row = {"real_tok_per_s": tok_s, "step_time_p50_s": r["step_time_p50_s"],
           "useful_mfu": tok_s * useful / (args.peak_tflops * 1e12) if tok_s else None,
           "mfu_with_recompute": tok_s * hw / (args.peak_tflops * 1e12) if tok_s else None,
           # the training steps' peak (like the baseline's); the run's own (incl. building the model) is the meter's
           "peak_alloc_gib": obs["step_peak_alloc_gib"], "peak_reserved_gib": obs["step_peak_reserved_gib"],
           "setup_peak_alloc_gib": obs["setup_peak_alloc_gib"] or 0.0, "run_peak_alloc_gib": r.get("peak_alloc_gib"),
           "first_loss": r["first_loss"], "last_loss": r["final_loss"], "fill": stats.train.fill,
           "rows": r["rows"], "budget": r["budget"], "recompiles": r["recompiles"], "compiles": r["compiles"],
           "nvml_util": r.get("nvml_util") if r.get("system_kind") == "nvml" else None,
           "meter_useful_mfu": r.get("useful_mfu"), "setup_s": r.get("setup_s"), "wall_s": r.get("wall_s"),
           "attention": r["attention"], "activation_checkpointing": args.ac, "compile": r["compile"],
           "loss": args.loss, "overrides": packtrain_overrides(spec, args, device), **predicted}
    if predicted.get("planner_peak_alloc_gib") and row["peak_alloc_gib"]:
        row["planner_error"] = predicted["planner_peak_alloc_gib"] / row["peak_alloc_gib"] - 1
    return row
