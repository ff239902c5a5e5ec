"""FP8 vs bf16 at ~3B parameters (Llama-3.2-3B shape) as a user would run it: one shape for both, chosen by the
memory planner for the card at hand; same seed, same packs, both compiled.

    python -m bench fp8 --out bench/results/fp8_bench_3b_h100.json   # one H100: ~5 min (3 variants × 200 steps)
    python -m bench fp8 --smoke --out /tmp/fp8                        # CPU: bf16 + its repeat, fp8 refused → recorded

Model: the Llama-3.2-3B shape, random init — hidden 3072, 28 layers, 24 heads, 8 KV heads (GQA), intermediate
8192, vocabulary 128,256, tied embeddings, RoPE θ 5e5: 3.21B parameters (2.82B outside the embedding)
(`--vocab 32768` gives the 2.92B variant whose bf16 LM head is 4× smaller). Settings from recipes/1b-h200.yaml
(bf16 autocast over fp32 master weights, varlen attention, per-layer torch.compile, Liger fused loss, fused AdamW,
lr 3e-4) with the shape above; packs of 2048 tokens, 200 optimizer steps per variant (the goal's minimum).

The shape (rows per step and activation checkpointing), the same for every variant (bench/shared_shape.py):
the planner predicts each variant's peak (`packtrain plan`'s "= predicted peak": fp8 without the bf16 copies of
the decoder's weights that bf16 autocast keeps) with T = plan.target_fraction (0.85) × this device's memory
(train.rows=auto's target; on the CPU of --smoke, the planner's 80 GiB default). Least recomputation first —
none, then selective, then full — the first mode at which some rows fit EVERY variant, then the most such rows
≤ --max-rows (8). bf16 is the larger, so its peak binds: on an H100 80 GB (T 67.3 GiB) that is 3 rows without
recomputation (bf16 planned 63.7 GiB, measured 61.4 in fp8_bench_3b_h100.json; at 6 and 8 rows it ran out of
memory); on an H200 (T 118.8 GiB) the cap, 8 rows. `--rows N` / `--ac MODE` fix either instead (with --ac auto
and --rows N: the least recomputation at which N rows fit every variant). How the choice was made, and the
peaks at one row more, are in the record's settings.shape_choice.

Data: lognormal lengths (median 300, σ 1, clipped to [16, 2048]: the anchors' distribution) of a Markov chain
over the first 32,768 ids (--data-vocab; the LM head still has 128,256 outputs), so the loss falls well below
ln V within 200 steps and a 1% difference means something. Every variant reads the same packs in the same order.

Variants, in this order (--variants; default bf16,fp8,fp8_nomix): bf16 (`train.precision=bf16`), fp8
(`train.precision=fp8 train.fp8.recipe=tensorwise`, torchao float8 training on the decoder's linears:
packtrain.train.fp8), fp8_tensorwise / fp8_rowwise (that recipe), fp8_nomix (tensorwise with inductor's
mix-order reductions off for that row), bf16_repeat (bf16 again: tok/s run-to-run noise; the loss curve must repeat).
Reported per variant: real tok/s (the meter's steady-state median after --warmup steps), useful MFU (fp8: FP8 peak
= 2 × bf16 peak for the converted linears — packtrain.telemetry.mfu), the steady peak memory against the
planner's prediction, the loss curve. Per variant against bf16 (bench/fp8_compare.py; only where both ran at the
same settings, else the comparison says why it was skipped): the tok/s ratio, the per-step relative loss
difference over the last 50 steps (max, final, mean) and of the last-10 means; which FP8 variant is faster; the
goals: faster FP8 variant ≥ 1.25× bf16, every FP8 loss within 1% of bf16's over the last 50 steps, ≥ 200 steps
each, planner within ±10% of each variant's measured peak. The loss curves are drawn beside the record
(<record>.png). No end-of-run checkpoint is written (3B: 40-60 s per variant on an H100, not timed anyway).
On a machine without FP8 tensor cores (--smoke on the CPU) the fp8 rows are packtrain's refusal (ConfigError),
recorded, and the suite exits 0.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench import workload
from bench.fp8_compare import GOALS, compare_variants, plot_curves
from bench.harness import Record, machine_info, timed
from bench.packtrain_runs import by_variant, run_packtrain, run_variants
from bench.shared_shape import MODES, choose_shared_shape, planner_predictor

SUMMARY = "FP8 (torchao float8) vs bf16 at a 3B shape the planner fits: tok/s ratio and loss curves, same packs"
DEVICE = "gpu"
SHAPE_3B = {"hidden_size": 3072, "intermediate_size": 8192, "num_layers": 28, "num_heads": 24, "num_kv_heads": 8,
            "rope_theta": 500000.0, "tie_word_embeddings": True, "max_position_embeddings": 8192}
VOCAB_3B = 128_256
ROWS = ("bf16", "fp8", "fp8_tensorwise", "fp8_rowwise", "fp8_nomix", "bf16_repeat")
INDUCTOR = {"fp8_nomix": {"triton.mix_order_reduction": False}}
"""Rows that run with inductor options changed (torch._inductor.config.patch for that row only). fp8_nomix:
tensorwise FP8 without inductor's mix-order reductions, which the last profile suspected of fusing each layer's
RMSNorm backward with the transposed e4m3 cast into one slow kernel on the (1, T) varlen layout."""


def add_arguments(p) -> None:
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps per variant (default 200, the goal's minimum; --smoke: 3)")
    p.add_argument("--warmup", type=int, default=10, help="steps the meter leaves out (compile happens here)")
    p.add_argument("--rows", default="auto",
                   help="packs per step: 'auto' (default): the most rows ≤ --max-rows at which the planner says "
                        "every variant fits this device (module doc), or a whole number")
    p.add_argument("--max-rows", type=int, default=8,
                   help="the most rows 'auto' picks (8 × 2048: ~0.6 s a bf16 step on an H200)")
    p.add_argument("--ac", default="auto", choices=["auto", *MODES],
                   help="activation checkpointing of every variant: auto = the least recomputation at which the "
                        "rows fit every variant (none, then selective, then full), or that mode")
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--fp8-recipe", default="tensorwise", choices=["tensorwise", "rowwise"])
    p.add_argument("--variants", default="bf16,fp8,fp8_nomix",
                   help=f"comma-separated rows, in this order: {', '.join(ROWS)} (module doc); bf16 is the baseline")
    p.add_argument("--vocab", type=int, default=VOCAB_3B,
                   help="the model's vocabulary: 128,256 (Llama-3.2-3B, 3.21B params) or 32,768 (2.92B; the LM head, "
                        "which stays bf16, is then 4× smaller)")
    p.add_argument("--data-vocab", type=int, default=32768, help="ids the documents use (≤ --vocab)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 peak; FP8's is 2× (packtrain.telemetry)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--packtrain-set", action="append", default=[], metavar="KEY=VALUE")


def overrides(args, row: str) -> list[str]:
    """The recipe overrides of one row — bf16, bf16_repeat, fp8 (--fp8-recipe), fp8_tensorwise, fp8_rowwise or
    fp8_nomix (tensorwise; INDUCTOR changes its compile): the shape, the step, the precision (all else identical)."""
    precision, _, recipe = row.partition("_")
    recipe = {"nomix": "tensorwise", "repeat": ""}.get(recipe, recipe)
    ov = [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in SHAPE_3B.items()]
    ov += [f"pack.budget={args.budget}", f"train.rows={args.rows}", f"train.activation_checkpointing={args.ac}",
           f"train.seed={args.seed}", f"train.lr={args.lr}", f"telemetry.peak_tflops={args.peak_tflops}",
           "telemetry.interval_s=0.2", f"train.precision={precision}"]
    if precision == "fp8":
        ov.append(f"train.fp8.recipe={recipe or args.fp8_recipe}")
    if args.smoke:
        ov += workload.TINY_MODEL + workload.TINY_TRAIN + ["model.max_position_embeddings=1024"]
    return ov + list(args.packtrain_set)


def resolve_shape(args, names: list[str], vocab: int) -> dict:
    """args.rows and args.ac from the planner (module doc; bench/shared_shape.py) unless both were given;
    returns the record's settings.shape_choice (the choice, the device memory it came from, the peaks)."""
    from packtrain.errors import ConfigError
    from packtrain.planner.plan import device_memory_source

    rows = args.rows
    fixed = [int(rows)] if rows != "auto" else list(range(args.max_rows, 0, -1))
    modes = list(MODES) if args.ac == "auto" else [args.ac]
    args.rows, args.ac = fixed[0], modes[0]          # placeholders: the configs load, the planner overrides both
    cfgs = {n: workload.load_recipe("1b-h200", overrides(args, n)) for n in names}
    plan_cfg = cfgs[names[0]].plan
    gib, source = device_memory_source(plan_cfg)
    target = plan_cfg.target_fraction * gib
    device = "cpu" if args.smoke else "cuda"
    predict = planner_predictor(cfgs, args.budget, vocab, device, gib)
    how = ("--rows" if rows != "auto" else f"planner, most rows ≤ --max-rows {args.max_rows}") + ", " + (
        f"--ac {modes[0]}" if len(modes) == 1 else "least recomputation first (" + " → ".join(modes) + ")")
    where = {"how": how, "device_memory_gib": gib, "device_memory_source": source,
             "target_fraction": plan_cfg.target_fraction, "device": device}
    try:
        shape = choose_shared_shape(predict, target, modes, fixed)
    except ConfigError as e:
        if rows == "auto" or len(modes) > 1:   # the planner was asked to choose and cannot: said before any run
            raise SystemExit(f"bench fp8: {e}") from None
        # --rows N --ac MODE: run as asked (an OOM becomes that variant's error row), the planner's verdict kept
        return {**where, "activation_checkpointing": modes[0], "rows": fixed[0], "target_gib": target,
                "peaks_gib": predict(modes[0], fixed[0]), "fits": False, "description": f"as asked; {e}"}
    args.rows, args.ac = shape.rows, shape.activation_checkpointing
    return {**shape.to_dict(), **where, "fits": True}


def _settle(args) -> list[str]:
    """Defaults that depend on --smoke; returns the variant names (SystemExit naming a bad one)."""
    args.steps = args.steps or (3 if args.smoke else 200)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [n for n in names if n not in ROWS]
    if bad or "bf16" not in names:
        raise SystemExit(f"--variants: {bad or names} — each one of {ROWS}, bf16 (the baseline) among them")
    if args.rows != "auto" and (not str(args.rows).isdigit() or int(args.rows) < 1):
        raise SystemExit(f"--rows {args.rows!r}: a whole number of packs per step ≥ 1, or 'auto'")
    if args.max_rows < 1:
        raise SystemExit(f"--max-rows {args.max_rows}: at least 1")
    if args.smoke:
        args.warmup, args.budget, args.data_vocab, args.max_rows = 1, 256, 500, 2
        if args.variants == "bf16,fp8,fp8_nomix":   # the CPU refuses fp8: a bf16 repeat exercises the comparison
            names.append("bf16_repeat")
    elif args.data_vocab > args.vocab:
        raise SystemExit(f"--data-vocab {args.data_vocab} > --vocab {args.vocab}: documents must fit the vocabulary")
    return names


def run(args, out: Path) -> Record:
    import numpy as np

    names = _settle(args)
    vocab = 512 if args.smoke else args.vocab
    choice = resolve_shape(args, names, vocab)
    print(f"bench fp8: {choice['description']} ({choice['device_memory_source']}: {choice['device_memory_gib']:.3g} "
          f"GiB × {choice['target_fraction']})", flush=True)
    rng = np.random.default_rng(args.seed)
    need = int(args.steps * args.rows * args.budget * 1.1)
    lengths = workload.lengths_for_tokens(
        lambda n: np.clip(np.round(rng.lognormal(np.log(300 * args.budget / 2048), 1.0, n)), 16, args.budget
                          ).astype(np.int64), need)
    docs, gen_s = timed(workload.markov_docs, lengths, args.data_vocab, args.seed)
    record = Record(
        suite="fp8", study="FP8 vs bf16 at 3B, one planner-chosen shape", command=args.command,
        machine=machine_info(args.peak_tflops),
        settings={"recipe": "1b-h200", "shape": "smoke" if args.smoke else {**SHAPE_3B, "vocab": vocab},
                  "params": None if args.smoke else f"{(2_818_747_392 + 3072 * vocab) / 1e9:.2f}B "
                  f"(2.82B non-embedding, tied embedding of {vocab:,}), Llama-3.2-3B shape",
                  "budget": args.budget, "rows": args.rows, "activation_checkpointing": args.ac,
                  "shape_choice": choice, "rows_source": choice["description"],
                  "tokens_per_step": args.rows * args.budget, "steps": args.steps, "warmup": args.warmup,
                  "fp8_recipe": args.fp8_recipe, "data_vocab": args.data_vocab, "lr": args.lr, "seed": args.seed,
                  "overrides": {p: overrides(args, p) for p in names},
                  "inductor": {p: INDUCTOR[p] for p in names if p in INDUCTOR}},
        goals=GOALS, extra={"data": {**workload.length_summary(lengths), "generate_s": gen_s}})
    with tempfile.TemporaryDirectory(prefix="fp8-bench-") as tmp:
        tmp = Path(tmp)
        pack_cfg = workload.load_recipe("1b-h200", overrides(args, "bf16")).pack
        tokens_dir, packs_dir, stats = workload.write_inputs(tmp, docs, vocab, pack_cfg)
        record.extra["pack"] = {"fill": stats["fill"], "n_packs": stats["n_packs"]}

        def one(name: str) -> dict:
            import contextlib

            import torch._inductor.config as inductor

            cfg = workload.load_recipe("1b-h200", overrides(args, name))
            patch = INDUCTOR.get(name)
            with inductor.patch(patch) if patch else contextlib.nullcontext():
                row = run_packtrain(cfg, tokens_dir, packs_dir, tmp / f"out-{name}", args.steps, args.warmup,
                                    vocab, skip_checkpoint=True)
            return {**row, "inductor": patch} if patch else row

        run_variants(record, args.record_path, names, one)
    judge(record, names, args.record_path)
    print_table(record, names)
    return record


def judge(record: Record, names: list[str], record_path: Path) -> None:
    """Comparisons, the faster FP8 variant, planner vs measured, goal_met, and the plot beside the record."""
    rows = by_variant(record)
    comparisons, faster, record.goal_met = compare_variants(rows, names)
    record.extra["comparisons"] = comparisons
    record.extra["faster_fp8"] = faster
    if faster:   # the report's headline: the faster FP8 variant
        record.extra["headline_row"] = faster["variant"]
        record.extra["comparison"] = comparisons[faster["variant"]]
    record.extra["planner_vs_measured"] = {
        n: {"predicted_alloc_gib": r.get("planner_peak_alloc_gib"), "predicted_peak_gib": r.get("planner_peak_gib"),
            "measured_steady_alloc_gib": r.get("steady_peak_alloc_gib"), "error": r.get("planner_error")}
        for n, r in rows.items() if "error" not in r}
    failed = {n: r["error"][:300] for n, r in rows.items() if "error" in r}
    if failed:
        record.extra["failed"] = failed
    path = Path(record_path).with_suffix(".png")
    st = record.settings
    title = (f"{'smoke (tiny model, CPU)' if st['shape'] == 'smoke' else record.study}: {st['rows']} × "
             f"{st['budget']} tokens, activation checkpointing {st['activation_checkpointing']}, "
             f"{record.machine.get('device')}")
    try:
        record.extra["plot"] = plot_curves(rows, names, path, comparisons, title).name
    except Exception as e:  # noqa: BLE001 - the record stands without its picture
        record.extra["plot"] = None
        record.extra["plot_error"] = f"{type(e).__name__}: {e}"


def print_table(record: Record, names: list[str]) -> None:
    comparisons = record.extra.get("comparisons", {})

    def cells(name: str, r: dict) -> str:
        c = comparisons.get(name, {})
        return (f"{r['real_tokens_per_s'] or 0:>10,.0f} {workload.dash(c.get('tok_s_ratio'), '.3f'):>7} "
                f"{r.get('useful_mfu') or 0:>10.3f} {workload.dash(r.get('steady_peak_alloc_gib')):>8} "
                f"{workload.dash(r.get('planner_peak_alloc_gib')):>8} "
                f"{workload.dash(r.get('planner_error'), '+.1%'):>7} "
                f"{workload.loss_tail_mean(r['loss_curve']) or 0:>11.4f} "
                f"{workload.dash(c.get('loss_rel_diff_last_n_max'), '.2%'):>9}")

    workload.print_rows(by_variant(record), names, f"{'variant':<12} {'real tok/s':>10} {'× bf16':>7} "
                        f"{'useful MFU':>10} {'peak GiB':>8} {'plan GiB':>8} {'plan err':>7} {'loss tail10':>11} "
                        f"{'max Δloss':>9}", 12, cells, show_refused=True)
    for n, c in comparisons.items():
        if "skipped" in c:
            print(f"{n}: not compared — {c['skipped'][:160]}")
    f = record.extra.get("faster_fp8")
    print(f"faster FP8 variant: {f['variant']} ({f['tok_s_ratio']:.3f}× bf16)" if f else "faster FP8 variant: none "
          "measured", f"; goals {record.goal_met}; plot {record.extra.get('plot')}")
