"""The bin-packing strategies over item lengths in [1, budget]. Each returns `item_bin` (int64 [n]).

A budget-B problem has at most B distinct lengths, so the decreasing strategies work on counts per length
class, never on the N items one by one in Python.

bfd — best-fit-decreasing. Open bins are grouped by remaining space r in 1..B-1; a sorted list of the
    non-empty levels is the O(log L) structure (bisect) that finds the tightest level ≥ l. Within a length
    class every BFD decision is a bulk move: the tightest level r takes k = r // l items per bin (a bin
    stays the tightest fit until it drops below l), so `q = min(bins at r, m // k)` bins each take k items
    and move to level r - k·l in one numpy slice. Bins at one level are interchangeable for the rest of the
    run, so grouping them changes nothing but speed: the plan is exactly BFD's. Cost: O(N log N) for the
    sort plus O(#bulk moves · log L) in Python (a bulk move finishes a length class or empties a level).
    By example (B = 10, lengths 6 6 5 4 3 3 2 1):
        6 → new A (r 4)    6 → new B (r 4)    5 → new C (r 5)    4 → A (tightest r ≥ 4)
        3 → B (r 4 → 1)    3 → C (r 5 → 2)    2 → C (r 2 → 0)    1 → B (r 1 → 0)
        bins: A [6, 4]  B [6, 3, 1]  C [5, 3, 2]
bfd(exact_below=T) — BFD for items ≥ T, then the small items close the remaining gaps, smallest gap
    first, then fill new bins, with exact-fill patterns: one item of exactly the gap, else a pair summing
    to it, else greedy + a bounded subset-sum (bitset) search. Plain BFD leaves every gap that is smaller
    than the shortest document open (lengths ≥ 64: ~0.5% of the slots); this closes almost all of them.
mbs — minimum bin slack (Gupta & Ho 1999) in the variant that seeds every bin with the longest item left
    (Fleszar & Hindi 2002), over counts per length: the seed's gap B - a is closed by the items left with
    the least slack (one item of exactly the gap; else the longest items, in bulk, until one item or the
    most balanced pair closes the rest; else a bitset subset-sum), and that pattern is applied to as many
    bins as the counts allow. Cost: O(N log N) for the sort plus O(#patterns) pattern searches, independent
    of N (B 2048: ~2,000 patterns per 100k items, ~0.1 s). Where BFD leaves a long item's gap open, MBS
    fills it before moving on: 100k Pareto documents, 8,347 → 8,346 packs (the L2 bound is 8,345); its own
    weak spot is the end, where only the shortest lengths are left (`bins.repair_packs` closes that).
ffd — first-fit-decreasing: per length class, the lowest-numbered bins with space ≥ l each take
    floor(space / l) items (numpy over the open bins), so it costs O(L · open bins).
sequential — next-fit in the given order (no reordering): a pack is closed when the next item does not fit.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque

import numpy as np

from packtrain.packing.fill_patterns import exact_pattern, fill_pattern, slack_pattern


class _Levels:
    """Open bins grouped by remaining space: level r → a FIFO of numpy arrays of bin ids (ties between
    equally tight bins go to the bin that reached the level first)."""

    def __init__(self, budget: int):
        self.count = [0] * (budget + 1)
        self.queues: list[deque[np.ndarray]] = [deque() for _ in range(budget + 1)]
        self.nonempty: list[int] = []        # sorted levels with count > 0 (level 0 = full bins, never kept)

    def put(self, r: int, bins: np.ndarray) -> None:
        if r == 0 or len(bins) == 0:
            return
        if self.count[r] == 0:
            insort(self.nonempty, r)
        self.count[r] += len(bins)
        self.queues[r].append(bins)

    def take(self, r: int, q: int) -> np.ndarray:
        queue, out, need = self.queues[r], [], q
        while need:
            head = queue[0]
            if len(head) <= need:
                out.append(queue.popleft())
                need -= len(head)
            else:
                out.append(head[:need])
                queue[0] = head[need:]
                need = 0
        self.count[r] -= q
        if self.count[r] == 0:
            self.nonempty.pop(bisect_left(self.nonempty, r))
        return out[0] if len(out) == 1 else np.concatenate(out)


def _classes(lengths: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Items sorted by decreasing length (stable: equal lengths keep index order) and counts per length."""
    order = np.argsort(-lengths, kind="stable")
    counts = np.bincount(lengths, minlength=budget + 1)
    return order, counts


def bfd(lengths: np.ndarray, budget: int, exact_below: int | None = None) -> np.ndarray:
    """Best-fit-decreasing. lengths int64 [n] in [1, budget] → item_bin int64 [n], bins numbered 0.. in
    order of opening.

    `exact_below=T`: items ≥ T go through best-fit-decreasing, then items < T fill the gaps left (smallest
    gap first, then new bins) with exact-fill patterns (`fill_pattern`). None → plain BFD for all items.
    """
    order, counts = _classes(lengths, budget)
    lv = _Levels(budget)
    moves: dict[int, list[np.ndarray]] = {}   # length → bin id per item of that length, in index order
    n_bins = 0
    T = 1 if exact_below is None else max(1, min(exact_below, budget + 1))

    def place(length: int, bins: np.ndarray, k: int, r: int) -> None:
        moves.setdefault(length, []).append(np.repeat(bins, k))
        lv.put(r - k * length, bins)

    for length in np.flatnonzero(counts)[::-1].tolist():
        if length < T:
            break
        m = int(counts[length])
        while m:
            i = bisect_left(lv.nonempty, length)
            if i == len(lv.nonempty):                 # nothing fits: open new bins at level `budget`
                k = budget // length
                q, rest = divmod(m, k)
                if q:
                    place(length, np.arange(n_bins, n_bins + q, dtype=np.int64), k, budget)
                    n_bins += q
                if rest:
                    place(length, np.array([n_bins], np.int64), rest, budget)
                    n_bins += 1
                break
            r = lv.nonempty[i]
            k = r // length                          # a bin stays the tightest fit for k items
            q = min(lv.count[r], m // k)
            if q:
                place(length, lv.take(r, q), k, r)
                m -= q * k
            if m and lv.count[r]:                    # m < k left: they all go into one more bin at r
                place(length, lv.take(r, 1), m, r)
                m = 0
    if T > 1:
        left = counts[:T].copy()
        nz = np.flatnonzero(left).tolist()           # lengths < T with items left, ascending
        for r in list(lv.nonempty) + [budget]:       # existing gaps, smallest first; then new bins
            new = r == budget
            n = (1 << 62) if new else lv.count[r]
            while n and nz:
                pat = fill_pattern(r, left, nz)
                if not pat:
                    break
                if sum(a * k for a, k in pat.items()) < r:     # greedy left a gap: try an exact subset sum
                    pat = exact_pattern(r, left) or pat
                q = min(n, min(int(left[a]) // k for a, k in pat.items()))
                if new:
                    bins = np.arange(n_bins, n_bins + q, dtype=np.int64)
                    n_bins += q
                else:
                    bins = lv.take(r, q)
                for a, k in pat.items():
                    moves.setdefault(a, []).append(np.repeat(bins, k))
                    left[a] -= q * k
                    if not left[a]:
                        nz.pop(bisect_left(nz, a))
                n -= q
    return _assign(order, counts, moves, len(lengths))


def mbs(lengths: np.ndarray, budget: int) -> np.ndarray:
    """Minimum bin slack, seeded with the longest item. lengths int64 [n] in [1, budget] → item_bin int64 [n],
    bins numbered 0.. in order of opening (= decreasing seed length).

        B = 10, lengths 6 6 5 4 3 3 2 1 (counts per length, longest seed first):
        seed 6, gap 4: exact item 4            → [6, 4]
        seed 6, gap 4: no 4 left, pair 3 + 1   → [6, 3, 1]
        seed 5, gap 5: pair 3 + 2              → [5, 3, 2]
    """
    order, counts = _classes(lengths, budget)
    left = counts.astype(np.int64)
    moves: dict[int, list[np.ndarray]] = {}
    n_bins = 0
    nz = np.flatnonzero(left).tolist()         # lengths with items left, ascending
    while nz:
        a = nz[-1]
        left[a] -= 1                           # the seed; the pattern may take more of its length
        if not left[a]:
            nz.pop()
        pat = slack_pattern(budget - a, left, nz)
        if not left[a]:
            nz.append(a)
        left[a] += 1
        pat[a] = pat.get(a, 0) + 1
        q = min(int(left[x]) // k for x, k in pat.items())
        bins = np.arange(n_bins, n_bins + q, dtype=np.int64)
        n_bins += q
        for x, k in pat.items():
            moves.setdefault(x, []).append(np.repeat(bins, k))
            left[x] -= q * k
            if not left[x]:
                nz.pop(bisect_left(nz, x))
    return _assign(order, counts, moves, len(lengths))


def _assign(order: np.ndarray, counts: np.ndarray, moves: dict[int, list[np.ndarray]], n: int) -> np.ndarray:
    """item_bin from per-length bin lists: the items of length l (in index order) take moves[l] in order."""
    item_bin = np.empty(n, np.int64)
    above = np.concatenate([np.cumsum(counts[::-1])[::-1], [0]])   # above[l] = #items with length ≥ l
    for length, ms in moves.items():
        a = int(above[length + 1])
        item_bin[order[a: a + int(counts[length])]] = np.concatenate(ms)
    return item_bin


def ffd(lengths: np.ndarray, budget: int) -> np.ndarray:
    """First-fit-decreasing, vectorized per length class over the open bins."""
    order, counts = _classes(lengths, budget)
    space = np.zeros(0, np.int64)      # remaining space of bin j
    moves: list[np.ndarray] = []
    min_len = int(lengths.min()) if len(lengths) else 1
    open_ids = np.zeros(0, np.int64)   # bins that may still take an item (space ≥ smallest length)
    for length in np.flatnonzero(counts)[::-1].tolist():
        m = int(counts[length])
        sp = space[open_ids]
        cand = open_ids[sp >= length]
        if len(cand):
            k = space[cand] // length
            cum = np.cumsum(k)
            j = int(np.searchsorted(cum, m))          # bins cand[:j+1] are (partly) used
            take = k[: j + 1].copy() if j < len(cand) else k.copy()
            if j < len(cand):
                take[-1] = m - (cum[j - 1] if j else 0)
            used = cand[: len(take)]
            moves.append(np.repeat(used, take))
            space[used] -= take * length
            m -= int(take.sum())
        if m:
            k = budget // length
            q, rest = divmod(m, k)
            per = np.full(q + (1 if rest else 0), k, np.int64)
            if rest:
                per[-1] = rest
            new = np.arange(len(space), len(space) + len(per), dtype=np.int64)
            moves.append(np.repeat(new, per))
            space = np.concatenate([space, budget - per * length])
            open_ids = np.concatenate([open_ids, new])
        if len(open_ids) > 1024:
            open_ids = open_ids[space[open_ids] >= min_len]
    item_bin = np.empty(len(lengths), np.int64)
    item_bin[order] = np.concatenate(moves) if moves else np.zeros(0, np.int64)
    return item_bin


def sequential(lengths: np.ndarray, budget: int) -> np.ndarray:
    """Next-fit in the given order: O(#packs) searchsorted calls over the running sum."""
    n = len(lengths)
    cum = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=cum[1:])
    starts = []
    s = 0
    while s < n:
        starts.append(s)
        s = int(np.searchsorted(cum, cum[s] + budget, side="right")) - 1
    bounds = np.array(starts, np.int64)
    return np.searchsorted(bounds, np.arange(n), side="right") - 1
