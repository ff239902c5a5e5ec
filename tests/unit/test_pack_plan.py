"""pack_lengths: literal tables per strategy, the lower bounds, and hypothesis properties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtrain.packing import strategies
from packtrain.packing.bins import (
    STRATEGIES,
    bfd_without_mbs,
    carry_order,
    l2_bound_packs,
    lower_bound_packs,
    pack_lengths,
    repair_packs,
)
from packtrain.testing.synthetic_lengths import length_set

# (lengths, budget, strategy, expected packs as (doc_index, start, length) lists)
TABLE = [
    # the docstring example: BFD puts 4 into the first bin at level 4, then 3 into the tightest (B at 4)
    ([6, 6, 5, 4, 3, 3, 2, 1], 10, "bfd",
     [[(0, 0, 6), (3, 0, 4)], [(1, 0, 6), (4, 0, 3), (7, 0, 1)], [(2, 0, 5), (5, 0, 3), (6, 0, 2)]]),
    # best fit vs first fit: the 1 goes to the tightest gap (bfd) or the first bin with room (ffd)
    ([8, 3, 8, 1, 6, 5, 10], 10, "bfd",
     [[(6, 0, 10)], [(0, 0, 8)], [(2, 0, 8)], [(4, 0, 6), (1, 0, 3), (3, 0, 1)], [(5, 0, 5)]]),
    ([8, 3, 8, 1, 6, 5, 10], 10, "ffd",
     [[(6, 0, 10)], [(0, 0, 8), (3, 0, 1)], [(2, 0, 8)], [(4, 0, 6), (1, 0, 3)], [(5, 0, 5)]]),
    ([5, 4, 3, 3, 2, 2, 1], 10, "ffd",
     [[(0, 0, 5), (1, 0, 4), (6, 0, 1)], [(2, 0, 3), (3, 0, 3), (4, 0, 2), (5, 0, 2)]]),
    # exact-fill completion: 3 packs (= ⌈47/16⌉, optimal); plain BFD and FFD need 4
    ([15, 6, 2, 3, 12, 2, 2, 5], 16, "bfd",
     [[(0, 0, 15)], [(4, 0, 12), (2, 0, 2), (5, 0, 2)], [(1, 0, 6), (7, 0, 5), (3, 0, 3), (6, 0, 2)]]),
    # BFD and its exact fill leave the 3 in a third pack ([8 6] [7 4 4] [3]); the default falls back to
    # minimum bin slack: seed 8 + the pair 4 + 4, seed 7 + the pair 6 + 3 = 2 packs (= Σ/B)
    ([7, 3, 4, 4, 6, 8], 16, "bfd", [[(5, 0, 8), (2, 0, 4), (3, 0, 4)], [(0, 0, 7), (4, 0, 6), (1, 0, 3)]]),
    ([7, 3, 4, 4, 6, 8], 16, "mbs", [[(5, 0, 8), (2, 0, 4), (3, 0, 4)], [(0, 0, 7), (4, 0, 6), (1, 0, 3)]]),
    # mbs on the docstring example: seed 6 + exact 4; seed 6, no 4 left: pair 3 + 1; seed 5 + pair 3 + 2
    ([6, 6, 5, 4, 3, 3, 2, 1], 10, "mbs",
     [[(0, 0, 6), (3, 0, 4)], [(1, 0, 6), (4, 0, 3), (7, 0, 1)], [(2, 0, 5), (5, 0, 3), (6, 0, 2)]]),
    ([25, 3], 10, "mbs", [[(0, 0, 10)], [(0, 10, 10)], [(0, 20, 5), (1, 0, 3)]]),
    ([], 10, "mbs", []),
    # sequential: next-fit in input order
    ([4, 4, 4, 3, 5], 8, "sequential", [[(0, 0, 4), (1, 0, 4)], [(2, 0, 4), (3, 0, 3)], [(4, 0, 5)]]),
    ([6, 6, 5, 4, 3, 3, 2, 1], 10, "sequential",
     [[(0, 0, 6)], [(1, 0, 6)], [(2, 0, 5), (3, 0, 4)], [(4, 0, 3), (5, 0, 3), (6, 0, 2), (7, 0, 1)]]),
    # overlong documents: full chunks become packs of their own, the remainder is packed like a document
    ([25, 3], 10, "bfd", [[(0, 0, 10)], [(0, 10, 10)], [(0, 20, 5), (1, 0, 3)]]),
    ([25, 3], 10, "sequential", [[(0, 0, 10)], [(0, 10, 10)], [(0, 20, 5), (1, 0, 3)]]),
    ([20, 3], 10, "ffd", [[(0, 0, 10)], [(0, 10, 10)], [(1, 0, 3)]]),
    ([], 10, "bfd", []),
]


@pytest.mark.parametrize("lengths,budget,strategy,expected", TABLE)
def test_table(lengths, budget, strategy, expected):
    assert pack_lengths(np.array(lengths, np.int64), budget, strategy).to_lists() == expected


def test_plain_bfd_needs_one_more_pack_on_the_exact_fill_example():
    lengths = np.array([15, 6, 2, 3, 12, 2, 2, 5])
    assert strategies.bfd(lengths, 16).max() + 1 == 4
    assert strategies.ffd(lengths, 16).max() + 1 == 4


def test_bfd_and_its_exact_fill_need_three_packs_where_mbs_needs_two():
    lengths = np.array([7, 3, 4, 4, 6, 8])
    assert strategies.bfd(lengths, 16).max() + 1 == 3
    assert strategies.bfd(lengths, 16, exact_below=4).max() + 1 == 3
    assert strategies.mbs(lengths, 16).max() + 1 == 2


def test_truncate_counts_dropped_tokens():
    plan = pack_lengths(np.array([25, 3]), 10, "bfd", overlong="truncate")
    assert plan.to_lists() == [[(0, 0, 10)], [(1, 0, 3)]]
    assert (plan.truncated_tokens, plan.split_docs) == (15, 0)


def test_split_stats():
    plan = pack_lengths(np.array([25, 3, 10]), 10, "bfd")
    assert (plan.split_docs, plan.split_tokens, plan.truncated_tokens) == (1, 25, 0)
    assert plan.pack_tokens().tolist() == [10, 10, 10, 8]


@pytest.mark.parametrize("lengths,budget,simple,l2", [
    ([6, 6, 5, 4, 3, 3, 2, 1], 10, 3, 3),
    ([6, 6, 6], 10, 3, 3),                 # three items > B/2
    ([8, 8, 8, 3, 3], 10, 3, 4),           # L2 (k=3): no 8 can take a 3, so the 3s need a 4th pack
    ([25, 3], 10, 3, 3),                   # 2 full chunks + ⌈(5+3)/10⌉
    ([], 10, 0, 0),
])
def test_lower_bounds(lengths, budget, simple, l2):
    arr = np.array(lengths, np.int64)
    assert lower_bound_packs(arr, budget) == simple
    assert l2_bound_packs(arr, budget) == l2


def _optimum(lengths: list[int], budget: int) -> int:
    """Fewest packs by exhaustive search (tiny inputs only)."""
    best = len(lengths)
    for k in range(1, len(lengths) + 1):
        for assign in itertools.product(range(k), repeat=len(lengths)):
            loads = [0] * k
            for ln, b in zip(lengths, assign, strict=True):
                loads[b] += ln
            if max(loads) <= budget:
                return k
    return best


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=6), st.integers(6, 12))
def test_bounds_are_valid_and_bfd_is_near_optimal_on_tiny_inputs(lengths, budget):
    lengths = [min(x, budget) for x in lengths]
    from bench.lp_bound import lp_bound_packs  # the benchmark's LP bound (scipy): also ≤ the optimum

    opt = _optimum(lengths, budget)
    arr = np.array(lengths)
    assert lower_bound_packs(arr, budget) <= l2_bound_packs(arr, budget) <= lp_bound_packs(arr, budget)["bound"] <= opt
    assert pack_lengths(arr, budget, "bfd").n_packs <= opt + 1


def _check_plan(plan, lengths: np.ndarray, budget: int, truncate: bool = False) -> None:
    """Every token of every document exactly once, in order; no pack over budget; packs non-empty."""
    assert (plan.pack_tokens() <= budget).all()
    assert (np.diff(plan.pack_offsets) >= 1).all()
    assert (plan.seg_len >= 1).all() and (plan.seg_len <= budget).all()
    want = np.minimum(lengths, budget) if truncate else lengths
    order = np.lexsort((plan.seg_start, plan.seg_doc))
    doc, start, ln = plan.seg_doc[order], plan.seg_start[order], plan.seg_len[order]
    covered = np.bincount(doc, weights=ln, minlength=len(lengths)).astype(np.int64)
    assert np.array_equal(covered, want)
    # consecutive segments of one document are contiguous: start = previous start + previous length
    same = doc[1:] == doc[:-1]
    assert np.array_equal(start[1:][same], (start[:-1] + ln[:-1])[same])
    first = np.ones(len(doc), bool)
    first[1:] = ~same
    assert (start[first] == 0).all()


lengths_st = st.lists(st.integers(1, 300), min_size=0, max_size=300)


@settings(max_examples=60, deadline=None)
@given(lengths_st, st.integers(2, 128), st.sampled_from(["bfd", "mbs", "ffd", "sequential"]),
       st.sampled_from(["split", "truncate"]), st.integers(1, 50))
def test_every_token_exactly_once_and_in_order(lengths, budget, strategy, overlong, window):
    arr = np.array(lengths, np.int64)
    plan = pack_lengths(arr, budget, strategy, window=window, overlong=overlong)
    _check_plan(plan, arr, budget, truncate=overlong == "truncate")


@settings(max_examples=25, deadline=None)
@given(lengths_st, st.integers(2, 128), st.sampled_from(["bfd", "mbs", "ffd", "sequential"]))
def test_deterministic(lengths, budget, strategy):
    arr = np.array(lengths, np.int64)
    a = pack_lengths(arr, budget, strategy, window=40)
    b = pack_lengths(arr.copy(), budget, strategy, window=40)
    for f in ("seg_doc", "seg_start", "seg_len", "pack_offsets"):
        assert np.array_equal(getattr(a, f), getattr(b, f))


def _realistic(kind: str, n: int, budget: int, rng) -> np.ndarray:
    if kind == "lognormal":
        return np.clip(np.round(rng.lognormal(np.log(budget * 0.15), 1.0, n)), 1, 4 * budget).astype(np.int64)
    if kind == "pareto":
        return np.round((rng.pareto(1.5, n) + 1) * budget / 32).astype(np.int64)
    return rng.integers(1, budget + 1, n)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["lognormal", "pareto", "uniform"]),
       st.sampled_from([256, 512, 2048]), st.integers(500, 4000))
def test_fill_order_on_realistic_distributions(seed, kind, budget, n):
    lengths = _realistic(kind, n, budget, np.random.default_rng(seed))
    fill = {s: pack_lengths(lengths, budget, s).fill for s in ("bfd", "ffd", "sequential")}
    assert fill["bfd"] >= fill["ffd"] >= fill["sequential"]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["lognormal", "pareto", "uniform"]), st.integers(8, 256),
       st.integers(1, 3000))
def test_default_never_needs_more_packs_than_before_and_changes_only_to_save_one(seed, kind, budget, n):
    """One window: bfd ≤ the old default; where it needs as many packs, its plan is the old one unchanged."""
    lengths = np.clip(_realistic(kind, n, budget, np.random.default_rng(seed)), 1, budget)
    plan, before = STRATEGIES["bfd"](lengths, budget), bfd_without_mbs(lengths, budget)
    assert plan.max() <= before.max()
    if plan.max() == before.max():
        assert np.array_equal(plan, before)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=400), st.integers(2, 300), st.integers(1, 40))
def test_mbs_and_repair_put_every_document_in_one_pack_within_budget(lengths, budget, stride):
    ln = np.minimum(np.array(lengths, np.int64), budget)
    for item_bin in (strategies.mbs(ln, budget), repair_packs(ln, budget, strategies.mbs(ln, budget), stride)):
        assert item_bin.shape == ln.shape
        assert np.array_equal(np.unique(item_bin), np.arange(item_bin.max() + 1))   # packs 0..P-1, none empty
        assert np.bincount(item_bin, weights=ln).max() <= budget
    assert repair_packs(ln, budget, strategies.mbs(ln, budget), stride).max() <= strategies.mbs(ln, budget).max()


# 100k documents of packtrain.testing.synthetic_lengths, budget 2048: packs before → now. Pareto and lognormal reach
# the L2 bound; uniform stays above L2 but reaches the LP (Gilmore-Gomory) bound of bench/suites/pack_fill.py
# (seed 2: LP 50,163.0, L2 50,141), so no packer can do better.
FILL_TABLE = [("pareto", 0, 8347, 8345), ("lognormal", 0, 22535, 22534), ("uniform", 2, 50168, 50163)]


@pytest.mark.parametrize("kind,seed,before,now", FILL_TABLE)
def test_fill_on_100k_synthetic_documents(kind, seed, before, now):
    lengths = length_set(kind, 100_000, 2048, seed)
    plan = pack_lengths(lengths, 2048)
    _check_plan(plan, lengths, 2048)
    assert bfd_without_mbs(lengths, 2048).max() + 1 == before                 # one window: the old default
    assert plan.n_packs == now
    if kind != "uniform":
        assert plan.n_packs == l2_bound_packs(lengths, 2048)      # fill against the L2 bound: 1.0


def test_window_carry_keeps_fill_close_to_one_window():
    rng = np.random.default_rng(0)
    lengths = _realistic("lognormal", 20_000, 512, rng)
    whole = pack_lengths(lengths, 512, "bfd", window=len(lengths))
    windowed = pack_lengths(lengths, 512, "bfd", window=2_000)
    assert windowed.n_packs <= whole.n_packs * 1.001
    _check_plan(windowed, lengths, 512)


# (lengths, item → pack within one window, budget, expected reopening order of the packs)
CARRY_TABLE = [
    # [4 4 2] full, [6 3] gap 1: the open pack first
    ([4, 4, 2, 6, 3], [0, 0, 0, 1, 1], 10, [1, 0]),
    # open packs by largest gap (pack 2 gap 5, pack 0 gap 2), then full packs by shortest longest document
    # (pack 3 [5 5] before pack 1 [9 1]); equal keys keep pack order
    ([8, 9, 1, 5, 5, 5], [0, 1, 1, 2, 3, 3], 10, [2, 0, 3, 1]),
    ([5, 5, 5, 5], [0, 0, 1, 1], 10, [0, 1]),
]


@pytest.mark.parametrize("lengths,local,budget,want", CARRY_TABLE)
def test_carry_order_table(lengths, local, budget, want):
    assert carry_order(np.array(lengths), np.array(local), budget).tolist() == want


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=1, max_size=200), st.integers(64, 128))
def test_carry_order_is_open_packs_by_gap_then_full_packs(lengths, budget):
    ln = np.array(lengths, np.int64)
    local = strategies.bfd(ln, budget)
    order = carry_order(ln, local, budget)
    assert sorted(order.tolist()) == list(range(int(local.max()) + 1))   # every pack exactly once
    gap = budget - np.bincount(local, weights=ln).astype(np.int64)[order]
    n_open = int((gap > 0).sum())
    assert (gap[:n_open] > 0).all() and (gap[n_open:] == 0).all()
    assert (np.diff(gap[:n_open]) <= 0).all()


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(200, 3000), st.sampled_from([16, 64, 256]), st.integers(4, 400))
def test_windowed_uniform_plans_are_valid_and_deterministic(seed, n, budget, window):
    """The carry reopens full packs too: still every token once, no pack over budget, same input → same plan."""
    lengths = np.random.default_rng(seed).integers(1, budget + 1, n)
    a = pack_lengths(lengths, budget, "bfd", window=window)
    _check_plan(a, lengths, budget)
    b = pack_lengths(lengths.copy(), budget, "bfd", window=window)
    for f in ("seg_doc", "seg_start", "seg_len", "pack_offsets"):
        assert np.array_equal(getattr(a, f), getattr(b, f))


def test_window_boundaries_cost_no_pack_on_uniform_lengths():
    """Uniform [1, 2048], 60k documents in windows of 20k: reopening full packs of short documents with the
    open ones packs as tightly as one window (30,032 packs; open packs alone: 30,034; L2 bound 30,019)."""
    lengths = np.random.default_rng(0).integers(1, 2049, 60_000)
    whole = pack_lengths(lengths, 2048, "bfd", window=len(lengths))
    windowed = pack_lengths(lengths, 2048, "bfd", window=20_000)
    assert windowed.n_packs <= whole.n_packs
    _check_plan(windowed, lengths, 2048)


@pytest.mark.parametrize("kwargs,match", [
    ({"budget": 1}, "budget 1"),
    ({"strategy": "worst"}, "strategy 'worst'"),
    ({"overlong": "drop"}, "overlong 'drop'"),
    ({"window": 0}, "window 0"),
])
def test_bad_arguments(kwargs, match):
    args = {"lengths": np.array([3, 4]), "budget": 8, **kwargs}
    with pytest.raises(ValueError, match=match):
        pack_lengths(**args)


@pytest.mark.parametrize("lengths,match", [
    (np.array([3, 0, 4]), "length < 1"),
    (np.array([[1, 2]]), "1-D integer"),
    (np.array([1.5, 2.0]), "1-D integer"),
])
def test_bad_lengths(lengths, match):
    with pytest.raises(ValueError, match=match):
        pack_lengths(lengths, 8)
