"""Pack document lengths and check the result: one JSON line per call.

    python bench/pack_speed.py --lengths FILE.npy --budget 2048 [--strategy bfd|ffd|sequential]
    {"n_docs": 1000000, "budget": 2048, "strategy": "bfd", "fill": 0.99997, "seconds": 0.61,
     "max_pack_tokens": 2048, "n_packs": 226024}

FILE.npy holds a 1-D integer array of document lengths (≥ 1; longer than the budget is fine: split).
`seconds` times `pack_lengths` alone (not loading or checking). The check: every token of every document
lands in exactly one pack, in order, and no pack exceeds the budget; a failed check exits 1, bad input 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def check_plan(plan, lengths: np.ndarray, budget: int) -> str | None:
    """None if every document is covered exactly once, contiguously, and no pack exceeds the budget."""
    if plan.n_packs and plan.pack_tokens().max() > budget:
        return f"a pack holds {int(plan.pack_tokens().max())} tokens > budget {budget}"
    order = np.lexsort((plan.seg_start, plan.seg_doc))
    doc, start, ln = plan.seg_doc[order], plan.seg_start[order], plan.seg_len[order]
    covered = np.bincount(doc, weights=ln, minlength=len(lengths)).astype(np.int64)
    if not np.array_equal(covered, lengths):
        bad = int(np.flatnonzero(covered != lengths)[0])
        return f"document {bad} has {int(covered[bad])} packed tokens, expected {int(lengths[bad])}"
    same = doc[1:] == doc[:-1]
    if not np.array_equal(start[1:][same], (start[:-1] + ln[:-1])[same]):
        return "a document's segments overlap or leave a hole"
    first = np.ones(len(doc), bool)
    first[1:] = ~same
    if (start[first] != 0).any():
        return "a document's first segment does not start at token 0"
    return None


def run_one(lengths: np.ndarray, budget: int, strategy: str = "bfd", window: int = 200_000) -> dict:
    from packtrain.packing.plan import pack_lengths

    t0 = time.perf_counter()
    plan = pack_lengths(lengths, budget, strategy, window=window)
    seconds = time.perf_counter() - t0
    problem = check_plan(plan, lengths, budget)
    if problem:
        raise AssertionError(f"{strategy} at budget {budget}: {problem}")
    return {"n_docs": int(len(lengths)), "budget": budget, "strategy": strategy, "fill": round(plan.fill, 6),
            "seconds": round(seconds, 3), "max_pack_tokens": int(plan.pack_tokens().max()) if plan.n_packs else 0,
            "n_packs": plan.n_packs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", required=True, type=Path, help=".npy file: 1-D integer array of document lengths")
    p.add_argument("--budget", required=True, type=int, help="tokens per pack (≥ 2)")
    p.add_argument("--strategy", default="bfd", choices=["bfd", "ffd", "sequential"])
    args = p.parse_args(argv)
    try:
        lengths = np.load(args.lengths, allow_pickle=False)
    except (OSError, ValueError) as e:
        print(f"error: cannot read {args.lengths}: {e}", file=sys.stderr)
        return 2
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or (lengths.size and lengths.min() < 1):
        print(f"error: {args.lengths}: need a 1-D integer array of lengths ≥ 1, got shape {lengths.shape} "
              f"dtype {lengths.dtype}", file=sys.stderr)
        return 2
    if args.budget < 2:
        print(f"error: --budget {args.budget}: must be ≥ 2", file=sys.stderr)
        return 2
    try:
        row = run_one(lengths.astype(np.int64), args.budget, args.strategy)
    except AssertionError as e:
        print(f"error: check failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
