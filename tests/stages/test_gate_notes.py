"""What the gate says besides its verdicts, on a real sqlite MLflow store: a metric that was 0 in the baseline is
"new (was 0)" with both numbers (never "rose inf"), and a candidate whose model is the champion's (the same
training run, or its copy from the stage cache) passes with the note "same model as the champion"."""

from __future__ import annotations

from mlflow import MlflowClient

from packtrain.gate import evaluate_gate, load_source
from packtrain.gate.metric_sources import MetricSource
from packtrain.gate.rules import Rule, Rules


def _pipeline(c: MlflowClient, exp: str, metrics: dict, restored_from: str | None = None) -> tuple[str, str]:
    """A `packtrain run` tree as the gate reads it: the pipeline run and its train stage run."""
    parent = c.create_run(exp, run_name="tiny-cpu · data 1234abcd", tags={"packtrain.kind": "pipeline",
                                                                          "packtrain.gpu": "cpu"})
    tags = {"packtrain.kind": "stage", "packtrain.stage": "train", "mlflow.parentRunId": parent.info.run_id,
            "packtrain.gpu": "cpu", **({"packtrain.restored_from": restored_from} if restored_from else {})}
    train = c.create_run(exp, run_name="train", tags=tags)
    for k, v in metrics.items():
        c.log_metric(parent.info.run_id, k, v)
    for r in (train, parent):
        c.set_terminated(r.info.run_id)
    return parent.info.run_id, train.info.run_id


def test_champion_gated_against_itself_passes_with_a_note(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = MlflowClient(uri)
    exp = c.create_experiment("gate-notes")
    numbers = {"train.final_loss": 4.2, "pack.fill": 0.97}
    first, first_train = _pipeline(c, exp, numbers)
    c.create_registered_model("lm")
    mv = c.create_model_version("lm", f"runs:/{first_train}/model", run_id=first_train, tags={"packtrain.train_run_id": first_train})
    c.set_registered_model_alias("lm", "champion", mv.version)
    cached, _ = _pipeline(c, exp, numbers, restored_from=first_train)   # a rerun whose train came from the cache
    retrained, _ = _pipeline(c, exp, numbers)                            # a rerun that trained again
    champion = load_source("lm@champion", uri)
    for cand, same in ((first, True), (cached, True), (retrained, False)):
        result = evaluate_gate(load_source(cand, uri), champion)
        assert result.exit_code == 0, result.table()
        note = [n for n in result.notes if n.startswith("same model as the champion")]
        assert bool(note) == same, (cand, result.notes)
        if same:
            assert f"note: {note[0]}" in result.table() and f"**Note:** {note[0]}" in result.markdown()
            assert result.to_dict()["notes"] == note and first_train[:8] in note[0]


def test_a_metric_that_was_zero_is_new_not_inf():
    rules = Rules(exact={"train.guard.fallbacks_total": Rule("train.guard.fallbacks_total", "lower", max_rise=0.05)},
                  patterns=(), source="test", builtin=False)
    base = MetricSource("file base.json", {"train.guard.fallbacks_total": 0.0})
    cand = MetricSource("file cand.json", {"train.guard.fallbacks_total": 3.0})
    result = evaluate_gate(cand, base, rules)
    (row,) = result.rows
    assert result.exit_code == 1 and row.reason == "rose to 3 from 0 (new: the baseline was 0)", row
    table = result.table()
    assert "new (was 0)" in table and "inf" not in table, table
    assert "inf" not in result.markdown()
