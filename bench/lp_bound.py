"""The LP (Gilmore-Gomory) lower bound on packs, by column generation, with an exact integer certificate.

    lp_bound_packs(lengths, budget) → {"bound", "value", "lp_master", "iterations", "columns", "seconds"}
    (bound: the certified bound on packs; value: its fraction before rounding up; lp_master: the last master LP)

L2 (`packtrain.packing.bins.l2_bound_packs`) is not tight on every length set: on 100k uniform [1, 2048]
documents it is 49,979 packs while no packing needs fewer than 49,999 (the LP optimum is 49,998.5). The LP
relaxation of bin packing over patterns (multisets of lengths that fit one pack) is the tightest bound
known to be cheap here, and with ≤ B distinct lengths it does not grow with N:

    min Σ_p x_p   s.t.   Σ_p a_lp x_p ≥ c_l  (c_l = documents of length l),  x ≥ 0

Column generation: a master LP (scipy's HiGHS) over the packs of a real plan plus one pattern ⌊B/l⌋ × l per
length, stopped once Farley's bound and the master's optimum have the same ceiling, and the dual-optimal inequalities y_l ≤ y_l' for l < l' (a longer document may stand in for a
shorter one; Ben Amor, Desrosiers & Valério de Carvalho 2006: without them the duals of uniform sets stall
for minutes at B 8192); the pricing problem is an unbounded knapsack over capacities 0..B (a relaxation of
"at most c_l of length l", so the bound stays valid).

The bound is certified, not read off the LP solver: with integer weights Y_l = ⌊y_l · 2^32⌋ from the last
duals and V = the exact integer knapsack optimum max Σ a_l Y_l over every pattern, any packing needs at least
Σ c_l Y_l / V packs (Farley's bound: Y/V is a dual-feasible function), computed in Python integers. Documents
longer than B count ⌊L/B⌋ full packs plus their remainder, as in the L2 bound. Needs scipy (a bench
dependency, imported here only).
"""

from __future__ import annotations

import time

import numpy as np

SCALE = 1 << 32
"""Duals are rounded down to multiples of 2^-32: at most n_docs · 2^-32 packs lost (< 0.001 for 1M)."""


def _knapsack(values: np.ndarray, sizes: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Unbounded knapsack by capacity: best[w] = max Σ values over multisets of `sizes` (ascending) with total
    ≤ w, choice[w] = index of the last size taken (-1: w - 1 is as good). Exact for integer values."""
    best = np.zeros(budget + 1, values.dtype)
    choice = np.full(budget + 1, -1, np.int64)
    for w in range(1, budget + 1):
        k = int(np.searchsorted(sizes, w, side="right"))
        best[w] = best[w - 1]
        if k:
            v = best[w - sizes[:k]] + values[:k]
            j = int(np.argmax(v))
            if v[j] > best[w]:
                best[w], choice[w] = v[j], j
    return best, choice


def _pattern(choice: np.ndarray, sizes: np.ndarray, w: int) -> dict[int, int]:
    """The multiset {size index: count} behind best[w]."""
    pat: dict[int, int] = {}
    while w > 0:
        j = int(choice[w])
        if j < 0:
            w -= 1
        else:
            pat[j] = pat.get(j, 0) + 1
            w -= int(sizes[j])
    return pat


def _plan_patterns(rem: np.ndarray, budget: int, index: np.ndarray) -> list[dict[int, int]]:
    """The distinct packs of an MBS plan of `rem` as {size index: count} (a pack's key: two random
    weighted sums of its lengths; a collision only drops a starting column)."""
    from packtrain.packing.strategies import mbs

    item_bin = mbs(rem, budget)
    rng = np.random.default_rng(0)
    w1, w2 = rng.random(budget + 1), rng.random(budget + 1)
    n_bins = int(item_bin.max()) + 1
    keys = np.stack([np.bincount(item_bin, w1[rem], n_bins), np.bincount(item_bin, w2[rem], n_bins)], 1)
    _, first = np.unique(keys.round(9), axis=0, return_index=True)
    order = np.argsort(item_bin, kind="stable")
    starts = np.searchsorted(item_bin[order], np.arange(n_bins + 1))
    out = []
    for b in first.tolist():
        pat: dict[int, int] = {}
        for length in rem[order[starts[b]: starts[b + 1]]].tolist():
            pat[int(index[length])] = pat.get(int(index[length]), 0) + 1
        out.append(pat)
    return out


def lp_bound_packs(lengths, budget: int, max_iter: int = 50) -> dict:
    """The certified LP lower bound on packs of `lengths` at `budget` (module doc)."""
    import scipy.sparse as sp
    from scipy.optimize import linprog

    t0 = time.perf_counter()
    lengths = np.asarray(lengths, np.int64)
    full, rem = np.divmod(lengths, budget)
    rem = rem[rem > 0]
    if not len(rem):
        return {"bound": int(full.sum()), "value": float(full.sum()), "lp_master": float(full.sum()), "iterations": 0,
                "columns": 0, "seconds": 0.0}
    counts = np.bincount(rem, minlength=budget + 1)
    sizes = np.flatnonzero(counts)
    demand = counts[sizes].astype(float)
    index = np.zeros(budget + 1, np.int64)
    index[sizes] = np.arange(len(sizes))
    columns = [{j: budget // int(s)} for j, s in enumerate(sizes)] + _plan_patterns(rem, budget, index)
    seen = {tuple(sorted(c.items())) for c in columns}
    m = len(sizes)
    iterations = 0
    while iterations < max_iter:
        iterations += 1
        rows = [j for c in columns for j in c] + list(range(m - 1)) + list(range(1, m))
        cols = [i for i, c in enumerate(columns) for _ in c] + [len(columns) + j for j in range(m - 1)] * 2
        vals = [-a for c in columns for a in c.values()] + [-1.0] * (m - 1) + [1.0] * (m - 1)
        a_ub = sp.csr_matrix((vals, (rows, cols)), shape=(m, len(columns) + m - 1))
        cost = np.concatenate([np.ones(len(columns)), np.zeros(m - 1)])   # substitutions are free
        res = linprog(cost, A_ub=a_ub, b_ub=-demand, bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"LP master: {res.message}")
        y = np.maximum(-res.ineqlin.marginals, 0.0)
        best, choice = _knapsack(y, sizes, budget)
        farley = float(demand @ y) / best[budget]              # LP optimum ∈ [farley, res.fun]
        if np.ceil(farley - 1e-6) >= np.ceil(res.fun - 1e-6):  # its ceiling is settled: stop
            break
        new = 0
        for j, s in enumerate(sizes.tolist()):
            if y[j] + best[budget - s] > 1 + 1e-9:              # a pattern with reduced cost < 0 starts at s
                pat = _pattern(choice, sizes, budget - s)
                pat[j] = pat.get(j, 0) + 1
                key = tuple(sorted(pat.items()))
                if key not in seen:
                    seen.add(key)
                    columns.append(pat)
                    new += 1
        if not new:
            break
    weights = np.floor(y * SCALE).astype(np.int64)
    v = int(_knapsack(weights, sizes, budget)[0][budget])
    num = sum(int(c) * int(w) for c, w in zip(counts[sizes].tolist(), weights.tolist(), strict=True))
    return {"bound": int(full.sum()) + (-(-num // v) if v else 0), "value": float(full.sum()) + num / v,
            "lp_master": float(full.sum()) + float(res.fun), "iterations": iterations, "columns": len(columns),
            "seconds": round(time.perf_counter() - t0, 2)}
