"""The MLflow 3 UI opens packtrain's experiment in its training view: the experiment carries
mlflow.experimentKind = custom_model_development (set on creation, added to one that lacks it, a user's own kind
kept)."""

from __future__ import annotations

from mlflow import MlflowClient

from packtrain.config import load_run_config
from packtrain.tracking import stage_run
from packtrain.tracking.apply import EXPERIMENT_KIND, TRAINING_KIND


def test_packtrains_experiments_open_in_the_training_view(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_run_config("tiny-cpu", [f"workdir={tmp_path}", f"tracking.tracking_uri={uri}",
                                       "tracking.system_metrics=false", "tracking.experiment=fresh"])
    with stage_run("ingest", cfg) as run:
        run.log_metrics({"documents": 1.0})
    c = MlflowClient(uri)
    assert c.get_experiment_by_name("fresh").tags[EXPERIMENT_KIND] == TRAINING_KIND
    old = c.create_experiment("older")                       # made before packtrain set the kind
    mine = c.create_experiment("mine", tags={EXPERIMENT_KIND: "genai_development"})   # the user's choice
    for name in ("older", "mine"):
        with stage_run("ingest", cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"experiment": name})})):
            pass
    assert c.get_experiment(old).tags[EXPERIMENT_KIND] == TRAINING_KIND
    assert c.get_experiment(mine).tags[EXPERIMENT_KIND] == "genai_development"
