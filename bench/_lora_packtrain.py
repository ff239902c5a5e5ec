"""The packtrain variant of the LoRA bench (bench/lora_bench.py): the product's own path end to end.

    packtrain_overrides(spec, args, device)   → the recipe overrides (the shape, LoRA, the memory techniques)
    run_packtrain(spec, docs, args, device)   → the variant's row: real_tok_per_s, useful_mfu, the training
                                                steps' peaks, the planner's predicted peak and its error, ...

token store → pack_dataset → train() with train.adapter (packtrain.train.smoke.smoke_run), recipes/350m-h200.yaml
loaded by path with the overrides.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import numpy as np
from _lora_shape import flops_per_real_token


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
    """packtrain's own path end to end: token store → pack_dataset → train() with train.adapter (smoke_run)."""
    import torch

    from packtrain.config import load_run_config
    from packtrain.data.token_store import write_token_store
    from packtrain.packing.dataset import pack_dataset
    from packtrain.packing.store import PackStore
    from packtrain.train.smoke import smoke_run
    from packtrain.train.synthetic import write_tokenizer

    vocab = spec["vocab_size"]
    # by path: on the GPU machine packtrain runs from src/ (PYTHONPATH), where packtrain.recipes is not a package
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "350m-h200.yaml"
    cfg = load_run_config(recipe, packtrain_overrides(spec, args, device))
    predicted = _planner_peak(cfg, args, vocab, device)
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        tmp = Path(tmp)
        write_tokenizer(tmp / "tok", vocab)
        n = len(docs)
        write_token_store(tmp / "tokenize", docs, np.arange(n), np.zeros(n, np.uint8),
                          {"vocab_size": vocab, "eos_id": 1, "pad_id": 0}, tokenizer_dir=tmp / "tok")
        stats = pack_dataset(tmp / "tokenize", tmp / "pack", cfg.pack)
        seq_lens = _pack_seq_lens(PackStore.open(tmp / "pack" / "train", verify=False))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        with _step_peaks(device) as peaks:
            r = smoke_run(cfg, tmp / "tokenize", tmp / "pack", tmp / "out", cfg.train.attention,
                          args.steps + args.warmup, compile=not args.no_compile, warmup_steps=args.warmup)
    print(json.dumps({"packtrain_smoke_run": r}), flush=True)
    useful, hw = flops_per_real_token(spec, args.r, seq_lens)
    tok_s = r["real_tokens_per_s"]
    row = {"real_tok_per_s": tok_s, "step_time_p50_s": r["step_time_p50_s"],
           "useful_mfu": tok_s * useful / (args.peak_tflops * 1e12) if tok_s else None,
           "mfu_with_recompute": tok_s * hw / (args.peak_tflops * 1e12) if tok_s else None,
           # the training steps' peak (like the baseline's: reset after the model is built); the run's own
           # (incl. building the model) is the meter's
           "peak_alloc_gib": peaks["alloc"], "peak_reserved_gib": peaks["reserved"],
           "setup_peak_alloc_gib": peaks["setup_alloc"], "run_peak_alloc_gib": r.get("peak_alloc_gib"),
           "first_loss": r["first_loss"], "last_loss": r["final_loss"], "fill": stats.train.fill,
           "rows": r["rows"], "budget": r["budget"], "recompiles": r["recompiles"], "compiles": r["compiles"],
           "nvml_util": r.get("nvml_util") if r.get("system_kind") == "nvml" else None,
           "meter_useful_mfu": r.get("useful_mfu"), "setup_s": r.get("setup_s"), "wall_s": r.get("wall_s"),
           "attention": r["attention"], "activation_checkpointing": args.ac, "compile": r["compile"],
           "loss": args.loss, "overrides": packtrain_overrides(spec, args, device), **predicted}
    if predicted.get("planner_peak_alloc_gib") and row["peak_alloc_gib"]:
        row["planner_error"] = predicted["planner_peak_alloc_gib"] / row["peak_alloc_gib"] - 1
    return row


@contextlib.contextmanager
def _step_peaks(device):
    """Peak memory over the training steps only: `packtrain.train.loop.run_step` wrapped to reset the CUDA peak
    before the first step (after the model, adapter, compile wrappers and optimizer are built) and to read it
    after every step. Yields {"alloc", "reserved", "setup_alloc"} in GiB, filled as the run goes."""
    import torch

    from packtrain.train import loop

    peaks = {"alloc": 0.0, "reserved": 0.0, "setup_alloc": 0.0}
    inner = loop.run_step

    def run_step(*a, **kw):
        cuda = device.type == "cuda"
        if cuda and not peaks["setup_alloc"]:
            peaks["setup_alloc"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        out = inner(*a, **kw)
        if cuda:
            peaks["alloc"] = max(peaks["alloc"], torch.cuda.max_memory_allocated() / 2**30)
            peaks["reserved"] = max(peaks["reserved"], torch.cuda.max_memory_reserved() / 2**30)
        return out

    loop.run_step = run_step
    try:
        yield peaks
    finally:
        loop.run_step = inner


def _planner_peak(cfg, args, vocab: int, device) -> dict:
    """The memory planner's predicted peak for the run's shape (planner.choose_shape + plan_shape)."""
    try:
        from packtrain.planner.micro_batch import choose_shape, plan_shape

        shape = choose_shape(cfg.model, cfg.train, args.budget, cfg.plan, vocab, device=device)
        plan = plan_shape(cfg.model, cfg.train, shape, cfg.plan, vocab, device=device)
        return {"planner_rows": shape.rows, "planner_peak_alloc_gib": plan.peak_allocated_gib,
                "planner_peak_gib": plan.peak_gib, "planner_peak_phase": plan.peak_phase,
                "planner_components_gib": {k: v / 2**30 for k, v in plan.components.items() if v}}
    except Exception as e:  # noqa: BLE001 - a planner failure is recorded, the run still measures
        return {"planner_error_message": f"{type(e).__name__}: {e}"}


def _pack_seq_lens(store) -> list[int]:
    """Every document segment length of a pack store (for Σ s² / Σ s of the useful-FLOPs count)."""
    return [int(n) for n in store.segments[:, 2]]

