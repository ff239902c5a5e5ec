"""The champion/challenger rule and the lineage lookup: literal tables + a property."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packtrain.evaluate.lineage import collect_lineage, find_key, lineage_subset
from packtrain.evaluate.register import CHALLENGER, CHAMPION, decide_alias

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("candidate, champion, margin, has, expected", [
    (5.0, None, 0.0, False, CHAMPION),      # first version
    (3.9, 4.0, 0.0, True, CHAMPION),        # better
    (4.0, 4.0, 0.0, True, CHALLENGER),      # a tie does not move the alias
    (4.1, 4.0, 0.0, True, CHALLENGER),      # worse
    (3.97, 4.0, 0.01, True, CHALLENGER),    # better, but not by 1 %: threshold 3.96
    (3.95, 4.0, 0.01, True, CHAMPION),      # better by more than 1 %
    (NAN, 4.0, 0.0, True, CHALLENGER),      # a diverged run never becomes champion
    (NAN, None, 0.0, False, CHALLENGER),    # ... not even the first one
    (INF, None, 0.0, False, CHALLENGER),
    (3.0, NAN, 0.0, True, CHAMPION),        # a broken champion is replaced
    (3.0, None, 0.0, True, CHALLENGER),     # champion without a recorded metric: kept
])
def test_decide_alias_table(candidate, champion, margin, has, expected):
    decision, reason, threshold = decide_alias(candidate, champion, margin, has)
    assert decision == expected
    assert reason
    if has and champion is not None and math.isfinite(champion) and math.isfinite(candidate):
        assert threshold == pytest.approx(champion * (1 - margin))
        assert f"{champion:.6g}" in reason and f"{candidate:.6g}" in reason   # both numbers


@given(c=st.floats(0.01, 100), champ=st.floats(0.01, 100), margin=st.floats(0, 0.5))
def test_champion_iff_better_by_margin(c, champ, margin):
    assert (decide_alias(c, champ, margin)[0] == CHAMPION) == (c < champ * (1 - margin))


@given(c=st.floats(0.01, 100), champ=st.floats(0.01, 100), m1=st.floats(0, 0.5), m2=st.floats(0, 0.5))
def test_larger_margin_never_promotes_more(c, champ, m1, m2):
    lo, hi = sorted((m1, m2))
    if decide_alias(c, champ, hi)[0] == CHAMPION:
        assert decide_alias(c, champ, lo)[0] == CHAMPION


@pytest.mark.parametrize("stats, names, expected", [
    ({"fill": 0.99}, ("fill",), ("fill", 0.99)),
    ({"train": {"fill": 0.998}, "eval": {"fill": 0.9}}, ("train.fill", "fill"), ("train.fill", 0.998)),
    ({"eval": {"fill": 0.9}}, ("train.fill", "fill"), ("eval.fill", 0.9)),
    ({"summary": {"useful_mfu": 0.41, "dense_mfu": 0.5}}, ("useful_mfu", "mfu"), ("summary.useful_mfu", 0.41)),
    ({"prefill": 3}, ("fill",), None),       # suffix match on a dotted boundary only
    ({"input_md5": None}, ("input_md5",), None),
    (None, ("fill",), None),
])
def test_find_key_table(stats, names, expected):
    assert find_key(stats, names) == expected


def test_collect_lineage_prefers_train_result_and_lists_missing():
    train = {"input_md5": "aaa", "summary": {"useful_mfu": 0.4, "peak_alloc_gib": 12.5}, "git_sha": "abc"}
    pack = {"input_md5": "bbb", "train": {"fill": 0.997}, "eval": {"fill": 0.95}}
    values, origin, missing = collect_lineage({"train_result": train, "pack_stats": pack}, checkout_sha="zzz")
    assert values == {"dataset_md5": "aaa", "git_sha": "abc", "packing_fill": 0.997, "mfu": 0.4,
                      "peak_memory_gib": 12.5}
    assert origin["packing_fill"] == "pack_stats:train.fill" and missing == []
    values, origin, missing = collect_lineage({"train_result": None, "pack_stats": pack}, checkout_sha="zzz")
    assert values["dataset_md5"] == "bbb" and values["git_sha"] == "zzz" and origin["git_sha"] == "checkout"
    assert missing == ["mfu", "peak_memory_gib"]
    cpu_train = {"throughput": {"useful_mfu": 0.0}, "memory": {"peak_alloc_gib": 0.0, "cpu_peak_rss_gib": 1.7}}
    values, origin, missing = collect_lineage({"train_result": cpu_train, "pack_stats": None})
    assert values == {"peak_memory_gib": 1.7} and origin["peak_memory_gib"] == "train_result:memory.cpu_peak_rss_gib"
    assert missing == ["dataset_md5", "git_sha", "packing_fill", "mfu"]
    assert lineage_subset(pack) == {"input_md5": "bbb", "train.fill": 0.997, "eval.fill": 0.95}
