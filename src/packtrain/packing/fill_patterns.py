"""How a gap of a pack is filled from the items left: the patterns `strategies.bfd(exact_below=T)` and
`strategies.mbs` apply in bulk. Each works on counts per length (`left`, int64 [budget + 1] or [T]) and the
ascending list of lengths with items left (`nz`), and returns {length: count} — never more of a length than
`left` holds.

    fill_pattern(gap, left, nz)     bfd's small items: one item of the gap, else the smallest pair, else greedy
    exact_pattern(gap, left)        a subset summing to exactly `gap` (subset_sum, shortest first), or None
    slack_pattern(gap, left, nz)    mbs: the least slack, exactly when possible
    subset_sum(gap, left, longest_first)   the fullest sum ≤ gap: a bounded subset-sum over a Python-int bitset

By example (gap 5, left: one 1, one 2, one 3): fill_pattern → {2: 1, 3: 1} (the pair with the smallest a).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np

GREEDY_STEPS = 8
"""mbs: steps of "take the longest items that leave room for a closing pair" before the subset-sum search."""


PAIR_WALK = 24
"""Pair searches (mbs's most balanced pair, the exact fill's smallest pair): candidate lengths tried in Python
before numpy takes the rest of the range. On dense length sets the pair is almost always among them."""


def balanced_pair(gap: int, left: np.ndarray, lmin: int, nz: list[int]) -> dict[int, int] | None:
    """The most balanced pair x + y = gap (x ≤ y) that `left` holds, or None. nz: candidate lengths,
    ascending. On dense length sets a pair is found within a few of the lengths just below gap/2."""
    lo, half = max(lmin, gap - (len(left) - 1)), gap // 2
    i, hi = bisect_right(nz, half), half
    for _ in range(PAIR_WALK):
        if not i or nz[i - 1] < lo:
            return None
        i -= 1
        x = hi = nz[i]
        if left[x] and left[gap - x] and (2 * x != gap or left[x] >= 2):
            return {x: 2} if 2 * x == gap else {x: 1, gap - x: 1}
    if lo >= hi:
        return None
    xs = np.arange(lo, hi)
    ys = gap - xs
    ok = np.flatnonzero((left[xs] > 0) & (left[ys] > 0) & ((xs != ys) | (left[xs] >= 2)))
    if not len(ok):
        return None
    x0, y0 = int(xs[ok[-1]]), int(ys[ok[-1]])
    return {x0: 2} if x0 == y0 else {x0: 1, y0: 1}


def slack_pattern(gap: int, left: np.ndarray, nz: list[int]) -> dict[int, int]:
    """Items {length: count} from `left` (nz: its non-zero lengths, ascending) filling `gap` with the least
    slack, exactly when possible: one item of the gap; else, when no two items fit, the longest that does;
    else the longest items (in bulk, at most GREEDY_STEPS steps) until one item or a balanced pair closes
    what is left; else the fullest subset sum (`subset_sum`, longest lengths first)."""
    n_fit = bisect_right(nz, gap)
    if gap <= 0 or not n_fit:
        return {}
    if left[gap]:
        return {gap: 1}
    lmin = nz[0]
    second = lmin if left[lmin] > 1 else (nz[1] if n_fit > 1 else gap + 1)
    if lmin + second > gap:
        return {nz[n_fit - 1]: 1}
    taken: dict[int, int] = {}                 # the longest items, out of `left` while the loop runs
    g, closing = gap, None
    for _ in range(GREEDY_STEPS):
        if g < len(left) and left[g]:
            closing = {g: 1}
            break
        top = longest(left, nz, g)
        if top and 2 * top >= g:
            closing = balanced_pair(g, left, lmin, nz)
            if closing:
                break
        x = longest(left, nz, g - 2 * lmin)
        if not x:
            break
        k = max(1, min(int(left[x]), (g - 2 * x) // x))   # in bulk while ≥ 2x is left for the closing pair
        taken[x] = taken.get(x, 0) + k
        left[x] -= k
        g -= k * x
    for x, k in taken.items():
        left[x] += k
    if closing:
        for x, k in closing.items():
            taken[x] = taken.get(x, 0) + k
        return taken
    return subset_sum(gap, left, longest_first=True)[0]


def longest(left: np.ndarray, nz: list[int], limit: int) -> int:
    """The longest length ≤ limit that `left` still holds (nz: candidates, ascending), or 0."""
    i = bisect_right(nz, limit)
    while i:
        i -= 1
        if left[nz[i]]:
            return nz[i]
    return 0


def fill_pattern(gap: int, left: np.ndarray, nz: list[int]) -> dict[int, int]:
    """Items {length: count} from `left` (counts per length < T; nz: its non-zero lengths, ascending) that
    fill `gap`, exactly when possible.

    Greedy: one item of exactly `gap`; else a pair a + b = gap (smallest a first); else as many of the
    largest length as keep the rest ≥ 2·(smallest length) so a pair can still close it; else the largest
    that fits (the gap stays open). A pattern never uses more of a length than `left` holds.
    """
    pat: dict[int, int] = {}
    taken: list[tuple[int, int]] = []          # the greedy's items, out of `left` until the pattern is done
    T = len(left)
    while gap > 0:
        lmin = next((x for x in nz if left[x]), 0)
        if not lmin:
            break
        if gap < T and left[gap]:
            pat[gap] = pat.get(gap, 0) + 1
            break
        if gap >= 2 * lmin:
            pair = smallest_pair(gap, left, max(lmin, gap - T + 1), nz)
            if pair:
                for x in pair:
                    pat[x] = pat.get(x, 0) + 1
                break
        x = longest(left, nz, gap - 2 * lmin)
        if x:
            k = min(int(left[x]), (gap - 2 * lmin) // x)
        else:
            x, k = longest(left, nz, gap), 1
            if not x:
                break
        pat[x] = pat.get(x, 0) + k
        left[x] -= k
        taken.append((x, k))
        gap -= k * x
    for x, k in taken:
        left[x] += k
    return pat


def smallest_pair(gap: int, left: np.ndarray, lo: int, nz: list[int]) -> tuple[int, int] | None:
    """The pair a + b = gap with the smallest a ≥ lo (a ≤ b) that `left` holds: the first PAIR_WALK
    candidate lengths in Python, the rest of the range in numpy."""
    half = gap // 2
    i, a = bisect_left(nz, lo), lo - 1
    for _ in range(PAIR_WALK):
        if i == len(nz) or nz[i] > half:
            return None
        a = nz[i]
        if left[a] and left[gap - a] and (2 * a != gap or left[a] >= 2):
            return a, gap - a
        i += 1
    x = np.arange(a + 1, half + 1)
    ok = np.flatnonzero((left[x] > 0) & (left[gap - x] > 0) & ((2 * x != gap) | (left[x] >= 2)))
    return (int(x[ok[0]]), gap - int(x[ok[0]])) if len(ok) else None


def exact_pattern(gap: int, left: np.ndarray) -> dict[int, int] | None:
    """Items {length: count} from `left` summing to exactly `gap` (shortest lengths added first), or None."""
    pat, total = subset_sum(gap, left, longest_first=False)
    return pat if total == gap else None


def subset_sum(gap: int, left: np.ndarray, longest_first: bool) -> tuple[dict[int, int], int]:
    """(items {length: count} from `left` with the largest sum ≤ `gap`, that sum). Bounded subset-sum over a
    Python-int bitset (bit s = "sum s reachable"), counts split in binary chunks 1, 2, 4, ...: about
    distinct lengths × log(gap / length) shifts of a (gap+1)-bit integer, ~1 ms at gap 2048. Lengths are
    added shortest (or longest) first; the search stops at the first length that makes `gap` reachable."""
    mask = (1 << (gap + 1)) - 1
    reach, history = 1, []
    lengths = np.flatnonzero(left[: gap + 1])
    for a in (lengths[::-1] if longest_first else lengths).tolist():
        c, chunk = min(int(left[a]), gap // a), 1
        while c:
            take = min(chunk, c)
            history.append((a, take, reach))
            reach = (reach | (reach << (a * take))) & mask
            c -= take
            chunk *= 2
        if reach >> gap & 1:
            break
    pat: dict[int, int] = {}
    total = cur = reach.bit_length() - 1
    for a, take, before in reversed(history):
        if cur and not (before >> cur & 1):       # `cur` needs this chunk
            pat[a] = pat.get(a, 0) + take
            cur -= a * take
    return pat, total
