"""`packtrain pack [--tokens DIR] [--out DIR]`: bin-pack the token store into fixed token budgets."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", default=None, metavar="DIR",
                        help="token store written by `packtrain tokenize` (default: <workdir>/tokenize)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output directory for train/, eval/ and pack_stats.json (default: <workdir>/pack)")


def summarize(d: dict) -> str:
    t, e = d["train"], d["eval"]
    return (
        f"pack ({d['strategy']}, budget {d['budget']:,}): train {t['n_docs']:,} docs → {t['n_packs']:,} packs, "
        f"fill {t['fill']:.4%} ({t['fill_vs_bound']:.4%} of the best possible: lower bound "
        f"{t['l2_bound_packs']:,} packs), padding {t['padding_tokens']:,} tokens, "
        f"{t['docs_per_pack_mean']:.1f} docs/pack (max {t['docs_per_pack_max']}), "
        f"{t['split_docs']:,} long docs split, {t['truncated_tokens']:,} tokens truncated, "
        f"{t['dropped_short_docs']:,} short docs dropped; eval {e['n_docs']:,} docs → {e['n_packs']:,} packs "
        f"(fill {e['fill']:.4%}). {d['seconds']:.2f} s → {d['output']}")


def run(cfg, args) -> int:
    from packtrain.stages.pack import run_pack

    print(summarize(run_pack(cfg, args.tokens, args.out)))
    return 0
