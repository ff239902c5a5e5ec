"""`pack_lengths`: the bin packing of document lengths into budgets (a `PackPlan`), and the lower bounds it is judged by.

    >>> plan = pack_lengths(np.array([6, 6, 5, 4, 3, 3, 2, 1]), budget=10, strategy="bfd")
    >>> plan.to_lists()           # per pack: (doc_index, start, length)
    [[(0, 0, 6), (3, 0, 4)], [(1, 0, 6), (4, 0, 3), (7, 0, 1)], [(2, 0, 5), (5, 0, 3), (6, 0, 2)]]
    >>> plan.fill, lower_bound_packs(np.array([6, 6, 5, 4, 3, 3, 2, 1]), 10)
    (1.0, 3)

Documents longer than the budget: `split` cuts them into ⌊L/B⌋ full packs of their own plus a remainder
chunk that is packed like any document; `truncate` keeps the first B tokens and counts the rest.
bfd/mbs/ffd sort and pack `window` documents at a time (memory bounded by the window); up to window/4
documents of a window's packs (those with free space, then full packs of short documents: `carry_order`) are
reopened with the next window, so window boundaries cost almost nothing.
sequential keeps the input order.

Judge a plan by `lower_bound_packs` (the simple bound) or the tighter `l2_bound_packs` (Martello-Toth L2):
no packer can use fewer packs, so `bound / n_packs` ≥ 0.999 means within 0.1% of optimal. L2 is not tight
everywhere: on uniform lengths the LP (Gilmore-Gomory) bound of bench/lp_bound.py is up to 0.04% higher,
and the default strategy meets it on 100k uniform documents (1M: within 0.00004).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from packtrain.packing import strategies

Strategy = Literal["bfd", "mbs", "ffd", "sequential"]
EXACT_BELOW_FRACTION = 4
"""bfd: items shorter than budget / 4 close the gaps with exact-fill patterns instead of plain best fit."""


REPAIR_STRIDE = 16
"""repair_packs: every 16th pack joins the open ones as a donor of lengths."""


def repair_packs(lengths: np.ndarray, budget: int, item_bin: np.ndarray,
                 stride: int = REPAIR_STRIDE) -> np.ndarray:
    """A bounded repair pass over the emptiest packs. The packs without a document longer than B/2 that are
    not full although their longest document leaves room for the shortest one, plus every `stride`-th pack
    as a donor of other lengths, are emptied and their documents re-packed by BFD with exact-fill
    completion; kept only when that needs fewer packs. Returns item_bin (untouched packs first, in order,
    then the re-packed ones).

    Why donors: MBS closes gaps longest document first, so its last packs hold only the shortest lengths,
    and 31 documents of 64-67 tokens cannot sum to 2048 (100k Pareto documents at 2048: MBS 1 pack above the
    L2 bound in each of 5 seeds); re-packed alone they stay that way. With every 16th pack's lengths mixed
    in (7-10% of the documents re-packed), the re-pack meets the bound in all 5 (and at 8192 in the one seed
    of 5 where MBS is above it, by 2)."""
    n_bins = int(item_bin.max()) + 1
    loads = np.bincount(item_bin, weights=lengths, minlength=n_bins).astype(np.int64)
    longest = np.zeros(n_bins, np.int64)
    np.maximum.at(longest, item_bin, lengths)
    pick = (loads < budget) & (budget - longest >= lengths.min()) & (2 * longest <= budget)
    pick[::stride] = True
    pool = np.flatnonzero(pick[item_bin])
    sub = _hybrid(lengths[pool], budget)
    if sub.max() + 1 >= pick.sum():
        return item_bin
    kept = np.cumsum(~pick) - 1
    out = kept[item_bin]
    out[pool] = int((~pick).sum()) + sub
    return out


def _hybrid(lengths: np.ndarray, budget: int) -> np.ndarray:
    """Best-fit-decreasing with exact-fill completion by the documents shorter than budget / 4."""
    return strategies.bfd(lengths, budget, exact_below=budget // EXACT_BELOW_FRACTION)


def _mbs(lengths: np.ndarray, budget: int) -> np.ndarray:
    """Minimum bin slack (`strategies.mbs`), then `repair_packs` unless it already meets the L2 bound."""
    if not len(lengths):
        return np.zeros(0, np.int64)
    plan = strategies.mbs(lengths, budget)
    return plan if plan.max() + 1 <= l2_bound_packs(lengths, budget) else repair_packs(lengths, budget, plan)


def bfd_without_mbs(lengths: np.ndarray, budget: int) -> np.ndarray:
    """The default before its MBS fallback (kept as the benchmark's reference): the fewer packs of BFD with
    exact-fill completion and plain BFD (ties: the first). Plain BFD wins on ~1% of small uniform inputs, by
    one pack, and costs ~0.03 s per 200k items."""
    if not len(lengths):
        return np.zeros(0, np.int64)
    hybrid, plain = _hybrid(lengths, budget), strategies.bfd(lengths, budget)
    return hybrid if hybrid.max() <= plain.max() else plain


def _bfd(lengths: np.ndarray, budget: int) -> np.ndarray:
    """The default: `bfd_without_mbs`, and where that is above the L2 bound, MBS + repair (`_mbs`) when it
    needs fewer packs (so the output changes only where packs are saved). 100k documents at 2048, 5 seeds:
    Pareto and lognormal 0-2 packs above the L2 bound → at it; uniform 5-27 → 5-22 above, which is the LP
    bound (optimal) there."""
    # Sorted longest first once: every strategy below sorts again (stable, equal lengths in index order, so the
    # plan is the same), and on sorted input that sort is O(n) (~2 ms instead of ~30 ms per 250k items).
    order = np.argsort(-lengths, kind="stable")
    ls = lengths[order]
    best = bfd_without_mbs(ls, budget)
    if len(ls) and best.max() + 1 > l2_bound_packs(ls, budget):
        other = _mbs(ls, budget)
        if other.max() < best.max():
            best = other
    item_bin = np.empty_like(best)
    item_bin[order] = best
    return item_bin


STRATEGIES = {"bfd": _bfd, "mbs": _mbs, "ffd": strategies.ffd, "sequential": strategies.sequential}


@dataclass
class PackPlan:
    """Segments of every pack. Pack p is segments pack_offsets[p]:pack_offsets[p+1], in placement order."""

    budget: int
    strategy: str
    seg_doc: np.ndarray       # int64 [S] document index (into the `lengths` given)
    seg_start: np.ndarray     # int64 [S] first token of the segment within its document
    seg_len: np.ndarray       # int64 [S] tokens in the segment, 1..budget
    pack_offsets: np.ndarray  # int64 [P + 1]
    truncated_tokens: int = 0  # tokens dropped by overlong="truncate"
    split_docs: int = 0        # documents longer than the budget cut into chunks (overlong="split")
    split_tokens: int = 0      # tokens of those documents
    overlong: str = "split"

    @property
    def n_packs(self) -> int:
        return len(self.pack_offsets) - 1

    @property
    def n_tokens(self) -> int:
        return int(self.seg_len.sum())

    def pack_tokens(self) -> np.ndarray:
        """int64 [P] real tokens per pack."""
        cum = np.concatenate([[0], np.cumsum(self.seg_len)])
        return np.diff(cum[self.pack_offsets])

    @property
    def fill(self) -> float:
        """Real tokens / slot tokens (n_packs × budget)."""
        return self.n_tokens / (self.n_packs * self.budget) if self.n_packs else 0.0

    def docs_per_pack(self) -> np.ndarray:
        return np.diff(self.pack_offsets)

    def to_lists(self) -> list[list[tuple[int, int, int]]]:
        """Python lists of (doc_index, start, length) per pack — for tests and small inputs."""
        out = []
        for p in range(self.n_packs):
            a, b = self.pack_offsets[p], self.pack_offsets[p + 1]
            out.append([(int(d), int(s), int(n)) for d, s, n in
                        zip(self.seg_doc[a:b], self.seg_start[a:b], self.seg_len[a:b], strict=True)])
        return out


def lower_bound_packs(lengths: np.ndarray, budget: int) -> int:
    """A lower bound on the packs any packer needs: max(⌈Σ/B⌉, #documents longer than B/2), where a
    document longer than B counts ⌊L/B⌋ full packs plus its remainder."""
    lengths = np.asarray(lengths, np.int64)
    full, rem = np.divmod(lengths, budget)
    total = int(lengths.sum())
    big = int(full.sum() + np.count_nonzero(2 * rem > budget))
    return max(-(-total // budget), big)


def l2_bound_packs(lengths: np.ndarray, budget: int) -> int:
    """Martello-Toth L2 lower bound (1990), O(B) over counts per length, ≥ `lower_bound_packs`.

    For every k ≤ B/2: items > B-k each need a pack that nothing ≥ k can join (J1); items in (B/2, B-k]
    need one pack each (J2); items in [k, B/2] (J3) must fit into J2's leftover space or into new packs:
    L(k) = |J1| + |J2| + max(0, ⌈(ΣJ3 - (|J2|·B - ΣJ2)) / B⌉). Overlong documents count as in
    `lower_bound_packs` (full chunks + remainder).
    """
    lengths = np.asarray(lengths, np.int64)
    B = budget
    full, rem = np.divmod(lengths, B)
    rem = rem[rem > 0]
    c = np.bincount(rem, minlength=B + 1).astype(np.int64)
    vol_ge = np.concatenate([np.cumsum((c * np.arange(B + 1))[::-1])[::-1], [0]])   # Σ l for l ≥ x
    cnt_gt = np.concatenate([np.cumsum(c[::-1])[::-1][1:], [0]])                     # #l > x
    half = B // 2
    k = np.arange(0, half + 1)
    j1 = cnt_gt[B - k]
    j2n = cnt_gt[half] - j1
    j2v = vol_ge[half + 1] - vol_ge[B - k + 1]
    j3v = vol_ge[np.maximum(k, 1)] - vol_ge[half + 1]
    extra = np.maximum(0, -(-(j3v - (j2n * B - j2v)) // B))
    return int(full.sum() + (j1 + j2n + extra).max()) if len(lengths) else 0


def _chunks(lengths: np.ndarray, budget: int, overlong: str):
    """Items to pack: (doc, start, length) with length in [1, budget], plus full overlong packs."""
    n = len(lengths)
    long_ = lengths > budget
    doc = np.arange(n, dtype=np.int64)
    stats = {"truncated_tokens": 0, "split_docs": 0, "split_tokens": 0}
    if not long_.any():
        return doc, np.zeros(n, np.int64), lengths.copy(), None, stats
    if overlong == "truncate":
        stats["truncated_tokens"] = int((lengths[long_] - budget).sum())
        return doc, np.zeros(n, np.int64), np.minimum(lengths, budget), None, stats
    stats["split_docs"] = int(long_.sum())
    stats["split_tokens"] = int(lengths[long_].sum())
    full = lengths // budget * long_                 # full chunks of overlong documents
    rem = np.where(long_, lengths % budget, lengths)
    fdoc = np.repeat(doc, full)                      # every full chunk is a pack of its own
    first = np.concatenate([[0], np.cumsum(full)])[:-1]
    fstart = (np.arange(len(fdoc), dtype=np.int64) - np.repeat(first, full)) * budget
    keep = rem > 0
    return doc[keep], (lengths - rem)[keep], rem[keep], (fdoc, fstart), stats


def carry_order(ln: np.ndarray, local: np.ndarray, budget: int) -> np.ndarray:
    """Pack ids of one window in the order they are reopened with the next window: packs with free space
    first (largest gap first), then full packs whose longest document is shortest (ties: lower pack id).

    Reopening full packs of short documents too gives the next window material to pair with the long
    documents left without a partner. Uniform [1, 2048], 1M documents in windows of 200k: 499,979 →
    499,923 packs (L2 bound 499,887: fill vs L2 0.99982 → 0.99993; budget 8192: 0.99983 → 0.99991) for
    up to ~0.5-1 s more CPU per 1M documents (window/4 documents are re-packed per window, not only the
    open packs'); lognormal unchanged, Pareto ≤ 2 packs fewer
    (bench/results/history/pack_fill_full_pack_carry.md).

    >>> carry_order(np.array([4, 4, 2, 6, 3]), np.array([0, 0, 0, 1, 1]), 10)   # [4 4 2] full, [6 3] gap 1
    array([1, 0])
    """
    gap = budget - np.bincount(local, weights=ln).astype(np.int64)
    longest = np.zeros(len(gap), np.int64)
    np.maximum.at(longest, local, ln)
    key = np.where(gap > 0, -budget - gap, longest)
    return np.argsort(key, kind="stable")


def _pack_windows(ln: np.ndarray, budget: int, fn, window: int, carry: bool) -> np.ndarray:
    """Pack `window` items at a time. With `carry`, packs of a window are reopened in `carry_order` (at most
    window/4 items): their items join the next window, so the boundary between windows costs almost
    nothing. Returns item_bin, packs numbered in order of closing."""
    n = len(ln)
    item_bin = np.empty(n, np.int64)
    carried = np.zeros(0, np.int64)
    base = 0
    for a in range(0, n, max(window, 1)):
        idx = np.concatenate([carried, np.arange(a, min(a + window, n), dtype=np.int64)])
        local = fn(ln[idx], budget)
        keep = np.ones(len(idx), bool)
        if carry and a + window < n:
            open_ = carry_order(ln[idx], local, budget)
            per_bin = np.bincount(local)[open_]
            open_ = open_[np.cumsum(per_bin) <= window // 4]
            keep = ~np.isin(local, open_)
            carried = idx[~keep]
        else:
            carried = np.zeros(0, np.int64)
        _, dense = np.unique(local[keep], return_inverse=True)
        item_bin[idx[keep]] = base + dense
        base += int(dense.max()) + 1 if len(dense) else 0
    return item_bin


def pack_lengths(lengths: np.ndarray, budget: int, strategy: Strategy = "bfd", window: int = 200_000,
                 overlong: Literal["split", "truncate"] = "split") -> PackPlan:
    """Pack documents of the given token lengths into packs of at most `budget` tokens.

    lengths int [n] ≥ 1. Deterministic: same input → same plan (ties keep document order). Packs come out
    in the order they were opened (per window); full chunks of split documents come first.
    """
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
        raise ValueError(f"lengths must be a 1-D integer array, got shape {lengths.shape} dtype {lengths.dtype}")
    lengths = lengths.astype(np.int64, copy=False)
    if budget < 2:
        raise ValueError(f"budget {budget}: must be ≥ 2 tokens")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: allowed {sorted(STRATEGIES)}")
    if overlong not in ("split", "truncate"):
        raise ValueError(f"overlong {overlong!r}: allowed 'split', 'truncate'")
    if window < 1:
        raise ValueError(f"window {window}: must be ≥ 1")
    if lengths.size and lengths.min() < 1:
        bad = np.flatnonzero(lengths < 1)
        raise ValueError(f"{len(bad)} documents have length < 1 (first indices {bad[:5].tolist()})")
    doc, start, ln, full, stats = _chunks(lengths, budget, overlong)
    item_bin = _pack_windows(ln, budget, STRATEGIES[strategy],
                             len(ln) if strategy == "sequential" else window, carry=strategy != "sequential")
    # Within a pack keep placement order: decreasing length (bfd/ffd) or input order (sequential).
    key = np.argsort(-ln, kind="stable") if strategy != "sequential" else np.arange(len(ln))
    perm = key[np.argsort(item_bin[key], kind="stable")]
    seg_doc, seg_start, seg_len = doc[perm], start[perm], ln[perm]
    counts = np.bincount(item_bin)
    if full is not None:
        fdoc, fstart = full
        seg_doc = np.concatenate([fdoc, seg_doc])
        seg_start = np.concatenate([fstart, seg_start])
        seg_len = np.concatenate([np.full(len(fdoc), budget, np.int64), seg_len])
        counts = np.concatenate([np.ones(len(fdoc), np.int64), counts])
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    return PackPlan(budget, strategy, seg_doc, seg_start, seg_len, offsets, **stats, overlong=overlong)
