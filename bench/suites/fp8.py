"""FP8 vs bf16 on one H200 at ~3B parameters (Llama-3.2-3B shape): same seed, same data, both compiled.

    python -m bench fp8 --out bench/results/fp8_bench_3b.json     # H200, ~6-7 min (2 × 200 steps)
    python -m bench fp8 --smoke --out /tmp/fp8                    # CPU: bf16 runs, fp8 refused → recorded

Model: the Llama-3.2-3B shape, random init — hidden 3072, 28 layers, 24 heads, 8 KV heads (GQA), intermediate
8192, vocabulary 128,256, tied embeddings, RoPE θ 5e5: 3.21B parameters (2.82B outside the embedding)
(`--vocab 32768` gives the 2.92B variant whose bf16 LM head is 4× smaller). Settings from recipes/1b-h200.yaml
(bf16 autocast over fp32 master weights, varlen attention, per-layer torch.compile, Liger fused loss, fused AdamW,
lr 3e-4, no activation checkpointing) with the shape above; 8 packs × 2048 tokens a step (16,384 tokens, ~0.5 s
at bf16), 200 optimizer steps per precision.

Data: lognormal lengths (median 300, σ 1, clipped to [16, 2048]: the anchors' distribution) of a Markov chain
over the first 32,768 ids (--data-vocab; the LM head still has 128,256 outputs), so the loss falls well below
ln V within 200 steps and a 1% difference means something. Both runs read the same packs in the same order.

Variants, in this order: bf16 (`train.precision=bf16`), fp8 (`train.precision=fp8 train.fp8.recipe=tensorwise`,
torchao float8 training on the decoder's linears: packtrain.train.fp8). Reported: real tok/s (the meter's
steady-state median after --warmup steps), useful MFU (fp8: FP8 peak = 2 × bf16 peak for the converted linears,
bf16 for the rest — packtrain.telemetry.mfu), the steps' peak memory, loss curves; the tok/s ratio (goal ≥ 1.25)
and the relative difference of the mean of the last 10 losses (goal ≤ 1%). On a machine without FP8 tensor cores
(--smoke on the CPU) the fp8 row is packtrain's refusal (ConfigError), recorded, and the suite exits 0.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench import workload
from bench.harness import Record, machine_info, timed
from bench.packtrain_runs import by_variant, run_packtrain, run_variants

SUMMARY = "FP8 (torchao float8) vs bf16 at a 3B shape: tok/s ratio and loss curves, same seed and packs"
DEVICE = "gpu"
SHAPE_3B = {"hidden_size": 3072, "intermediate_size": 8192, "num_layers": 28, "num_heads": 24, "num_kv_heads": 8,
            "rope_theta": 500000.0, "tie_word_embeddings": True, "max_position_embeddings": 8192}
VOCAB_3B = 128_256
ROWS = ("bf16", "fp8", "fp8_tensorwise", "fp8_rowwise", "fp8_nomix")
INDUCTOR = {"fp8_nomix": {"triton.mix_order_reduction": False}}
"""Rows that run with inductor options changed (torch._inductor.config.patch for that row only). fp8_nomix:
tensorwise FP8 without inductor's mix-order reductions, which the last profile suspected of fusing each layer's
RMSNorm backward with the transposed e4m3 cast into one slow kernel on the (1, T) varlen layout."""
GOALS = {"tok_s_ratio_min": 1.25, "loss_tail_rel_diff_max": 0.01, "steps_min": 200}


def add_arguments(p) -> None:
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps per precision (default 200, the goal's minimum; --smoke: 3)")
    p.add_argument("--warmup", type=int, default=10, help="steps the meter leaves out (compile happens here)")
    p.add_argument("--rows", default="8",
                   help="packs per step (8 × 2048: ~0.5 s a step in bf16 on an H200), or 'auto': the most rows at "
                        "which the bf16 row fits the card at hand (the planner's train.rows=auto on the bf16 "
                        "overrides); every row then runs at that size, so bf16 and FP8 compare at one shape")
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--fp8-recipe", default="tensorwise", choices=["tensorwise", "rowwise"])
    p.add_argument("--variants", default="bf16,fp8",
                   help="comma-separated rows, in this order: bf16, fp8 (--fp8-recipe), fp8_tensorwise, fp8_rowwise, "
                        "fp8_nomix (tensorwise, inductor's mix-order reduction off)")
    p.add_argument("--vocab", type=int, default=VOCAB_3B,
                   help="the model's vocabulary: 128,256 (Llama-3.2-3B, 3.21B params) or 32,768 (2.92B; the LM head, "
                        "which stays bf16, is then 4× smaller)")
    p.add_argument("--data-vocab", type=int, default=32768, help="ids the documents use (≤ --vocab)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 peak; FP8's is 2× (packtrain.telemetry)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--packtrain-set", action="append", default=[], metavar="KEY=VALUE")


def overrides(args, row: str) -> list[str]:
    """The recipe overrides of one row — bf16, fp8 (--fp8-recipe), fp8_tensorwise, fp8_rowwise or fp8_nomix
    (tensorwise; INDUCTOR changes its compile): the shape, the step, the precision (all else identical)."""
    precision, _, recipe = row.partition("_")
    recipe = "tensorwise" if recipe == "nomix" else recipe
    ov = [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in SHAPE_3B.items()]
    ov += [f"pack.budget={args.budget}", f"train.rows={args.rows}", f"train.seed={args.seed}",
           f"train.lr={args.lr}", f"telemetry.peak_tflops={args.peak_tflops}", "telemetry.interval_s=0.2",
           f"train.precision={precision}"]
    if precision == "fp8":
        ov.append(f"train.fp8.recipe={recipe or args.fp8_recipe}")
    if args.smoke:
        ov += workload.TINY_MODEL + workload.TINY_TRAIN + ["model.max_position_embeddings=1024"]
    return ov + list(args.packtrain_set)


def resolve_rows(args) -> None:
    """--rows: an integer, or 'auto' → the planner's choice for the bf16 row on this machine's device.

    bf16 keeps a bf16 copy of every linear weight for backward (autocast's cache) where torchao's float8 linears
    keep only the fp32 parameter, so the bf16 row is the larger: the rows at which it fits fit every FP8 row too.
    args.rows_source records where the number came from (the planner's device memory and predicted peak)."""
    if args.rows != "auto":
        try:
            args.rows = int(args.rows)
        except (TypeError, ValueError):
            raise SystemExit(f"--rows {args.rows!r}: a whole number of packs per step ≥ 1, or 'auto'") from None
        if args.rows < 1:
            raise SystemExit(f"--rows {args.rows}: a whole number of packs per step ≥ 1, or 'auto'")
        args.rows_source = "--rows"
        return
    from packtrain.planner import choose_shape
    from packtrain.planner.plan import device_memory_source

    cfg = workload.load_recipe("1b-h200", overrides(args, "bf16"))   # overrides() writes train.rows=auto
    device = "cpu" if args.smoke else "cuda"
    shape = choose_shape(cfg.model, cfg.train, args.budget, cfg.plan, 512 if args.smoke else args.vocab,
                         device=device)
    gib, source = device_memory_source(cfg.plan)
    args.rows = shape.rows
    args.rows_source = (f"planner (train.rows=auto on the bf16 row): {shape.rows} rows, predicted peak "
                        f"{shape.plan.peak_gib:.1f} GiB ≤ {cfg.plan.target_fraction} × {gib:.1f} GiB ({source})"
                        if shape.plan is not None else "planner")


def _settle(args) -> list[str]:
    """Defaults that depend on --smoke; returns the variant names (SystemExit naming a bad one)."""
    args.steps = args.steps or (3 if args.smoke else 200)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [n for n in names if n not in ROWS]
    if bad:
        raise SystemExit(f"--variants: {bad} not in {ROWS}")
    if args.smoke:
        args.warmup, args.budget, args.data_vocab = 1, 256, 500
        args.rows = "2" if args.rows == "8" else args.rows
    elif args.data_vocab > args.vocab:
        raise SystemExit(f"--data-vocab {args.data_vocab} > --vocab {args.vocab}: documents must fit the vocabulary")
    resolve_rows(args)
    return names


def run(args, out: Path) -> Record:
    import numpy as np

    names = _settle(args)
    vocab = 512 if args.smoke else args.vocab
    rng = np.random.default_rng(args.seed)
    need = int(args.steps * args.rows * args.budget * 1.1)
    lengths = workload.lengths_for_tokens(
        lambda n: np.clip(np.round(rng.lognormal(np.log(300 * args.budget / 2048), 1.0, n)), 16, args.budget
                          ).astype(np.int64), need)
    docs, gen_s = timed(workload.markov_docs, lengths, args.data_vocab, args.seed)
    record = Record(
        suite="fp8", study="FP8 vs bf16 at 3B", command=args.command, machine=machine_info(args.peak_tflops),
        settings={"recipe": "1b-h200", "shape": "smoke" if args.smoke else {**SHAPE_3B, "vocab": vocab},
                  "params": None if args.smoke else f"{(2_818_747_392 + 3072 * vocab) / 1e9:.2f}B "
                  f"(2.82B non-embedding, tied embedding of {vocab:,}), Llama-3.2-3B shape",
                  "budget": args.budget, "rows": args.rows, "rows_source": args.rows_source,
                  "tokens_per_step": args.rows * args.budget,
                  "steps": args.steps, "warmup": args.warmup, "fp8_recipe": args.fp8_recipe,
                  "data_vocab": args.data_vocab, "lr": args.lr, "seed": args.seed,
                  "overrides": {p: overrides(args, p) for p in names},
                  "inductor": {p: INDUCTOR[p] for p in names if p in INDUCTOR}},
        goals=GOALS, extra={"data": {**workload.length_summary(lengths), "generate_s": gen_s}})
    with tempfile.TemporaryDirectory(prefix="fp8-bench-") as tmp:
        tmp = Path(tmp)
        pack_cfg = workload.load_recipe("1b-h200", overrides(args, "bf16")).pack
        tokens_dir, packs_dir, stats = workload.write_inputs(tmp, docs, vocab, pack_cfg)
        record.extra["pack"] = {"fill": stats["fill"], "n_packs": stats["n_packs"]}

        def one(precision: str) -> dict:
            import contextlib

            import torch._inductor.config as inductor

            cfg = workload.load_recipe("1b-h200", overrides(args, precision))
            patch = INDUCTOR.get(precision)
            with inductor.patch(patch) if patch else contextlib.nullcontext():
                row = run_packtrain(cfg, tokens_dir, packs_dir, tmp / f"out-{precision}", args.steps, args.warmup,
                                    vocab)
            return {**row, "inductor": patch} if patch else row

        run_variants(record, args.record_path, names, one)
    rows = by_variant(record)
    fp8_rows = [n for n in names if n != "bf16" and rows.get(n, {}).get("loss_curve")]
    if rows.get("bf16", {}).get("loss_curve") and fp8_rows:   # the first fp8 row is the headline
        record.extra["comparisons"] = {n: workload.compare_curves(rows["bf16"], rows[n]) for n in fp8_rows}
        record.extra["headline_row"] = fp8_rows[0]
        cmp = record.extra["comparison"] = record.extra["comparisons"][fp8_rows[0]]
        record.goal_met = {"speedup": (cmp.get("tok_s_ratio") or 0) >= GOALS["tok_s_ratio_min"],
                           "loss": cmp.get("loss_tail_rel_diff") is not None
                           and cmp["loss_tail_rel_diff"] <= GOALS["loss_tail_rel_diff_max"],
                           "steps": cmp.get("steps_compared", 0) >= GOALS["steps_min"]}
    refused = [rows[n]["error"] for n in names if rows.get(n, {}).get("refused")]
    if refused:
        record.extra["skipped"] = f"fp8 refused on this machine: {refused[0]}"
    print_table(record)
    return record


def print_table(record: Record) -> None:
    def cells(name: str, r: dict) -> str:
        return (f"{r['real_tokens_per_s'] or 0:>10,.0f} {r.get('useful_mfu') or 0:>10.3f} "
                f"{workload.dash(r.get('steady_peak_alloc_gib')):>8} "
                f"{workload.dash(r.get('planner_peak_alloc_gib')):>8} {r.get('first_loss') or 0:>10.3f} "
                f"{workload.loss_tail_mean(r['loss_curve']) or 0:>11.4f} {r.get('compiles')!s:>8}")

    workload.print_rows(by_variant(record), ROWS, f"{'precision':<10} {'real tok/s':>10} {'useful MFU':>10} "
                        f"{'peak GiB':>8} {'plan GiB':>8} {'loss first':>10} {'loss tail10':>11} {'compiles':>8}",
                        10, cells, show_refused=True)
    c = record.extra.get("comparison", {})
    print(f"fp8/bf16 tok/s {c.get('tok_s_ratio', '-')}, loss tail rel diff {c.get('loss_tail_rel_diff', '-')}, "
          f"max |Δloss| {c.get('loss_max_abs_diff', '-')}; goals {record.goal_met or record.extra.get('skipped')}")
