"""FSDP2 vs the torch engine on one H200 at 1B: same recipe, seed and data, both compiled; speed and loss curve.

    python -m bench fsdp2 --out bench/results/fsdp2_bench_1b.json     # H200, ~3-4 min (3 runs × 100 steps)
    python -m bench fsdp2 --smoke --out /tmp/fsdp2                    # CPU (gloo, 1 rank)

Model and settings: recipes/1b-h200.yaml as is (a ~1B Llama, bf16 autocast over fp32 master weights, varlen,
per-layer torch.compile, fused loss, fused AdamW, 8 packs × 2048 tokens a step, no activation checkpointing).
Data: lognormal lengths (median 300, σ 1, clipped to [16, 2048]: the anchors' distribution), Markov-chain tokens
over the 32,768-token vocabulary (the loss falls), the same packs in the same order for every row.

Rows, in this order (--variants):
  torch         train.engine=torch (one process: no wrapper)
  fsdp2         train.engine=fsdp2: fully_shard per decoder layer + the root (packtrain.train.fsdp2_engine); one
                rank, the process group is train()'s own (1 rank, nccl), reshard_after_forward auto (= false on one
                GPU), gradient reduce in fp32
  torch_repeat  the torch row again: the run-to-run spread of tok/s and loss, against which the fsdp2 difference
                is judged (a difference smaller than that spread is noise)
  fsdp2_reshard fsdp2 with train.fsdp.reshard_after_forward=true (optional: the ZeRO-3-like setting)

Reported per row: real tok/s (the meter's steady-state median after --warmup), useful MFU, the steps' peak
allocated memory, compiles/recompiles, the loss curve. Compared with the torch row: tok/s ratio (goal ≥ 0.95:
≤ 5% slower), the loss curves' max |difference| and the relative difference of their last-10 means (goal: ≤ 1e-2
relative at every step — bf16 kernels in another graph order are not bitwise); torch_repeat's differences are
recorded beside them as the noise floor (repeat_spread).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench import workload
from bench.harness import Record, machine_info, timed
from bench.packtrain_runs import by_variant, run_compared, run_packtrain

SUMMARY = "FSDP2 vs the torch engine at 1B on one GPU: tok/s ratio and loss curves, a repeat as the noise floor"
DEVICE = "gpu"
ROWS = {"torch": ["train.engine=torch"], "fsdp2": ["train.engine=fsdp2"], "torch_repeat": ["train.engine=torch"],
        "fsdp2_reshard": ["train.engine=fsdp2", "train.fsdp.reshard_after_forward=true"]}
GOALS = {"tok_s_ratio_min": 0.95, "loss_step_rel_diff_max": 1e-2}


def add_arguments(p) -> None:
    p.add_argument("--steps", type=int, default=None, help="(default 100; --smoke: 3) optimizer steps per row")
    p.add_argument("--warmup", type=int, default=10, help="steps the meter leaves out (compile happens here)")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--variants", default="torch,fsdp2,torch_repeat", help=f"comma-separated: {', '.join(ROWS)}")
    p.add_argument("--peak-tflops", type=float, default=790.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--packtrain-set", action="append", default=[], metavar="KEY=VALUE")


def overrides(args, name: str) -> list[str]:
    ov = [f"train.rows={args.rows}", f"train.seed={args.seed}", f"telemetry.peak_tflops={args.peak_tflops}",
          "telemetry.interval_s=0.2", *ROWS[name]]
    if args.smoke:
        ov += workload.TINY_MODEL + workload.TINY_TRAIN + [f"pack.budget={args.budget}"]
    return ov + list(args.packtrain_set)


def run(args, out: Path) -> Record:
    import numpy as np

    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [n for n in names if n not in ROWS]
    if bad:
        raise SystemExit(f"--variants: {bad} not in {list(ROWS)}")
    args.budget = 2048
    if args.smoke:
        args.warmup, args.rows, args.budget = 1, 2, 256
        names = [n for n in names if n != "torch_repeat"]
    args.steps = args.steps or (3 if args.smoke else 100)
    cfg0 = workload.load_recipe("1b-h200", overrides(args, "torch"))
    vocab = 512 if args.smoke else cfg0.tokenize.vocab_size
    budget = cfg0.pack.budget
    rng = np.random.default_rng(args.seed)
    lengths = workload.lengths_for_tokens(
        lambda n: np.clip(np.round(rng.lognormal(np.log(300 * budget / 2048), 1.0, n)), 16, budget
                          ).astype(np.int64), int(args.steps * args.rows * budget * 1.1))
    docs, gen_s = timed(workload.markov_docs, lengths, vocab, args.seed)
    record = Record(
        suite="fsdp2", study="FSDP2 vs the torch engine, 1B on one GPU", command=args.command,
        machine=machine_info(args.peak_tflops), goals=GOALS,
        settings={"recipe": "1b-h200", "budget": budget, "rows": args.rows, "steps": args.steps,
                  "warmup": args.warmup, "vocab": vocab, "seed": args.seed, "compile": cfg0.train.compile,
                  "precision": cfg0.train.precision, "attention": cfg0.train.attention, "loss": cfg0.train.loss,
                  "model": cfg0.model.model_dump(mode="json"), "overrides": {n: overrides(args, n) for n in names}},
        extra={"data": {**workload.length_summary(lengths), "generate_s": gen_s}})
    with tempfile.TemporaryDirectory(prefix="fsdp2-bench-") as tmp:
        tmp = Path(tmp)
        tokens_dir, packs_dir, stats = workload.write_inputs(tmp, docs, vocab, cfg0.pack)
        record.extra["pack"] = {"fill": stats["fill"], "n_packs": stats["n_packs"]}

        def one(name: str) -> dict:
            cfg = workload.load_recipe("1b-h200", overrides(args, name))
            return run_packtrain(cfg, tokens_dir, packs_dir, tmp / f"out-{name}", args.steps, args.warmup, vocab)

        return run_compared(record, args.record_path, names, one, compare, print_table)


def compare(record: Record) -> None:
    """Each row against the torch row; the fsdp2 verdict against GOALS and the torch_repeat spread."""
    rows = by_variant(record)
    base = rows.get("torch", {})
    if not base.get("loss_curve"):
        return
    cmp = {name: workload.compare_curves(base, r) for name, r in rows.items()
           if name != "torch" and r.get("loss_curve")}
    record.extra["comparison"] = cmp
    f = cmp.get("fsdp2")
    if f:
        rep = cmp.get("torch_repeat", {})
        record.goal_met = {"speed": (f.get("tok_s_ratio") or 0) >= GOALS["tok_s_ratio_min"],
                           "loss": f["loss_step_rel_diff_max"] <= GOALS["loss_step_rel_diff_max"],
                           "complete": not any(rows.get(n, {}).get("cut") for n in ("torch", "fsdp2"))}
        if rep:   # the noise floor: the same torch run twice (informational, not a goal)
            record.extra["repeat_spread"] = {
                "tok_s_ratio": rep.get("tok_s_ratio"), "loss_max_abs_diff": rep.get("loss_max_abs_diff"),
                "fsdp2_loss_diff_over_repeat": (f["loss_max_abs_diff"] / rep["loss_max_abs_diff"]
                                                if rep.get("loss_max_abs_diff") else None)}


def print_table(record: Record) -> None:
    cmp = record.extra.get("comparison", {})
    dash = workload.dash

    def cells(name: str, r: dict) -> str:
        c = cmp.get(name, {})
        return (f"{r['real_tokens_per_s'] or 0:>10,.0f} {dash(c.get('tok_s_ratio'), '.3f'):>8} "
                f"{r.get('useful_mfu') or 0:>10.3f} {dash(r.get('steady_peak_alloc_gib')):>8} "
                f"{dash(r.get('planner_peak_alloc_gib')):>8} {r.get('compiles')!s:>8} "
                f"{dash(c.get('loss_max_abs_diff'), '.2e'):>10} {dash(c.get('loss_tail_rel_diff'), '.2e'):>9}")

    workload.print_rows(by_variant(record), ROWS, f"{'row':<14} {'real tok/s':>10} {'vs torch':>8} "
                        f"{'useful MFU':>10} {'peak GiB':>8} {'plan GiB':>8} {'compiles':>8} {'max|Δloss|':>10} "
                        f"{'tail rel':>9}", 14, cells)
    print(f"goals {record.goal_met}; repeat spread {record.extra.get('repeat_spread')}")
