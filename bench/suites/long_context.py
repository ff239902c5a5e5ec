"""Long context on one H200: a 1B Llama at a 32k budget on long-tailed documents, packtrain beside transformers.

    python -m bench long-context --budget 32768 --out bench/results/long_context_1b_32k.json   # H200, ~3 min
    python -m bench long-context --budget 16384 --out bench/results/long_context_1b_16k.json
    python -m bench long-context --smoke --out /tmp/lc                                         # CPU, tiny

Model: recipes/1b-32k-h200.yaml (a ~1B Llama: hidden 2048, 16 layers, 16 heads, vocab 32768; pack.budget 32768,
varlen attention, bf16, per-layer compile, fused loss); without that file, recipes/1b-h200.yaml with
model.max_position_embeddings raised to the budget. `--budget` overrides pack.budget (8k/16k/32k/64k rows).

Data: lognormal document lengths, median 2,048, σ 1.2, clipped to [64, budget] — one long-document corpus at
every budget, a heavy tail (measured at 32k, seed 0: p50 1.9k, p90 9.9k, p99 = budget; 1.3% of the documents
exactly budget-long — a longer document's first chunk; 50% of the tokens in documents ≥ 8k, 25% ≥ 16k;
Σs²/Σs ≈ 11.4k, so attention is ~46% of the useful FLOPs of the 1B at 32k). Tokens from packtrain's synthetic Markov chain (the loss falls).
The record's "data" block has the measured quantiles and Σs²/Σs (the attention span a token pays for).

Variants, same documents, same packs (best-fit-decreasing at the budget), `rows` packs per step (default
32768 // budget, at least 1: 4 × 8k, 2 × 16k, 1 × 32k, 1 × 64k):
  packtrain              the product's train(): token store → pack_dataset → smoke_run (varlen over cu_seqlens,
                         compile, fused loss), the meter's steady-state medians after --warmup steps
  packtrain_flex         (optional) the same with train.attention=flex (document BlockMask, built once a step)
  transformers_packed    transformers' own LlamaForCausalLM (the same config: packtrain.model.build.llama_config),
                         SDPA on (rows, budget) packed rows with position_ids restarting per document, no mask,
                         use_cache=False, bf16 autocast, fused AdamW (bench/transformers_baselines.py) — its tok/s, or the OOM
                         it hits (recorded; the memory is freed and the run goes on)

Recorded: real tok/s, useful MFU (packtrain's convention, full s² per document) and useful_mfu_causal (the
attention term halved: what a causal kernel executes), the steps' peak allocated memory beside the planner's
prediction for the same shape (packtrain.planner.choose_shape + plan_shape, as `packtrain plan` calls them;
goal ±10%), loss curves. Goals: useful MFU ≥ 50%, planner within ±10%.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from bench import workload
from bench.harness import GIB, Record, machine_info, timed
from bench.packtrain_runs import by_variant, run_compared, run_packtrain

SUMMARY = "long context: a 1B Llama at a 32k budget on long-tailed documents, packtrain beside transformers"
DEVICE = "gpu"
GOALS = {"useful_mfu_min": 0.50, "planner_error_max": 0.10}
VARIANTS = {"packtrain": [], "packtrain_flex": ["train.attention=flex"], "transformers_packed": None}
"""name → extra packtrain overrides (None: the transformers baseline). packtrain_flex: the same run with
FlexAttention's document BlockMask instead of varlen (optional row: --variants packtrain,packtrain_flex,...)."""


def add_arguments(p) -> None:
    p.add_argument("--budget", type=int, default=32768, help="pack.budget: 8192 | 16384 | 32768 | 65536")
    p.add_argument("--rows", type=int, default=None,
                   help="packs per micro-batch; default max(1, 32768 // budget): 32,768 tokens a step up to 32k")
    p.add_argument("--recipe", default="1b-32k-h200", help="recipes/<name>.yaml (missing → 1b-h200)")
    p.add_argument("--attention", default=None, help="packtrain backend (default: the recipe's): varlen | flex")
    p.add_argument("--steps", type=int, default=20, help="measured packtrain steps after --warmup")
    p.add_argument("--warmup", type=int, default=6, help="packtrain steps not measured (compile happens here)")
    p.add_argument("--hf-steps", type=int, default=8)
    p.add_argument("--hf-warmup", type=int, default=2)
    p.add_argument("--median", type=float, default=None,
                   help="median document length (default 2048 at every budget: one corpus, cut at the budget)")
    p.add_argument("--sigma", type=float, default=1.2, help="lognormal σ of the document lengths")
    p.add_argument("--variants", default="packtrain,transformers_packed",
                   help="comma-separated, in this order (packtrain first: its numbers are written before an OOM "
                        "of the baseline could take the process down)")
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--packtrain-set", action="append", default=[], metavar="KEY=VALUE")


def long_tailed_lengths(tokens: int, budget: int, median: float, sigma: float, seed: int):
    """Lognormal(ln median, σ) lengths clipped to [64, budget] until they hold ≥ `tokens` tokens."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lo = min(64, budget)
    return workload.lengths_for_tokens(
        lambda n: np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), lo, budget).astype(np.int64), tokens)


def recipe_config(args, vocab: int):
    """The packtrain RunConfig: the recipe + the budget/rows/attention of this run (+ --smoke, --packtrain-set)."""
    name = args.recipe if (workload.ROOT / "recipes" / f"{args.recipe}.yaml").exists() else "1b-h200"
    args.recipe_used = name
    ov = [f"pack.budget={args.budget}", f"train.rows={args.rows}", f"telemetry.peak_tflops={args.peak_tflops}",
          "telemetry.interval_s=0.2", f"train.seed={args.seed}"]
    if args.attention:
        ov.append(f"train.attention={args.attention}")
    if args.smoke:
        ov += workload.TINY_MODEL + workload.TINY_TRAIN
    ov += args.packtrain_set
    cfg = workload.load_recipe(name, ov)
    if cfg.model.max_position_embeddings < args.budget:   # 1b-h200 says 4096; a scratch model needs ≥ budget
        ov.append(f"model.max_position_embeddings={args.budget}")
        cfg = workload.load_recipe(name, ov)
    return cfg, ov


def run_transformers(cfg, docs, lengths, args, vocab) -> dict:
    """transformers' packed-rows path (transformers_baselines.run_hf_variant) on the same documents, BFD packs of
    the budget, `rows` rows per step; tok/s = real tokens / wall time over --hf-steps after --hf-warmup."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from bench.transformers_baselines import batches_packed_rows, run_hf_variant
    from packtrain.model.build import llama_config
    from packtrain.packing.bins import pack_lengths
    from packtrain.planner.shapes import shape_of_config
    from packtrain.telemetry.mfu import model_flop_dims, step_flops

    device = torch.device("cpu" if cfg.train.device == "cpu" else "cuda")
    plan = pack_lengths(lengths, args.budget, strategy="bfd")
    packs = [[seg[0] for seg in pack] for pack in plan.to_lists()]   # lengths ≤ budget: one segment per doc
    packs = [packs[i] for i in np.random.default_rng(args.seed).permutation(len(packs))]
    n = args.hf_steps + args.hf_warmup
    batches = batches_packed_rows(docs, packs, args.rows, args.budget, n)
    hf_cfg = llama_config(cfg.model, vocab, "sdpa")   # packtrain's model config, transformers' own model
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_cfg)
    dt, util, loss = run_hf_variant("hf_packed", model, batches, args.hf_steps, args.hf_warmup, device)
    alloc = torch.cuda.max_memory_allocated() / GIB if device.type == "cuda" else None
    reserved = torch.cuda.max_memory_reserved() / GIB if device.type == "cuda" else None
    del model
    meas = batches[args.hf_warmup:]
    dims = model_flop_dims(hf_cfg)
    n_ne = shape_of_config(hf_cfg).n_params_nonembed
    useful = sum(step_flops(n_ne, dims["n_layers"], dims["hidden_size"], b["seq_lens"], b["slot"], args.budget,
                            dims["vocab_size"], attn_width=dims["attn_width"], windows=dims["windows"])[0]
                 for b in meas)
    real = sum(b["real"] for b in meas)
    return {"real_tokens_per_s": real / dt, "useful_mfu": useful / dt / (args.peak_tflops * 1e12),
            "step_time_mean_s": dt / len(meas), "peak_alloc_gib": alloc, "peak_reserved_gib": reserved,
            "nvml_util": util, "final_loss": loss, "steps": args.hf_steps, "warmup": args.hf_warmup,
            "attention": "sdpa (transformers, position_ids packed rows)"}


def run(args, out: Path) -> Record:
    if args.smoke:
        args.budget = 512 if args.budget == 32768 else args.budget
        args.steps, args.warmup, args.hf_steps, args.hf_warmup = 2, 1, 2, 1
    args.rows = args.rows or (1 if args.smoke else max(1, 32768 // args.budget))
    args.median = args.median or (args.budget / 16 if args.smoke else 2048.0)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [n for n in names if n not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: {bad} not in {sorted(VARIANTS)}")
    vocab = 512 if args.smoke else 32768
    cfg, overrides = recipe_config(args, vocab)
    need = int((args.steps + args.warmup + 4) * args.rows * args.budget * 1.15)
    lengths = long_tailed_lengths(max(need, 8 * args.budget), args.budget, args.median, args.sigma, args.seed)
    docs, gen_s = timed(workload.markov_docs, lengths, vocab, args.seed)
    record = Record(
        suite="long-context", study="long context: 1B at a long budget on long-tailed documents",
        command=args.command, machine=machine_info(args.peak_tflops), goals=GOALS,
        settings={"recipe": args.recipe_used, "overrides": overrides, "budget": args.budget,
                  "rows": args.rows, "tokens_per_step": args.rows * args.budget, "steps": args.steps,
                  "warmup": args.warmup, "hf_steps": args.hf_steps, "hf_warmup": args.hf_warmup,
                  "attention": cfg.train.attention, "precision": cfg.train.precision,
                  "compile": cfg.train.compile, "loss": cfg.train.loss, "vocab": vocab,
                  "activation_checkpointing": cfg.train.activation_checkpointing,
                  "chunk_positions": getattr(cfg.pack, "chunk_positions", None),
                  "model": cfg.model.model_dump(mode="json"), "seed": args.seed,
                  "lengths": {"dist": "lognormal", "median": args.median, "sigma": args.sigma,
                              "clip": [min(64, args.budget), args.budget]}},
        extra={"data": {**workload.length_summary(lengths), "generate_s": gen_s}})
    print(json.dumps({"data": record.extra["data"]}), flush=True)
    with tempfile.TemporaryDirectory(prefix="lc-bench-") as tmp:
        tmp = Path(tmp)
        tokens_dir, packs_dir, stats = workload.write_inputs(tmp, docs, vocab, cfg.pack)
        record.extra["pack"] = {"fill": stats["fill"], "n_packs": stats["n_packs"]}

        def one(name: str) -> dict:
            if VARIANTS[name] is None:
                return run_transformers(cfg, docs, lengths, args, vocab)
            return run_packtrain(workload.load_recipe(args.recipe_used, overrides + VARIANTS[name]), tokens_dir,
                                 packs_dir, tmp / name, args.steps + args.warmup, args.warmup, vocab)

        return run_compared(record, args.record_path, names, one, compare, print_table)


def compare(record: Record) -> None:
    """Speed-up over transformers (when it ran) and the goals met."""
    rows = by_variant(record)
    ours, base = rows.get("packtrain", {}), rows.get("transformers_packed", {})
    if ours.get("real_tokens_per_s") and base.get("real_tokens_per_s"):
        record.extra["speedup_vs_transformers"] = ours["real_tokens_per_s"] / base["real_tokens_per_s"]
    if ours.get("real_tokens_per_s"):
        err = ours.get("planner_error")
        record.goal_met = {"useful_mfu": (ours.get("useful_mfu") or 0) >= GOALS["useful_mfu_min"],
                           "planner": err is not None and abs(err) <= GOALS["planner_error_max"],
                           "complete": not ours.get("cut")}


def print_table(record: Record) -> None:
    dash = workload.dash

    def cells(name: str, r: dict) -> str:
        peak = r.get("steady_peak_alloc_gib") or r.get("peak_alloc_gib")
        return (f"{r['real_tokens_per_s'] or 0:>10,.0f} {r.get('useful_mfu') or 0:>10.3f} "
                f"{dash(r.get('useful_mfu_causal'), '.3f'):>10} {dash(peak):>8} "
                f"{dash(r.get('planner_peak_alloc_gib')):>11} {dash(r.get('planner_error'), '+.1%'):>6} "
                f"{r.get('final_loss') or 0:>7.3f}")

    workload.print_rows(by_variant(record), VARIANTS, f"{'variant':<20} {'real tok/s':>10} {'useful MFU':>10} "
                        f"{'causal MFU':>10} {'peak GiB':>8} {'planner GiB':>11} {'err':>6} {'loss':>7}", 20, cells)
    d = record.extra["data"]
    print(f"budget {record.settings['budget']}, docs p50 {d['p50']:.0f} p90 {d['p90']:.0f} max {d['max']}, "
          f"Σs²/Σs {d['sum_sq_over_sum']:.0f}; speed-up {record.extra.get('speedup_vs_transformers', '-')}; "
          f"goals {record.goal_met}")
