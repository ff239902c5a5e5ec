"""GPU smoke checks shared by `python -m bench train-smoke` and `tests/gpu/`: isolation per backend, short runs.

    isolation_error(backend, device, precision)   max |logits(doc in pack) − logits(doc alone)| and the same
                                                 for plain causal attention over the pack (the leak it prevents)
    smoke_run(cfg, data, out, ...)               a few steps of a recipe through `train()`; tokens/s, peak memory

Nothing here imports mlflow or kfp (the GPU machine does not have them).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np

from packtrain.config import ModelConfig

ISOLATION_MODEL = ModelConfig(hidden_size=256, intermediate_size=688, num_layers=4, num_heads=8, num_kv_heads=4)
"""Small enough to check every backend in seconds; GQA so the kv-head path is covered."""


def isolation_error(backend: str, device: str = "cuda", precision: str = "bf16", vocab_size: int = 1024,
                    model_cfg: ModelConfig = ISOLATION_MODEL, seed: int = 0) -> dict:
    """Two rows of 256 tokens holding documents of 37, 120, 64 (+35 padding) and 200, 56 tokens.

    Returns {"backend", "precision", "max_abs_err", "leak_abs_err", "logit_std"}: max_abs_err over all documents
    (inside the pack vs alone, same backend); leak_abs_err = the error when each row is one causal sequence
    (what isolation prevents), measured on the documents that follow another one in their row."""
    import torch

    from packtrain.model.attention import model_inputs
    from packtrain.model.build import build_model
    from packtrain.packing.batches import build_batch
    from packtrain.train.techniques import autocast

    rng = np.random.default_rng(seed)
    rows = [[37, 120, 64], [200, 56]]
    docs = [[rng.integers(0, vocab_size, n) for n in r] for r in rows]
    batch = build_batch([np.concatenate(r) for r in docs], [np.array(r) for r in rows], 256).to(device)
    torch.manual_seed(seed)
    model = build_model(model_cfg, vocab_size, backend, device).eval()
    dev = torch.device(device).type

    def logits(b):
        with torch.no_grad(), autocast(precision, dev):
            return model(**model_inputs(b, backend)).logits.float().reshape(-1, vocab_size)   # (T, V)

    packed = logits(batch)
    # control: the same rows, each treated as ONE causal sequence (no restart, no isolation)
    leak = logits(build_batch([np.concatenate(r) for r in docs], [np.array([sum(r)]) for r in rows], 256
                              ).to(device))
    err, leak_err, start = 0.0, 0.0, 0
    for r, row in enumerate(docs):
        start = r * 256
        for d in row:
            alone = logits(build_batch([d], [np.array([len(d)])], len(d)).to(device))
            err = max(err, (packed[start: start + len(d)] - alone).abs().max().item())
            if start % 256:   # documents after the first in a row are the ones that could leak
                leak_err = max(leak_err, (leak[start: start + len(d)] - alone).abs().max().item())
            start += len(d)
    return {"backend": backend, "precision": precision, "max_abs_err": err, "leak_abs_err": leak_err,
            "logit_std": packed.std().item()}


def smoke_run(cfg, tokens_dir: Path, packs_dir: Path, out_dir: Path, attention: str, steps: int,
              engine: str = "torch", zero_stage: int = 2, offload: bool = False, compile: bool | None = None,
              warmup_steps: int = 5) -> dict:
    """`steps` steps of `cfg` (a RunConfig, e.g. the 350m-h200 recipe) with one backend/engine; returns the
    numbers that matter: tokens/s (steady-state median), step time, MFU, peak memory, recompiles, losses."""
    import torch

    from packtrain.train.loop import train

    # A fresh dynamo cache per run: several backends in one process share the decoder layer's code object,
    # so without this the second backend's first step counts as a recompile of the first's graph.
    torch._dynamo.reset()
    t = cfg.train
    ds = t.deepspeed.model_copy(update={"zero_stage": zero_stage, "offload_optimizer": offload,
                                        "offload_params": offload and zero_stage == 3})
    train_cfg = t.model_copy(update={
        "attention": attention, "max_steps": steps, "engine": engine, "deepspeed": ds,
        "compile": t.compile if compile is None else compile,
        "checkpoint": t.checkpoint.model_copy(update={"every_steps": 0}),
        "warmup_steps": min(t.warmup_steps, max(1, steps // 4))})
    tel = cfg.telemetry.model_copy(update={"warmup_steps": min(warmup_steps, max(0, steps - 2))})
    t0 = time.perf_counter()
    r = train(cfg.model, train_cfg, cfg.pack, tel, packs_dir, tokens_dir / "tokenizer", out_dir)
    tp, mem = r.throughput, r.memory
    return {
        "attention": attention, "engine": engine, "zero_stage": zero_stage if engine == "deepspeed" else None,
        "offload": offload, "compile": train_cfg.compile, "precision": train_cfg.precision, "steps": r.steps,
        "rows": r.setup["rows"], "budget": r.setup["budget"], "grad_accum": r.setup["grad_accum"],
        "real_tokens_per_s": tp.get("real_tokens_per_s"), "slot_tokens_per_s": tp.get("slot_tokens_per_s"),
        "step_time_p50_s": tp.get("step_time_p50_s"), "useful_mfu": tp.get("useful_mfu"),
        "dense_mfu": tp.get("dense_mfu"), "padding": tp.get("padding"),
        "peak_alloc_gib": mem.get("peak_alloc_gib"), "peak_reserved_gib": mem.get("peak_reserved_gib"),
        "fragmentation": mem.get("fragmentation"), "recompiles": r.recompiles, "compiles": r.compiles,
        "nvml_util": (r.system or {}).get("utilization"), "system_kind": (r.system or {}).get("kind"),
        "first_loss": r.loss_curve[0] if r.loss_curve else None, "final_loss": r.final_loss,
        "setup_s": r.timings["setup_s"], "wall_s": time.perf_counter() - t0,
    }


def cuda_environment() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / (1 << 30)
    with contextlib.suppress(ImportError):
        import transformers

        info["transformers"] = transformers.__version__
    with contextlib.suppress(Exception):   # its version from the package metadata: `import deepspeed` is ~2 CPU-s
        from importlib.metadata import version

        info["deepspeed"] = version("deepspeed")
    return info
