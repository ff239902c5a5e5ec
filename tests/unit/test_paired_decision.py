"""The promotion decision as tables: paired bootstrap, Holm across suites, the verdict → the alias."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtrain.config.evaluate import PromotionConfig
from packtrain.evaluate.promotion import bootstrap, decide_promotion
from packtrain.registry.champion import CHALLENGER, CHAMPION, decide_from_verdict

CFG = PromotionConfig(resamples=500)


def _text(name, role, ch, cp, nbytes=None):
    b = np.asarray(nbytes if nbytes is not None else [1000] * len(ch))
    col = lambda nll: {"nll": np.asarray(nll, float), "tokens": np.full(len(nll), 100), "bytes": b,  # noqa: E731
                       "acc": np.full(len(nll), np.nan)}
    return {"suite": name, "role": role, "kind": "text", "md5": "m", "challenger": col(ch), "champion": col(cp),
            "same_tokenizer": True}


def _task(name, ch, cp):
    col = lambda a: {"nll": np.full(len(a), np.nan), "tokens": np.zeros(len(a)), "bytes": np.zeros(len(a)),  # noqa: E731
                     "acc": np.asarray(a, float)}
    return {"suite": name, "role": "task", "kind": "task", "md5": "m", "challenger": col(ch), "champion": col(cp)}


RNG = np.random.default_rng(0)
BASE = 700 + 50 * RNG.random(40)


def test_bootstrap_is_seeded_and_exact_for_zero_differences():
    x = np.arange(30.0)
    assert np.array_equal(bootstrap(x, None, 200, [0, 1]), bootstrap(x, None, 200, [0, 1]))
    assert not np.array_equal(bootstrap(x, None, 200, [0, 1]), bootstrap(x, None, 200, [1, 1]))
    assert set(bootstrap(np.zeros(9), np.ones(9), 100, [0, 0])) == {0.0}
    r = bootstrap(x, np.full(30, 2.0), 2000, [0, 0])              # ratio: Σ x / Σ 2 = mean(x) / 2 = 7.25
    assert abs(r.mean() - 7.25) < 0.1 and r.std() > 0


@pytest.mark.parametrize("case, promote, needle", [
    ("identical", False, "recent (primary) not improved"),
    ("better", True, "promoted over v3"),
    ("better_but_forgets", False, "replay (regression) not non-inferior"),
    ("better_but_task_drops", False, "arith (task) not non-inferior"),
    ("only_regressions", False, "no primary suite"),
])
def test_verdict_table(case, promote, needle):
    better = BASE - 8 - RNG.random(40)
    suites = {
        "identical": [_text("recent", "primary", BASE, BASE)],
        "better": [_text("recent", "primary", better, BASE), _text("replay", "regression", BASE, BASE),
                   _task("arith", [1, 0] * 50, [1, 0] * 50)],
        "better_but_forgets": [_text("recent", "primary", better, BASE), _text("replay", "regression", BASE + 30, BASE)],
        "better_but_task_drops": [_text("recent", "primary", better, BASE),
                                  _task("arith", [0] * 30 + [1] * 70, [1] * 100)],
        "only_regressions": [_text("replay", "regression", BASE, BASE)],
    }[case]
    v = decide_promotion(suites, CFG, "v3", True)
    assert v.promote is promote and needle in v.reason, v.reason
    if case == "identical":
        d = v.suites[0]
        assert (d.delta, d.ci_low, d.ci_high, d.upper, d.p_value) == (0.0, 0.0, 0.0, 0.0, 1.0)
    if case == "better":
        assert sorted(d.level for d in v.suites) == pytest.approx([0.95, 1 - 0.05 / 2, 1 - 0.05 / 3])
        assert all(d.upper < d.threshold for d in v.suites)


def test_bits_per_byte_weights_documents_by_bytes():
    # challenger loses 10 nats on a 100-byte document and gains 10 on a 10,000-byte one: Δ is exactly 0
    v = decide_promotion([_text("recent", "primary", [110, 990], [100, 1000], [100, 10000])], CFG, "v3", True)
    assert v.suites[0].delta == 0.0 and v.suites[0].unit == "bits/byte"


def test_first_champion_is_scored_alone():
    s = _text("recent", "primary", BASE, BASE)
    s["champion"] = None
    v = decide_promotion([s], CFG, None, None)
    assert v.promote and v.reason.startswith("first champion") and v.suites[0].delta is None


@settings(max_examples=25, deadline=None)
@given(shift=st.floats(-20, 20), extra=st.floats(0, 20))
def test_worse_on_the_regression_suite_never_promotes_more(shift, extra):
    better = BASE - 10
    a = decide_promotion([_text("recent", "primary", better, BASE), _text("replay", "regression", BASE + shift, BASE)],
                         CFG, "v3", True)
    b = decide_promotion([_text("recent", "primary", better, BASE),
                          _text("replay", "regression", BASE + shift + extra, BASE)], CFG, "v3", True)
    assert not (b.promote and not a.promote)


@pytest.mark.parametrize("promotion, had, champion, expected, needle", [
    (None, False, None, CHAMPION, "first champion"),
    (None, True, "3", CHALLENGER, "no paired evaluation"),
    ({"promote": True, "against": None, "reason": "r"}, False, None, CHAMPION, "first champion"),
    ({"promote": True, "against": None, "reason": "r"}, True, "3", CHALLENGER, "evaluated with no champion"),
    ({"promote": True, "against": "v3", "reason": "ok"}, True, "3", CHAMPION, "ok"),
    ({"promote": False, "against": "v3", "reason": "replay regressed"}, True, "3", CHALLENGER, "replay regressed"),
    ({"promote": True, "against": "v3", "reason": "ok"}, True, "5", CHALLENGER, "evaluated against v3, but v5"),
])
def test_verdict_to_alias(promotion, had, champion, expected, needle):
    decision, reason = decide_from_verdict(promotion, had, champion)
    assert decision == expected and needle in reason
