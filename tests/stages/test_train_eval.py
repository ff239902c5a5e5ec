"""train.eval_every_steps + train.early_stopping through the real CLI on CPU: a tiny model at a high learning
rate whose held-out loss stops improving stops within `patience` evaluations, model/ holds exactly the
lowest-eval_loss checkpoint's weights, eval_loss is an MLflow metric at its steps and in train_log.jsonl, and
evaluating does not change the training loss by a bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packtrain.cli import main

V = 128
EVERY, PATIENCE, MAX_STEPS = 2, 2, 40
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "train.rows=2",
        "train.warmup_steps=0", "train.lr=0.05", "train.min_lr_ratio=1.0", "train.threads=1",
        "telemetry.interval_s=5", "evaluate.rows=2"]   # constant LR: the schedule does not depend on max_steps
EVAL = [f"train.eval_every_steps={EVERY}", f"train.early_stopping.patience={PATIENCE}"]


def _args(data: Path, out: Path, *sets: str, tracking: bool = False) -> list[str]:
    sets = (*TINY, *sets, f"workdir={data / 'work'}", f"tracking.enabled={str(tracking).lower()}")
    return ["train", "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out", str(out),
            *[x for s in sets for x in ("--set", s)]]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("train_eval_data")
    make_synthetic_inputs(root, n_docs=30, vocab_size=V, budget=128, seed=1)
    return root


@pytest.fixture(scope="module")
def stopped(data, tmp_path_factory):
    """Evaluated every 2 steps, patience 2, tracked in MLflow (sqlite in tmp)."""
    out = tmp_path_factory.mktemp("stopped") / "train"
    with pytest.MonkeyPatch.context() as mp:   # module scope: the autouse env isolation is not active yet
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("PACKTRAIN_PARENT_RUN_ID", raising=False)
        assert main(_args(data, out, *EVAL, f"train.max_steps={MAX_STEPS}", tracking=True)) == 0
    return out


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def test_stops_within_patience_and_exports_the_best_checkpoint(stopped):
    import torch

    r = json.loads((stopped / "train_result.json").read_text())
    ev = r["evaluation"]
    curve = [(c["step"], c["eval_loss"]) for c in ev["curve"]]
    steps = [s for s, _ in curve]
    assert ev["early_stopped"] and r["steps"] == ev["stopped_at"] < MAX_STEPS
    assert steps == list(range(EVERY, r["steps"] + 1, EVERY))
    best_step, best = min(curve, key=lambda c: (c[1], c[0]))
    assert (ev["best_step"], ev["best_eval_loss"], ev["exported_step"]) == (best_step, best, best_step)
    assert ev["stopped_at"] - best_step == PATIENCE * EVERY        # the evaluations after the best: patience
    assert all(loss >= best for s, loss in curve if s > best_step)
    log = [json.loads(x) for x in (stopped / "train_log.jsonl").read_text().splitlines()]
    assert [(h["step"], h["eval_loss"]) for h in log if "eval_loss" in h] == curve
    assert [h["step"] for h in log] == list(range(1, r["steps"] + 1))

    ckpt = stopped / "checkpoints" / f"step_{best_step:06d}"
    assert json.loads((ckpt / "manifest.json").read_text())["eval_loss"] == best
    exported, saved = _tensors(stopped / "model" / "model.safetensors"), _tensors(ckpt / "model.safetensors")
    tied = {"lm_head.weight": "model.embed_tokens.weight"}   # tied embedding: stored once, under either name
    norm = {k: tied.get(k, k) for k in ("lm_head.weight",)}
    exported = {norm.get(k, k): t for k, t in exported.items()}
    saved = {norm.get(k, k): t for k, t in saved.items()}
    assert set(exported) == set(saved) and len(saved) == 20
    assert all(torch.equal(exported[k], saved[k]) for k in saved)


def test_eval_loss_is_an_mlflow_metric_at_its_steps(stopped, data):
    import mlflow

    r = json.loads((stopped / "train_result.json").read_text())
    client = mlflow.MlflowClient(f"sqlite:///{data / 'work' / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("packtrain").experiment_id])[0]
    hist = client.get_metric_history(run.info.run_id, "eval_loss")
    assert [(m.step, m.value) for m in sorted(hist, key=lambda m: m.step)] == [
        (c["step"], c["eval_loss"]) for c in r["evaluation"]["curve"]]
    # a train run of its own keeps its final numbers as metrics, under the keys of train_result.json
    assert run.data.metrics["evaluation.best_eval_loss"] == r["evaluation"]["best_eval_loss"]
    assert run.data.metrics["evaluation.best_step"] == r["evaluation"]["best_step"]
    assert "eval_perplexity" not in run.data.metrics   # exp(eval_loss): train_log.jsonl, not a second chart
    (ds,) = [d for d in run.inputs.dataset_inputs if d.dataset.name == "eval_packs"]   # what it evaluates on
    assert [t.value for t in ds.tags if t.key == "mlflow.data.context"] == ["eval"]


def test_evaluating_does_not_change_the_training_loss(stopped, data, tmp_path):
    """The same run without evaluation, to the step the evaluated one stopped at: the same losses, bit for bit."""
    r = json.loads((stopped / "train_result.json").read_text())
    out = tmp_path / "plain"
    assert main(_args(data, out, f"train.max_steps={r['steps']}")) == 0
    plain = json.loads((out / "train_result.json").read_text())
    assert plain["loss_curve"] == r["loss_curve"] and plain["evaluation"] is None
    assert not any("eval_loss" in json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines())


@pytest.mark.parametrize("sets,fragment", [
    (["train.early_stopping.patience=2"], "train.early_stopping needs train.eval_every_steps > 0"),
    (["train.eval_every_steps=2", "train.engine=deepspeed"], "train.eval_every_steps runs on train.engine=torch"),
])
def test_refused_settings(data, tmp_path, capsys, sets, fragment):
    assert main(_args(data, tmp_path / "t", "train.max_steps=2", *sets)) == 2
    assert fragment in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_no_eval_packs_is_refused_before_training(data, tmp_path, capsys):
    import shutil

    packs = tmp_path / "pack"
    shutil.copytree(data / "pack" / "train", packs / "train")
    args = _args(data, tmp_path / "t", "train.max_steps=2", "train.eval_every_steps=2")
    args[args.index("--packs") + 1] = str(packs)
    assert main(args) == 5
    assert "does not exist: pack with tokenize.eval_fraction > 0" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
