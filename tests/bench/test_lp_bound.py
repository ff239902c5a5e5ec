"""bench/lp_bound.py: the certified LP lower bound lies between L2 and every plan, and proves uniform lengths
optimal where L2 cannot."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.lp_bound import lp_bound_packs
from packtrain.packing.bins import l2_bound_packs, pack_lengths
from packtrain.testing.synthetic_lengths import length_set


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=60), st.integers(6, 40))
def test_lp_bound_is_between_l2_and_every_plan(lengths, budget):
    """(Against the brute-force optimum on tiny inputs: tests/unit/test_pack_plan.py.)"""
    arr = np.array(lengths, np.int64)
    lp = lp_bound_packs(arr, budget)
    plans = [pack_lengths(arr, budget, s).n_packs for s in ("bfd", "mbs", "ffd", "sequential")]
    assert l2_bound_packs(arr, budget) <= lp["bound"] <= min(plans)
    assert lp["value"] <= lp["lp_master"] + 1e-6


@pytest.mark.parametrize("lengths,budget,bound", [
    ([8, 8, 8, 3, 3], 10, 4),        # as L2: no 8 takes a 3
    ([6, 6, 6, 5, 5, 5], 11, 3),     # three 6 + 5 pairs
    ([25, 3], 10, 3),                # 2 full chunks + the remainder 5 with the 3
])
def test_lp_bound_table(lengths, budget, bound):
    assert lp_bound_packs(np.array(lengths), budget)["bound"] == bound


def test_uniform_100k_is_packed_optimally_although_below_l2_by_20_packs():
    lengths = length_set("uniform", 100_000, 2048)
    lp = lp_bound_packs(lengths, 2048)
    assert (l2_bound_packs(lengths, 2048), lp["bound"]) == (49_979, 49_999)
    assert pack_lengths(lengths, 2048).n_packs == lp["bound"]
