"""LoRA on an 8B-class model, one H200: packtrain against transformers + peft, side by side in one process.

    python bench/lora_bench.py --steps 10 --warmup 4 --out-dir bench/results      # H200, ~4-6 min
    python bench/lora_bench.py --smoke                                           # CPU, tiny shape, seconds
    bash bench/gpu_session.sh lora                                               # the lead's device call

Both variants train the same random-init Llama-3-8B shape (hidden 4096, 32 layers, 32 heads, 8 KV heads,
intermediate 14336, vocabulary 128,256, untied head, RoPE base 5e5) with LoRA r=16, alpha=32 on every linear
layer of the decoder (q/k/v/o, gate/up/down; not the LM head), on the same lognormal documents (median 300,
σ=1, clipped to [16, budget]) packed best-fit-decreasing into rows of `budget` tokens:

  transformers+peft  bf16 weights, peft.get_peft_model, gradient checkpointing (non-reentrant), SDPA on
                     (rows, budget) packed rows with position_ids restarting per document, use_cache=False,
                     bf16 autocast, fused AdamW over the adapter — the issue's anchor path (5,894 real tok/s
                     at 43.3 GiB peak on an H200, measured there).
  packtrain          the product's `train()` (packtrain.train.smoke.smoke_run): the same documents written as a
                     token store and packed by the pack stage's library, `train.adapter` LoRA (apply_adapter),
                     varlen attention on the flattened (1, rows·budget) micro-batch, fused/chunked loss, full
                     activation checkpointing, per-layer torch.compile, bf16.

Reported per variant (one JSON file each, "lora": true): real tok/s (median of the per-step rates over the
steps after --warmup), step time p50, useful MFU, peak allocated/reserved memory (torch.cuda.max_memory_*
over the training steps), loss of the first/last steps; for packtrain also the memory planner's predicted
peak and its error against the measured one (target ±10%) and the speed-up over the baseline.

Useful FLOPs of LoRA (no weight gradients for the frozen base), per real token and per document of length s:

    4·N + 4·h·V      frozen matmuls: forward 2, input-gradient 2 (N = non-embedding params, h·V the LM head)
    + 6·N_adapter    the adapter trains: forward, input- and weight-gradient
    + 12·L·w·Σ s²    attention within documents (w = heads·head_dim), fwd + bwd, the packtrain convention
                     (telemetry.mfu: full s², not halved for causality)

Activation checkpointing recomputes the decoder's forward (+2·N and 4·L·w·Σ s² more): that is work, not useful
work, so it is reported separately as `mfu_with_recompute`. Peak for MFU: 790 TFLOP/s bf16 (measured on the
H200, DESIGN.md). A failing variant (an OOM) is recorded with its error and does not lose the other.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128_256, rope_theta=500_000.0, tie_word_embeddings=False,
                      max_position_embeddings=8192),
    # --smoke: the same structure (GQA, untied head), small enough for a CPU in seconds
    "smoke": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, rope_theta=500_000.0, tie_word_embeddings=False,
                  max_position_embeddings=1024),
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ANCHOR = {"variant": "transformers+peft", "real_tok_per_s": 5894, "peak_gib": 43.3,
          "source": "issue 17 (H200, r=16 all linear, gradient checkpointing, packed rows 8×2048, bf16)"}
GOAL = {"speedup_vs_baseline": 1.5, "peak_gib_max": 40.0, "planner_error_max": 0.10}


# ------------------------------------------------------------------------------------------ shape & flops
def nonembedding_params(spec: dict) -> int:
    """Decoder parameters (attention, MLP, norms) + the final norm; Llama-3-8B → 6,979,588,096."""
    h, i, L = spec["hidden_size"], spec["intermediate_size"], spec["num_hidden_layers"]
    kv = h // spec["num_attention_heads"] * spec["num_key_value_heads"]
    return L * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) + h


def adapter_params(spec: dict, r: int) -> int:
    """LoRA A (r × in) + B (out × r) on the seven linears of every layer; Llama-3-8B at r=16 → 41,943,040."""
    h, i, L = spec["hidden_size"], spec["intermediate_size"], spec["num_hidden_layers"]
    kv = h // spec["num_attention_heads"] * spec["num_key_value_heads"]
    per_layer = (h + h) + (h + kv) + (h + kv) + (h + h) + 2 * (h + i) + (i + h)
    return L * r * per_layer


def flops_per_real_token(spec: dict, r: int, seq_lens: list[int]) -> tuple[float, float]:
    """(useful, with_recompute) FLOPs per real token of LoRA training over documents of `seq_lens`."""
    h, L, V = spec["hidden_size"], spec["num_hidden_layers"], spec["vocab_size"]
    n, na = nonembedding_params(spec), adapter_params(spec, r)
    real = sum(seq_lens)
    sq = sum(s * s for s in seq_lens)
    attn_fwd = 4.0 * L * h * sq / real          # w = heads·head_dim = h for Llama
    useful = 4.0 * n + 4.0 * h * V + 6.0 * na + 3 * attn_fwd
    return useful, useful + 2.0 * n + attn_fwd  # recompute: the decoder's forward once more


# ------------------------------------------------------------------------------------------------- data
def make_documents(n_docs: int, budget: int, vocab: int, seed: int) -> list[np.ndarray]:
    """Lognormal lengths (median 300, σ=1: the anchors' distribution) of Markov-chain tokens (the loss falls)."""
    from packtrain.train.synthetic import markov_documents

    rng = np.random.default_rng(seed)
    lens = np.clip(np.exp(rng.normal(np.log(min(300, budget // 4)), 1.0, n_docs)).astype(np.int64), 16, budget)
    return markov_documents(lens, vocab, rng, eos_id=1)


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


# -------------------------------------------------------------------------------------------- baseline
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
    alloc, reserved = _peaks(device)
    del model, opt, trainable
    return {"real_tok_per_s": tok_s, "step_time_p50_s": statistics.median(dt for _, dt in steady),
            "useful_mfu": tok_s * useful / (args.peak_tflops * 1e12),
            "mfu_with_recompute": tok_s * hw / (args.peak_tflops * 1e12),
            "peak_alloc_gib": alloc, "peak_reserved_gib": reserved,
            "first_loss": losses[0], "last_loss": losses[-1], "loss_curve": losses,
            "trainable_params": n_trainable, "fill": sum(b["real"] for b, _ in steady) / sum(b["slot"] for b, _ in steady),
            "attention": "sdpa (packed rows, position_ids)", "activation_checkpointing": "gradient_checkpointing",
            "compile": False, "loss": "transformers (full logits)"}


# ------------------------------------------------------------------------------------------- packtrain
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


def _peaks(device) -> tuple[float, float]:
    import torch

    if device.type != "cuda":
        return 0.0, 0.0
    return torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30


# ------------------------------------------------------------------------------------------------- main
RUNNERS = {"transformers+peft": run_transformers_peft, "packtrain": run_packtrain}
FILES = {"transformers+peft": "lora_bench_transformers_peft.json", "packtrain": "lora_bench_packtrain.json"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true",
                   help="tiny shape on the CPU (sdpa, chunked loss, no compile, 2 rows × 128): checks the script")
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
    p.add_argument("--ac", default="full", help="packtrain activation checkpointing: full | every_k | none")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--packtrain-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra recipe overrides for the packtrain variant")
    p.add_argument("--out-dir", default=None, help="where the two JSON files go (default: bench/results; "
                                                   "--smoke: a temporary directory)")
    args = p.parse_args(argv)
    if args.smoke:
        args.shape, args.device, args.attention, args.loss, args.no_compile = "smoke", "cpu", "sdpa", "chunked", True
        args.budget = 128
        args.rows = "2" if args.rows == "8" else args.rows
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
    if args.rows != "auto":
        args.rows = int(args.rows)
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    import torch

    device = torch.device(args.device)
    spec = SHAPES[args.shape]
    rows_for_data = args.rows if isinstance(args.rows, int) else 16
    n_docs = max(400, (args.steps + args.warmup) * rows_for_data * (args.budget // 150 + 2))
    docs = make_documents(n_docs, args.budget, spec["vocab_size"], args.seed)
    out_dir = Path(args.out_dir or (tempfile.mkdtemp(prefix="lora-bench-smoke-") if args.smoke else "bench/results"))
    out_dir.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    machine = _machine(device, args)
    rows_out = []
    for name in [v.strip() for v in args.variants.split(",") if v.strip()]:
        if name not in RUNNERS:
            raise SystemExit(f"--variants: {name!r} is not one of {', '.join(RUNNERS)}")
        if name == "transformers+peft" and args.rows == "auto":
            print("transformers+peft: --rows auto is packtrain's; the baseline uses 8 rows", file=sys.stderr)
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
                "budget": args.budget, "precision": "bf16", "command": command, "machine": machine,
                "anchor": ANCHOR, "goal": GOAL}
        try:
            if name == "transformers+peft" and not isinstance(args.rows, int):
                args_b = argparse.Namespace(**{**vars(args), "rows": 8})
                res = RUNNERS[name](spec, docs, args_b, device)
            else:
                res = RUNNERS[name](spec, docs, args, device)
            row = {**base, **res}
        except Exception as e:  # noqa: BLE001 - one variant failing (an OOM) must not lose the other
            traceback.print_exc()
            alloc, reserved = _peaks(device)
            row = {**base, "error": f"{type(e).__name__}: {str(e)[:600]}",
                   "oom": isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()
                   or type(e).__name__ == "TrainOutOfMemory",
                   "peak_alloc_gib": alloc, "peak_reserved_gib": reserved}
        row["variant_wall_s"] = time.perf_counter() - t0
        rows_out.append(row)
        (out_dir / FILES[name]).write_text(json.dumps(row, indent=2) + "\n")   # now: a later timeout keeps it
        print(json.dumps({k: v for k, v in row.items() if k not in ("loss_curve", "shape", "machine")}), flush=True)
    _compare(rows_out)
    for row in rows_out:
        (out_dir / FILES[row["variant"]]).write_text(json.dumps(row, indent=2) + "\n")
    _print_table(rows_out, out_dir)
    return rows_out


def _compare(rows: list[dict]) -> None:
    """packtrain's speed-up over the baseline measured in the same run (and over the issue's anchor)."""
    by = {r["variant"]: r for r in rows}
    ours, base = by.get("packtrain", {}), by.get("transformers+peft", {})
    if ours.get("real_tok_per_s"):
        ours["speedup_vs_anchor"] = ours["real_tok_per_s"] / ANCHOR["real_tok_per_s"]
        if base.get("real_tok_per_s"):
            ours["speedup_vs_baseline"] = ours["real_tok_per_s"] / base["real_tok_per_s"]
        ours["goal_met"] = {
            "speedup": ours.get("speedup_vs_baseline", 0) >= GOAL["speedup_vs_baseline"],
            "peak": (ours.get("peak_alloc_gib") or 0) <= GOAL["peak_gib_max"],
            "planner": abs(ours.get("planner_error", 1.0)) <= GOAL["planner_error_max"]}


def _machine(device, args) -> dict:
    import torch
    import transformers

    m = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else f"cpu ({platform.processor()})",
         "torch": torch.__version__, "transformers": transformers.__version__, "host": platform.node(),
         "peak_tflops": args.peak_tflops}
    try:
        import peft

        m["peft"] = peft.__version__
    except ImportError:
        m["peft"] = None
    return m


def _print_table(rows: list[dict], out_dir: Path) -> None:
    print(f"\n{'variant':<18} {'real tok/s':>10} {'useful MFU':>10} {'alloc GiB':>9} {'resv GiB':>8} "
          f"{'planner GiB':>11} {'loss first→last':>16} {'speed-up':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:<18} ERROR{' (OOM)' if r.get('oom') else ''}: {r['error'][:100]}")
            continue
        pl = r.get("planner_peak_alloc_gib")
        sp = r.get("speedup_vs_baseline")
        print(f"{r['variant']:<18} {r['real_tok_per_s']:>10,.0f} {r['useful_mfu'] or 0:>10.3f} "
              f"{r['peak_alloc_gib']:>9.1f} {r['peak_reserved_gib']:>8.1f} "
              f"{'-' if pl is None else f'{pl:.1f}':>11} "
              f"{r['first_loss']:>7.3f} → {r['last_loss']:<6.3f} {'-' if sp is None else f'{sp:.2f}×':>8}")
    print(f"anchor (issue 17): transformers+peft {ANCHOR['real_tok_per_s']:,} tok/s at {ANCHOR['peak_gib']} GiB; "
          f"JSON in {out_dir}")


if __name__ == "__main__":
    main()
