"""`packtrain pack [--tokens DIR] [--out DIR]`: bin-pack the token store into fixed token budgets.

`packtrain pack --verify DIR` checks an existing pack output (DIR/train, DIR/eval, or one split directory):
every file's crc32, shapes, offsets and the budget; exit 3 naming the first corrupt file.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", default=None, metavar="DIR",
                        help="token store written by `packtrain tokenize` (default: <workdir>/tokenize)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output directory for train/, eval/ and pack_result.json (default: <workdir>/pack)")
    parser.add_argument("--verify", default=None, metavar="DIR",
                        help="only check an existing pack output (checksums, shapes, budget) and exit")


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


def verify(path: str) -> str:
    from pathlib import Path

    from packtrain.errors import MissingDataError
    from packtrain.packing.store import PackStore

    root = Path(path)
    splits = [root / s for s in ("train", "eval") if (root / s).is_dir()] or [root]
    if not root.is_dir():
        raise MissingDataError(f"pack output {root} does not exist")
    parts = []
    for split in splits:
        st = PackStore.open(split, verify=True)
        parts.append(f"{split.name}: {st.n_packs:,} packs, {len(st.tokens):,} tokens, budget {st.budget:,}")
    return f"ok: {root}: " + "; ".join(parts)


def run(cfg, args) -> int:
    from packtrain.stages.pack import run_pack

    if args.verify:
        print(verify(args.verify))
        return 0

    print(summarize(run_pack(cfg, args.tokens, args.out).to_dict()))
    return 0
