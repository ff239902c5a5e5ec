"""FP8 vs bf16 on one H200 at ~3B parameters (Llama-3.2-3B shape): same seed, same data, both compiled.

    python bench/fp8_bench.py --out bench/results/fp8_bench_3b.json      # H200, ~6-7 min (2 × 200 steps)
    python bench/fp8_bench.py --tiny                                     # CPU: bf16 runs, fp8 refused → recorded
    bash bench/gpu_session.sh fp8                                        # the lead's call

Model: the Llama-3.2-3B shape, random init — hidden 3072, 28 layers, 24 heads, 8 KV heads (GQA), intermediate
8192, vocabulary 128,256, tied embeddings, RoPE θ 5e5: 3.21B parameters (2.82B outside the embedding), the "3B
shape" of DESIGN.md's FP8 probe (`--vocab 32768` gives the 2.92B variant whose bf16 LM head is 4× smaller). Settings from
recipes/1b-h200.yaml (bf16 autocast over fp32 master weights, varlen attention, per-layer torch.compile, Liger
fused loss, fused AdamW, lr 3e-4, no activation checkpointing) with the shape above; 8 packs × 2048 tokens a step (16,384 tokens, ~0.5 s at bf16), 200 optimizer steps per precision.

Data: lognormal lengths (median 300, σ 1, clipped to [16, 2048]: the anchors' distribution) of a Markov chain
over the first 32,768 ids (--data-vocab; the LM head still has 128,256 outputs), so the loss falls well below
ln V within 200 steps and a 1% difference means something. Both runs read the same packs in the same order.

Variants, in this order: bf16 (`train.precision=bf16`), fp8 (`train.precision=fp8 train.fp8.recipe=tensorwise`,
torchao float8 training on the decoder's linears: packtrain.train.fp8). Reported: real tok/s (the meter's
steady-state median after --warmup steps), useful MFU (fp8: FP8 peak = 2 × bf16 peak for the converted linears,
bf16 for the rest — packtrain.telemetry.mfu), the steps' peak memory, loss curves; the tok/s ratio (goal ≥ 1.25)
and the relative difference of the mean of the last 10 losses (goal ≤ 1%). On a machine without FP8 tensor cores
(--tiny on the CPU) the fp8 row is packtrain's refusal (ConfigError), recorded, and the script exits 0.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _issue19 as common  # noqa: E402
import _issue19_tables as tables  # noqa: E402
import numpy as np  # noqa: E402

SHAPE_3B = {"hidden_size": 3072, "intermediate_size": 8192, "num_layers": 28, "num_heads": 24, "num_kv_heads": 8,
            "rope_theta": 500000.0, "tie_word_embeddings": True, "max_position_embeddings": 8192}
VOCAB_3B = 128_256
ROWS = ("bf16", "fp8", "fp8_tensorwise", "fp8_rowwise")
GOALS = {"tok_s_ratio_min": 1.25, "loss_tail_rel_diff_max": 0.01, "steps_min": 200}


def overrides(args, row: str) -> list[str]:
    """The recipe overrides of one row — bf16, fp8 (--fp8-recipe), fp8_tensorwise or fp8_rowwise: the shape, the
    step, the precision (all else identical)."""
    precision, _, recipe = row.partition("_")
    ov = [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in SHAPE_3B.items()]
    ov += [f"pack.budget={args.budget}", f"train.rows={args.rows}", f"train.seed={args.seed}",
           f"train.lr={args.lr}", f"telemetry.peak_tflops={args.peak_tflops}", "telemetry.interval_s=0.2",
           f"train.precision={precision}"]
    if precision == "fp8":
        ov.append(f"train.fp8.recipe={recipe or args.fp8_recipe}")
    if args.tiny:
        ov += common.TINY_MODEL + common.TINY_TRAIN + ["model.max_position_embeddings=1024"]
    return ov + list(args.packtrain_set)


def run_row(precision: str, tokens_dir: Path, packs_dir: Path, tmp: Path, args, vocab: int) -> dict:
    cfg = common.load_recipe("1b-h200", overrides(args, precision))
    return common.run_packtrain(cfg, tokens_dir, packs_dir, tmp / f"out-{precision}", args.steps, args.warmup,
                                vocab)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps per precision (default 200, the goal's minimum; --tiny: 6)")
    p.add_argument("--warmup", type=int, default=10, help="steps the meter leaves out (compile happens here)")
    p.add_argument("--rows", type=int, default=8, help="packs per step (8 × 2048: ~0.5 s a step in bf16)")
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--fp8-recipe", default="tensorwise", choices=["tensorwise", "rowwise"])
    p.add_argument("--variants", default="bf16,fp8",
                   help="comma-separated rows, in this order: bf16, fp8 (--fp8-recipe), fp8_tensorwise, fp8_rowwise")
    p.add_argument("--vocab", type=int, default=VOCAB_3B,
                   help="the model's vocabulary: 128,256 (Llama-3.2-3B, 3.21B params) or 32,768 (2.92B; the LM head, "
                        "which stays bf16, is then 4× smaller)")
    p.add_argument("--data-vocab", type=int, default=32768, help="ids the documents use (≤ --vocab)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 peak; FP8's is 2× (packtrain.telemetry)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--packtrain-set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--tiny", action="store_true", help="CPU check: tiny model, budget 256, 6 steps, no compile")
    p.add_argument("--out", default=None, help="default bench/results/fp8_bench_3b.json (--tiny: a temp file)")
    args = p.parse_args(argv)
    args.steps = args.steps or (6 if args.tiny else 200)
    args.names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [n for n in args.names if n not in ROWS]
    if bad:
        p.error(f"--variants: {bad} not in {ROWS}")
    if args.tiny:
        args.warmup, args.rows, args.budget, args.data_vocab = 2, 2, 256, 500
    elif args.data_vocab > args.vocab:
        p.error(f"--data-vocab {args.data_vocab} > --vocab {args.vocab}: documents must fit the vocabulary")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    t_start = time.perf_counter()
    vocab = 512 if args.tiny else args.vocab
    out = Path(args.out or (Path(tempfile.mkdtemp(prefix="fp8-tiny-")) / "fp8_bench_tiny.json" if args.tiny
                            else "bench/results/fp8_bench_3b.json"))
    rng = np.random.default_rng(args.seed)
    need = int(args.steps * args.rows * args.budget * 1.1)
    lengths = common.lengths_for_tokens(
        lambda n: np.clip(np.round(rng.lognormal(np.log(300 * args.budget / 2048), 1.0, n)), 16, args.budget
                          ).astype(np.int64), need)
    docs, gen_s = common.timed(common.markov_docs, lengths, args.data_vocab, args.seed)
    record = {"bench": "fp8", "issue": 19, "command": common.command_line(argv),
              "machine": common.environment(args.peak_tflops),
              "settings": {"recipe": "1b-h200", "shape": "tiny" if args.tiny else {**SHAPE_3B, "vocab": vocab},
                           "params": None if args.tiny else f"{(2_818_747_392 + 3072 * vocab) / 1e9:.2f}B "
                                     f"(2.82B non-embedding, tied embedding of {vocab:,}), Llama-3.2-3B shape",
                           "budget": args.budget, "rows": args.rows, "tokens_per_step": args.rows * args.budget,
                           "steps": args.steps, "warmup": args.warmup, "fp8_recipe": args.fp8_recipe,
                           "data_vocab": args.data_vocab, "lr": args.lr, "seed": args.seed, "tiny": args.tiny,
                           "overrides": {p: overrides(args, p) for p in args.names}},
              "data": {**common.length_summary(lengths), "generate_s": gen_s}, "goals": GOALS}
    with tempfile.TemporaryDirectory(prefix="fp8-bench-") as tmp:
        tmp = Path(tmp)
        pack_cfg = common.load_recipe("1b-h200", overrides(args, "bf16")).pack
        tokens_dir, packs_dir, stats = common.write_inputs(tmp, docs, vocab, pack_cfg)
        record["pack"] = {"fill": stats["fill"], "n_packs": stats["n_packs"]}
        common.run_variants(record, out, args.names,
                            lambda p: run_row(p, tokens_dir, packs_dir, tmp, args, vocab))
    fp8_rows = [n for n in args.names if n != "bf16" and record.get(n, {}).get("loss_curve")]
    if record.get("bf16", {}).get("loss_curve") and fp8_rows:   # the first fp8 row is the headline
        record["comparisons"] = {n: common.compare_curves(record["bf16"], record[n]) for n in fp8_rows}
        record["headline_row"] = fp8_rows[0]
        cmp = record["comparison"] = record["comparisons"][fp8_rows[0]]
        record["goal_met"] = {"speedup": (cmp.get("tok_s_ratio") or 0) >= GOALS["tok_s_ratio_min"],
                              "loss": cmp.get("loss_tail_rel_diff") is not None
                                      and cmp["loss_tail_rel_diff"] <= GOALS["loss_tail_rel_diff_max"],
                              "steps": cmp.get("steps_compared", 0) >= GOALS["steps_min"]}
    refused = [record[n]["error"] for n in args.names if record.get(n, {}).get("refused")]
    if refused:
        record["skipped"] = f"fp8 refused on this machine: {refused[0]}"
    return tables.finish_record(record, out, t_start, print_table)


def print_table(record: dict, out: Path) -> None:
    def cells(name: str, r: dict) -> str:
        return (f"{r['real_tokens_per_s'] or 0:>10,.0f} {r.get('useful_mfu') or 0:>10.3f} "
                f"{tables.dash(r.get('steady_peak_alloc_gib')):>8} {tables.dash(r.get('planner_peak_alloc_gib')):>8} "
                f"{r.get('first_loss') or 0:>10.3f} "
                f"{common.loss_tail_mean(r['loss_curve']) or 0:>11.4f} {r.get('compiles')!s:>8}")

    tables.print_rows(record, ROWS, f"{'precision':<10} {'real tok/s':>10} {'useful MFU':>10} {'peak GiB':>8} "
                      f"{'plan GiB':>8} {'loss first':>10} {'loss tail10':>11} {'compiles':>8}", 10, cells,
                      show_refused=True)
    c = record.get("comparison", {})
    print(f"fp8/bf16 tok/s {c.get('tok_s_ratio', '-')}, loss tail rel diff {c.get('loss_tail_rel_diff', '-')}, "
          f"max |Δloss| {c.get('loss_max_abs_diff', '-')}; goals {record.get('goal_met', record.get('skipped'))}; "
          f"JSON {out}")


if __name__ == "__main__":
    main()
