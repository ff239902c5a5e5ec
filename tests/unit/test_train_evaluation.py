"""Early-stopping state from a run's history, and retention by held-out loss (literal tiny inputs)."""

from __future__ import annotations

import math

import pytest

from packtrain.config.train import EarlyStoppingConfig
from packtrain.train.evaluation import EarlyStop, early_stop


def _h(*pairs):
    """History records: every step has a loss; the listed (step, eval_loss) pairs were evaluated."""
    evals = dict(pairs)
    last = max(evals) if evals else 0
    return [{"step": s, "loss": 1.0, **({"eval_loss": evals[s]} if s in evals else {})} for s in range(1, last + 1)]


@pytest.mark.parametrize("pairs,cfg,expected", [
    ([], None, EarlyStop(None, None, 0, False)),
    ([(2, 3.0), (4, 2.5), (6, 2.7)], None, EarlyStop(4, 2.5, 1, False)),                  # no early stopping
    ([(2, 3.0), (4, 2.5), (6, 2.7)], EarlyStoppingConfig(patience=2), EarlyStop(4, 2.5, 1, False)),
    ([(2, 3.0), (4, 2.5), (6, 2.7), (8, 2.6)], EarlyStoppingConfig(patience=2), EarlyStop(4, 2.5, 2, True)),
    ([(2, 3.0), (4, 3.0)], EarlyStoppingConfig(patience=1), EarlyStop(2, 3.0, 1, True)),   # a tie does not improve
    # min_delta: 2.98 is the lowest (exported) but not an improvement by more than 0.05
    ([(10, 3.0), (20, 2.98), (30, 3.1)], EarlyStoppingConfig(patience=2, min_delta=0.05), EarlyStop(20, 2.98, 2, True)),
    ([(2, math.nan), (4, 3.0)], EarlyStoppingConfig(patience=1), EarlyStop(4, 3.0, 0, False)),   # nan never improves
])
def test_early_stop(pairs, cfg, expected):
    assert early_stop(_h(*pairs), cfg) == expected


def test_retention_keeps_the_lowest_eval_loss_when_manifests_have_one(tmp_path):
    from packtrain.train import checkpoint as ck
    from packtrain.train.checkpoint_manifest import manifest_loss

    root = tmp_path / "checkpoints"
    # train loss falls all along (keep_best by interval_loss would keep the newest); eval loss is lowest at 10
    for step, ev in {5: 3.0, 10: 2.4, 15: 2.9, 20: None, 25: 3.1}.items():
        hist = [{"step": s, "loss": 5.0 - s / 10, **({"eval_loss": ev} if s == step and ev is not None else {})}
                for s in range(1, step + 1)]
        ck.save_checkpoint(root, step, {"history": hist}, lambda d: (d / "w.bin").write_bytes(b"x"), keep_last=2,
                           keep_best=True)
    assert sorted(p.name for _, p in ck.list_checkpoints(root)) == ["step_000010", "step_000020", "step_000025"]
    assert manifest_loss(root / "step_000010", "eval_loss") == 2.4
    assert manifest_loss(root / "step_000020", "eval_loss") is None   # not evaluated: no eval_loss key
