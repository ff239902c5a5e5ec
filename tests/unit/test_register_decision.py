"""The champion/challenger rule and the lineage lookup: literal tables + a property."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packtrain.evaluate.lineage import collect_lineage
from packtrain.evaluate.register import CHALLENGER, CHAMPION, decide_alias
from packtrain.stages.results import Lineage, TrainResult

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


def _train(lineage: Lineage, throughput: dict, memory: dict, fill: float | None) -> TrainResult:
    return TrainResult(
        steps=2, start_step=0, tokens=10, label_tokens=9, slot_tokens=12, final_loss=3.0, loss_curve=[3.5, 3.0],
        lr_curve=[1e-3, 1e-3], skipped_steps=0, compiles=None, recompiles=None, timings={}, throughput=throughput,
        memory=memory, system={}, violations=[], telemetry_files=[], setup={}, params={}, model_dir=None,
        checkpoint=None, packing_fill=fill, lineage=lineage)


def test_collect_lineage_reads_one_declared_key_each():
    lin = Lineage(git_sha="abc", code_version="0.1.0+gabc", input_md5={"packs": "p"}, data_version="aaa",
                  tokenizer_hash="sha256:t")
    ev = {"lineage": {**lin.to_dict(), "git_sha": "def", "data_version": "bbb"}}
    gpu = _train(lin, {"useful_mfu": 0.4}, {"peak_alloc_gib": 12.5, "cpu_peak_rss_gib": 3.0}, 0.997)
    values, origin, missing = collect_lineage(gpu.to_dict(), ev, checkout_sha="zzz")
    assert values == {"dataset_md5": "aaa", "git_sha": "abc", "code_version": "0.1.0+gabc",
                      "tokenizer_hash": "sha256:t", "packing_fill": 0.997, "mfu": 0.4, "peak_memory_gib": 12.5}
    assert origin["dataset_md5"] == "train_result:lineage.data_version" and missing == []
    values, origin, missing = collect_lineage(None, ev, checkout_sha="zzz")
    assert (values["dataset_md5"], values["git_sha"], origin["git_sha"]) == ("bbb", "def", "eval_result:lineage.git_sha")
    assert missing == ["packing_fill", "mfu", "peak_memory_gib"]
    cpu = _train(Lineage(git_sha=None, code_version="0.1.0", input_md5={}, data_version=None),
                 {"useful_mfu": 0.0}, {"peak_alloc_gib": 0.0, "cpu_peak_rss_gib": 1.7}, None)
    values, origin, missing = collect_lineage(cpu, None)
    assert values == {"code_version": "0.1.0", "peak_memory_gib": 1.7}
    assert missing == ["dataset_md5", "git_sha", "tokenizer_hash", "packing_fill", "mfu"]
