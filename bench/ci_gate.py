"""The project's own CI gate: deterministic metrics of the tiny recipe against a committed baseline.

    python bench/ci_gate.py                                   # exit 0 pass, 1 regression, 2 missing data
    python bench/ci_gate.py --set pack.strategy=sequential    # a deliberate regression: exits 1
    python bench/ci_gate.py --write-baseline                  # regenerate bench/baselines/ci-tiny.json

Candidate metrics (no GPU, no MLflow, < 2 s):
    pack.fill, pack.padding_fraction,            packtrain.packing.bins.pack_lengths over a fixed synthetic set
    pack.n_packs                                 of 20,000 lognormal document lengths (median 180 tokens,
                                                 σ = 1.0; drawn by inverse CDF at fixed quantiles in a fixed
                                                 order, so no RNG is involved) at the recipe's pack settings;
                                                 named as docs/metrics.md names a run's pack metrics
    plan.peak_alloc_gib, plan.peak_gib           the memory planner's prediction for the recipe's step
                                                 (planned for a CUDA device of 80 GiB)
    train.tokens_per_step                        rows × budget × grad_accum × gpus (slot tokens per optimizer
                                                 step of packtrain.planner.choose_shape's shape, as train runs)
    train.real_tokens_per_step                   fill × tokens_per_step (tokens that carry loss)
Gated by bench/baselines/ci-rules.yaml (fill ≥ 0.99, padding, planned memory, tokens per step).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASELINE = HERE / "baselines" / "ci-tiny.json"
RULES = HERE / "baselines" / "ci-rules.yaml"
N_DOCS, MEDIAN, SIGMA = 20_000, 180.0, 1.0


def synthetic_lengths(n: int = N_DOCS, median: float = MEDIAN, sigma: float = SIGMA):
    """int64 [n] lognormal lengths ≥ 1: exp(ln(median) + σ·Φ⁻¹((i + ½)/n)), shuffled by i → i·7919 mod n."""
    import math
    from statistics import NormalDist

    import numpy as np

    nd = NormalDist()
    sorted_lengths = [max(1, round(math.exp(math.log(median) + sigma * nd.inv_cdf((i + 0.5) / n))))
                      for i in range(n)]
    order = [(i * 7919) % n for i in range(n)]   # 7919 is prime and coprime with n → a permutation
    return np.array([sorted_lengths[j] for j in order], dtype=np.int64)


def candidate_metrics(cfg) -> dict:
    """The deterministic metrics of recipe `cfg` (see the module docstring)."""
    from packtrain.packing.bins import pack_lengths
    from packtrain.planner import choose_shape, plan_shape

    pack = cfg.pack
    plan = pack_lengths(synthetic_lengths(), pack.budget, pack.strategy, window=pack.window,
                        overlong=pack.overlong)
    vocab = cfg.plan.vocab_size or cfg.tokenize.vocab_size
    shape = choose_shape(cfg.model, cfg.train, pack.budget, cfg.plan, vocab, device="cuda", device_memory_gib=80.0)
    mplan = plan_shape(cfg.model, cfg.train, shape, cfg.plan, vocab, device="cuda", device_memory_gib=80.0)
    tokens_per_step = shape.tokens_per_step
    return {
        "pack.fill": round(plan.fill, 6),
        "pack.padding_fraction": round(1.0 - plan.fill, 6),
        "pack.n_packs": plan.n_packs,
        "plan.peak_alloc_gib": round(mplan.peak_allocated_gib, 6),
        "plan.peak_gib": round(mplan.peak_gib, 6),
        "train.tokens_per_step": tokens_per_step,
        "train.real_tokens_per_step": round(plan.fill * tokens_per_step, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="tiny-cpu")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--baseline", default=str(BASELINE))
    ap.add_argument("--rules", default=str(RULES))
    ap.add_argument("--out", help="where candidate.json, gate.json, gate.md go (default <workdir>/ci-gate)")
    ap.add_argument("--write-baseline", action="store_true", help="write the candidate as the baseline and exit")
    args = ap.parse_args(argv)

    from packtrain.config import load_run_config
    from packtrain.errors import PacktrainError
    from packtrain.gate import gate, load_rules, load_source, write_gate_outputs
    from packtrain.publish import write_json

    try:
        cfg = load_run_config(args.recipe, args.overrides)
        metrics = candidate_metrics(cfg)
        doc = {"source": "bench/ci_gate.py", "recipe": cfg.name, "overrides": args.overrides,
               "inputs": {"n_docs": N_DOCS, "median": MEDIAN, "sigma": SIGMA, "budget": cfg.pack.budget,
                          "strategy": cfg.pack.strategy, "window": cfg.pack.window},
               "metrics": metrics}
        if args.write_baseline:
            write_json(Path(args.baseline), doc)
            print(f"baseline written: {args.baseline}")
            return 0
        out = Path(args.out) if args.out else Path(cfg.workdir) / "ci-gate"
        write_json(out / "candidate.json", doc)
        result = gate(load_source(str(out / "candidate.json")), load_source(args.baseline), load_rules(args.rules))
        write_gate_outputs(result, out)
    except PacktrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(result.table())
    print(json.dumps({"verdict": result.verdict, "out": str(out)}))
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
