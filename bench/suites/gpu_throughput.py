"""Side-by-side GPU benchmark: packtrain against what users do today, same model, data and budget, one run.

    python -m bench gpu-throughput --model 350m --steps 30 --out bench/results/gpu_bench_350m.json
    python -m bench gpu-throughput --model qwen2-0.5b --variants ef --out bench/results/gpu_bench_qwen2_0.5b.json
    python -m bench gpu-throughput --smoke --out /tmp/gt     # CPU: tiny Llama, every variant, 1 step each
    python bench/gpu_bench.py ...                            # the kept path: the same suite

Variants (each trains the same random-init model — a Llama size, or a real family's shape such as Qwen2-0.5B —
for `--steps` optimizer steps after `--warmup`, bf16):
  a  pad         every document padded to the budget, one document per row        (HF "max_length" padding)
  b  dynamic     `rows` random documents per step padded to the longest of them   (HF default collator)
  c  group       like b, documents grouped by length in mega-batches               (HF group_by_length)
  d  concat      documents concatenated and cut into rows; NOT isolated            (run_clm "group_texts")
  e  hf_packed   BFD packs, transformers SDPA + position_ids, no mask (isolated)  (TRL padding_free)
  f  packtrain   BFD packs, flattened (1, T), varlen attention, torch.compile, fused/chunked loss,
                 fused AdamW, pinned prefetch — packtrain's training path.
  g  packtrain_alt  the same with the --alt-set overrides on top (e.g. train.loss_kernel=torch): a second
                 configuration of the product measured beside the first in one process.

Every variant gets `rows` rows of at most `budget` tokens per micro-batch, so the slot budget is the same.
Reported per variant: real tok/s (non-padding tokens that carry loss), useful MFU (6N per real token +
attention within documents, Σ sᵢ²), dense MFU (6N per slot token + attention over the full rows), NVML
utilization, peak allocated/reserved memory, fragmentation (1 − alloc/reserved at peak), fill, isolation error
(max |logit difference| of one document inside its batch vs. alone), recompiles. Needs CUDA (--smoke: the CPU);
prints a table last. The record's `metrics` holds every row's numbers as "<variant>.<field>" (e.g.
`packtrain.real_tok_per_s`): the names `packtrain gate` reads from it (bench/baselines/gpu-rules.yaml).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np

from bench.harness import Record, machine_info
from bench.transformers_baselines import (
    batches_concat,
    batches_packed_rows,
    batches_padded,
    build_hf,
    hf_config,
    isolation_error,
    run_hf_variant,
)

SUMMARY = "side by side against what users do today (padding, concat, transformers packed rows) — tok/s, MFU, memory"
DEVICE = "gpu"

SIZES = {  # the recipes' model sections, repeated so the bench needs no pydantic/yaml on the GPU box
    "tiny": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4),
    "125m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12),
    "350m": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=24, num_attention_heads=16),
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=16),
    # real families, random init from the released configs' shapes: 151,936-token vocabulary, tied embeddings,
    # GQA with 2 KV heads, q/k/v biases, RoPE base 1e6. packtrain trains them through model.init_from=<dir>
    # (a random-init checkpoint written by the bench), the transformers variants build Qwen2ForCausalLM.
    "qwen2-0.5b": dict(model_type="qwen2", vocab_size=151_936, hidden_size=896, intermediate_size=4864,
                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, rope_theta=1e6,
                       tie_word_embeddings=True),
    "qwen2-1.5b": dict(model_type="qwen2", vocab_size=151_936, hidden_size=1536, intermediate_size=8960,
                       num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, rope_theta=1e6,
                       tie_word_embeddings=True),
    # a Gemma-style 256k vocabulary: Gemma-3-1B's shape (262,144 ids, tied, 1 KV head of 256, sliding window 512
    # on 5 of every 6 layers); the embedding is 302M of its 1.0B parameters
    "gemma3-1b": dict(model_type="gemma3_text", vocab_size=262_144, hidden_size=1152, intermediate_size=6912,
                      num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                      rope_theta=1e6, sliding_window=512, tie_word_embeddings=True),
}
VARIANTS = {"a": "pad", "b": "dynamic", "c": "group", "d": "concat", "e": "hf_packed", "f": "packtrain",
            "g": "packtrain_alt"}
ISOLATED = {"pad": True, "dynamic": True, "group": True, "concat": False, "hf_packed": True, "packtrain": True,
            "packtrain_alt": True}


# ----------------------------------------------------------------------------------------------- data
def make_lengths(kind: str, n: int, budget: int, seed: int, corpus_lengths: str | None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "corpus":
        lens = np.load(corpus_lengths)
        lens = lens[rng.permutation(len(lens))][:n]
    else:  # lognormal, median 300, sigma 1 (the anchors' distribution)
        lens = np.exp(rng.normal(np.log(300), 1.0, n))
    return np.clip(lens.astype(np.int64), 16, budget)


def doc_tokens(lengths: np.ndarray, vocab: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    return [rng.integers(0, vocab, int(n), dtype=np.int64) for n in lengths]


def bfd_packs(lengths: np.ndarray, budget: int) -> list[list[int]]:
    from packtrain.packing.bins import pack_lengths

    plan = pack_lengths(lengths, budget, strategy="bfd")
    return [[seg[0] for seg in pack] for pack in plan.to_lists()]  # lengths ≤ budget: one segment per doc


# ------------------------------------------------------------------------------------------ measuring
def flop_dims(spec: dict, vocab: int, budget: int) -> dict:
    """N (non-embedding parameters) and the attention shape of the benchmarked model, from packtrain's own
    shape arithmetic (planner.shapes, telemetry.mfu) so the baselines are counted like packtrain's meter: for a
    tied model 6·N_nonembed + 6·h·V per token = 6·N with N including the tied embedding."""
    from packtrain.planner.shapes import shape_of_config
    from packtrain.telemetry.mfu import model_flop_dims

    cfg = hf_config(spec, vocab, "sdpa", budget * 2)
    return {"n_nonembed": shape_of_config(cfg).n_params_nonembed, **model_flop_dims(cfg)}


def batch_flops(b, dims: dict) -> tuple[float, float]:
    """(useful, dense) fwd+bwd FLOPs of one batch with packtrain's own MFU arithmetic (telemetry.mfu), so
    every variant is counted the same way: the row length S of a padded batch is its 'budget'."""
    from packtrain.telemetry.mfu import step_flops

    S = b["input_ids"].shape[1]
    return step_flops(dims["n_nonembed"], dims["n_layers"], dims["hidden_size"], b["seq_lens"], b["slot"], S,
                      dims["vocab_size"], attn_width=dims["attn_width"], windows=dims["windows"])


# --------------------------------------------------------------------------------- packtrain variant
def run_packtrain_variant(size, vocab, docs, rows, budget, steps, warmup, device, args, extra=()) -> dict:
    """packtrain's own training path, end to end: the same documents written as a token store, packed by the
    pack stage's library (bfd), trained by `packtrain.train.loop.train` with the recipe's settings
    (varlen attention, bf16, per-layer torch.compile, fused AdamW, pinned loader) — the product, not a copy.
    A real family (qwen2-*) is written as a random-init checkpoint first and continued with model.init_from,
    the path users retraining a released model take. Returns the row's measured fields; tokens/s and MFU are
    the train meter's steady-state medians."""
    import tempfile

    from packtrain.config import load_run_config
    from packtrain.data.token_store import write_token_store
    from packtrain.packing.dataset import pack_dataset
    from packtrain.testing.gpu_smoke import smoke_run
    from packtrain.testing.synthetic_inputs import write_tokenizer

    recipe = {"350m": "350m-h200", "1b": "1b-h200"}.get(size, "350m-h200")
    overrides = [f"pack.budget={budget}", f"train.rows={rows}", f"train.attention={args.attention}",
                 f"train.loss={args.loss}", "train.precision=bf16", f"train.compile={not args.no_compile}",
                 f"telemetry.peak_tflops={args.peak_tflops}", "telemetry.interval_s=0.2",
                 f"train.device={device.type}", *args.packtrain_set, *extra]
    with tempfile.TemporaryDirectory(prefix="ptbench-") as tmp:
        tmp = Path(tmp)
        spec = model_spec(size, args)
        if "model_type" in spec:
            overrides.append(f"model.init_from={write_random_checkpoint(spec, vocab, tmp / 'init', args.seed)}")
        else:   # a Llama from sizes (the 350m/1b recipes' own, or --layers applied)
            overrides += [f"model.hidden_size={spec['hidden_size']}", f"model.intermediate_size={spec['intermediate_size']}",
                          f"model.num_layers={spec['num_hidden_layers']}", f"model.num_heads={spec['num_attention_heads']}"]
        cfg = load_run_config(recipe, overrides)
        write_tokenizer(tmp / "tok", vocab)
        n = len(docs)
        write_token_store(tmp / "tokenize", docs, np.arange(n), np.zeros(n, np.uint8),
                          {"vocab_size": vocab, "eos_id": 1, "pad_id": 0}, tokenizer_dir=tmp / "tok")
        stats = pack_dataset(tmp / "tokenize", tmp / "pack", cfg.pack)
        r = smoke_run(cfg, tmp / "tokenize", tmp / "pack", tmp / "out", args.attention, steps + warmup,
                      compile=not args.no_compile, warmup_steps=warmup)
        iso = packtrain_isolation_error(cfg, vocab, args.attention, device, docs)
    print(json.dumps({"packtrain_smoke": r}), flush=True)
    return {"real_tok_per_s": r["real_tokens_per_s"], "slot_tok_per_s": r["slot_tokens_per_s"],
            "useful_mfu": r["useful_mfu"], "dense_mfu": r["dense_mfu"],
            "nvml_util": r.get("nvml_util") if r.get("system_kind") == "nvml" else None,
            "peak_alloc_gib": r["peak_alloc_gib"], "peak_reserved_gib": r["peak_reserved_gib"],
            "fragmentation": r["fragmentation"], "fill": stats.train.fill, "isolation_err": iso,
            "recompiles": r["recompiles"], "compiles": r["compiles"], "final_loss": r["final_loss"],
            "step_time_p50_s": r["step_time_p50_s"]}


def model_spec(size: str, args) -> dict:
    """SIZES[size] with --layers applied (a CPU smoke keeps the real widths and vocabulary, fewer layers)."""
    spec = dict(SIZES[size])
    if args.layers:
        spec["num_hidden_layers"] = args.layers
    return spec


def write_random_checkpoint(spec: dict, vocab: int, out: Path, seed: int) -> Path:
    """A random-init checkpoint of a real family (bf16 safetensors; packtrain loads it as fp32 master weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    from packtrain.model.saving import save_pretrained

    torch.manual_seed(seed)
    cfg = hf_config(spec, vocab, "sdpa", spec.get("max_position_embeddings", 32768))
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    save_pretrained(model, str(out))   # as packtrain exports: without importing deepspeed to unwrap
    del model
    return out


def packtrain_isolation_error(cfg, vocab, backend, device, docs):
    """The same check as `isolation_error`, through packtrain's model builder, batch builder and backend."""
    import torch

    from packtrain.model.attention import model_inputs
    from packtrain.model.build import build_model
    from packtrain.packing.batches import build_batch

    picked = [d for d in docs[:64] if 32 <= len(d) <= 600][:3]
    row = np.concatenate(picked)
    budget = len(row) + 8
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab, backend, device).eval()

    def logits(toks, lens, b):
        batch = build_batch([toks], [np.array(lens)], b).to(device)
        with torch.no_grad(), torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            return model(**model_inputs(batch, backend)).logits[0].float()

    packed = logits(row, [len(d) for d in picked], budget)
    s0, n = len(picked[0]), len(picked[1])
    alone = logits(picked[1], [n], n)
    return float((packed[s0: s0 + n] - alone[:n]).abs().max())


def add_arguments(p) -> None:
    p.add_argument("--model", choices=list(SIZES), default="350m",
                   help="a Llama size, or a real family's shape (qwen2-0.5b, qwen2-1.5b: random init)")
    p.add_argument("--layers", type=int, default=None,
                   help="override the number of layers (a CPU run of a large shape: --layers 1)")
    p.add_argument("--variants", default="abcdef")
    p.add_argument("--data", choices=["lognormal", "corpus"], default="lognormal")
    p.add_argument("--corpus-lengths", default="bench/data/corpus_lengths.npy")
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--vocab", type=int, default=None, help="default: the family's (151,936 for qwen2-*), else 32768")
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--attention", default="varlen")
    p.add_argument("--loss", default="fused", help="packtrain loss: fused (train.loss_kernel: liger, the default, "
                   "or torch via --packtrain-set), chunked, standard")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda; cpu only to check the suite (--smoke sets it)")
    p.add_argument("--packtrain-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra recipe overrides for the packtrain variant (e.g. train.activation_checkpointing=full)")
    p.add_argument("--alt-set", action="append", default=[], metavar="KEY=VALUE",
                   help="variant g (packtrain_alt): packtrain with these overrides on top of --packtrain-set")


SMOKE = {"model": "tiny", "device": "cpu", "steps": 1, "warmup": 1, "rows": 1, "budget": 128, "attention": "sdpa",
         "loss": "chunked", "no_compile": True, "vocab": 512}
"""--smoke: the tiny Llama on the CPU, every variant, one measured step of one 128-token row."""


def _packtrain_row(name: str, args, docs, device) -> dict:
    """Variant f (packtrain) or g (packtrain_alt: --alt-set on top) through packtrain's training path."""
    extra = list(args.alt_set) if name == "packtrain_alt" else []
    res = run_packtrain_variant(args.model, args.vocab, docs, args.rows, args.budget, args.steps,
                                args.warmup, device, args, extra)
    return {"variant": name, "model": args.model, "data": args.data, "isolated": True, **res,
            "overrides": [*args.packtrain_set, *extra],
            "steps": args.steps, "rows": args.rows, "budget": args.budget, "command": args.command}


def _transformers_row(name: str, args, spec: dict, docs, packs, dims, device) -> dict:
    """Variants a-e: the transformers model on the batches of what users do today (module doc)."""
    import torch

    n_steps = args.steps + args.warmup
    if name in ("pad", "dynamic", "group"):
        batches = batches_padded(name, docs, args.rows, args.budget, 0, n_steps, args.seed)
    elif name == "concat":
        batches = batches_concat(docs, args.rows, args.budget, n_steps)
    else:
        batches = batches_packed_rows(docs, packs, args.rows, args.budget, n_steps)
    model = build_hf(spec, args.vocab, "sdpa", device, args.seed, args.budget * 2)
    dt, util, loss = run_hf_variant(name, model, batches, args.steps, args.warmup, device)
    meas = batches[args.warmup:]
    real = sum(b["real"] for b in meas)
    slot = sum(b["slot"] for b in meas)
    iso = isolation_error(model, batches[0], device, name)
    recompiles = 0
    del model
    cuda = device.type == "cuda"
    peak = args.peak_tflops * 1e12
    alloc = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    reserved = torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0
    fl = [batch_flops(b, dims) for b in meas]
    useful, dense = sum(f[0] for f in fl), sum(f[1] for f in fl)
    return {"variant": name, "model": args.model, "data": args.data, "isolated": ISOLATED[name],
            "real_tok_per_s": real / dt, "slot_tok_per_s": slot / dt,
            "useful_mfu": useful / dt / peak, "dense_mfu": dense / dt / peak,
            "nvml_util": util, "peak_alloc_gib": alloc, "peak_reserved_gib": reserved,
            "fragmentation": 1 - alloc / reserved if reserved else None, "fill": real / slot,
            "isolation_err": iso, "recompiles": recompiles, "final_loss": loss,
            "steps": args.steps, "rows": args.rows, "budget": args.budget, "command": args.command}


def run(args, out: Path) -> Record:
    if args.smoke:
        vars(args).update(SMOKE)
    spec = model_spec(args.model, args)
    args.vocab = args.vocab or spec.get("vocab_size", 32768)

    import torch

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    n_steps = args.steps + args.warmup
    n_docs = 400 if args.smoke else max(20000, n_steps * args.rows * 12)
    lengths = make_lengths(args.data, n_docs, args.budget, args.seed, args.corpus_lengths)
    docs = doc_tokens(lengths, args.vocab, args.seed)
    packs = bfd_packs(lengths, args.budget)
    rng = np.random.default_rng(args.seed)
    packs = [packs[i] for i in rng.permutation(len(packs))]
    dims = flop_dims(spec, args.vocab, args.budget)
    command = args.command
    rows_out = []
    for letter in args.variants:
        name = VARIANTS[letter]
        torch.manual_seed(args.seed)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            if name in ("packtrain", "packtrain_alt"):
                row = _packtrain_row(name, args, docs, device)
            else:
                row = _transformers_row(name, args, spec, docs, packs, dims, device)
        except Exception as e:  # noqa: BLE001 - one variant failing must not lose the others
            import traceback

            traceback.print_exc()
            row = {"variant": name, "model": args.model, "error": f"{type(e).__name__}: {e}", "command": command}
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    record = Record(suite="gpu-throughput", study=f"side by side against the anchors, {args.model}",
                    command=command, machine=machine_info(args.peak_tflops), rows=rows_out,
                    settings={k: getattr(args, k) for k in ("model", "layers", "variants", "data", "budget", "rows",
                                                             "steps", "warmup", "vocab", "attention", "loss",
                                                             "no_compile", "seed", "device", "packtrain_set", "alt_set")},
                    goals=GOALS)
    ours = next((r for r in rows_out if r["variant"] == "packtrain" and "error" not in r), None)
    if ours is not None and args.model in GOALS:
        measured = {**ours, **speedups(ours, rows_out)}
        record.goal_met = {k: bool(k in measured and measured[k] >= v) for k, v in GOALS[args.model].items()}
    record.extra["metrics"] = row_metrics(rows_out)
    print_table(rows_out)
    return record


GOALS = {"350m": {"real_tok_per_s": 160_000.0}, "1b": {"useful_mfu": 0.55},
         "qwen2-0.5b": {"speedup_vs_hf_packed": 2.2, "useful_mfu": 0.55}}
"""The targets of the packtrain row: 350M ≥ 160k real tok/s, 1B ≥ 55% useful MFU (H200); Qwen2-0.5B (the
vocabulary-heavy step) ≥ 2.2× transformers' packed rows of the same run and ≥ 55% useful MFU. A speedup goal
not measurable in a run (its baseline row missing or failed) is not met."""


def speedups(ours: dict, rows: list[dict]) -> dict[str, float]:
    """The packtrain row's ratio to every other successful row of the same run, "speedup_vs_<variant>":
    {"speedup_vs_hf_packed": 1.98} for 118,855 against 60,138 real tok/s."""
    return {f"speedup_vs_{r['variant']}": ours["real_tok_per_s"] / r["real_tok_per_s"] for r in rows
            if r is not ours and "error" not in r and r.get("real_tok_per_s")}


def row_metrics(rows: list[dict]) -> dict[str, float]:
    """Every number of every row as "<variant>.<field>" (what `packtrain gate` reads from the record)."""
    return {f"{r['variant']}.{k}": float(v) for r in rows for k, v in r.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def print_table(rows_out: list[dict]) -> None:
    from bench.workload import print_rows

    def cells(name: str, r: dict) -> str:
        u = "-" if r["nvml_util"] is None else f"{r['nvml_util']:.2f}"
        return (f"{'yes' if r['isolated'] else 'no':>4} {r['real_tok_per_s']:>11,.0f} {r['useful_mfu']:>10.3f} "
                f"{r['dense_mfu']:>9.3f} {u:>5} {r['peak_alloc_gib']:>9.1f} {r['peak_reserved_gib']:>8.1f} "
                f"{r['fragmentation'] or 0:>5.2f} {r['fill']:>6.3f} {r['isolation_err']:>8.4f}")

    print_rows(rows_out, None, f"{'variant':<10} {'iso':>4} {'real tok/s':>11} {'useful MFU':>10} {'dense MFU':>9} "
               f"{'util':>5} {'alloc GiB':>9} {'resv GiB':>8} {'frag':>5} {'fill':>6} {'iso err':>8}", 10, cells)
