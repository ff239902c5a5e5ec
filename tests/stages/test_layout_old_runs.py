"""A champion registered by an older packtrain stays comparable with runs in today's MLflow layout (docs/tracking.md,
"The MLflow layout"): the gate and `packtrain compare` read both under the same canonical names, in a real sqlite
store.

    old tree   pipeline run "pipeline" (train.* finals) + train run with the finals again (throughput.*, summary.*),
               every per-step series, system.utilization_pct at step = ms; version 1's run is its register run
    new tree   pipeline run "tiny-cpu · data 791d2730" with the finals; train run with 3 charts, system/train_* at
               their sample time, summary.json; version 2's run is its train run
"""

from __future__ import annotations

import json

from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from packtrain.cli import main

T0 = 1_700_000_000_000
STEPS = 10
FINALS = {"throughput.real_tokens_per_s": 8000.0, "throughput.useful_mfu": 0.02, "throughput.dense_mfu": 0.025,
          "throughput.step_time_p50_s": 0.016, "throughput.data_wait_frac": 0.01, "throughput.padding": 0.001,
          "throughput.slot_tokens_per_s": 8010.0, "system.utilization": 0.55, "memory.peak_alloc_gib": 0.0,
          "memory.peak_reserved_gib": 0.0, "memory.cpu_peak_rss_gib": 0.66, "final_loss": 4.0}


def _run(c, exp, name, parent=None, stage=None, tags=None):
    t = {"packtrain.kind": "stage" if stage else "pipeline", **(tags or {})}
    if stage:
        t.update({"packtrain.stage": stage, "mlflow.parentRunId": parent})
    return c.create_run(exp, run_name=name, tags=t).info.run_id


def _old_tree(c, exp) -> tuple[str, str, str]:
    parent = _run(c, exp, "pipeline")
    train = _run(c, exp, "train", parent, "train")
    register = _run(c, exp, "register", parent, "register")
    m = [Metric(f"train.{k}", v, T0, 0) for k, v in FINALS.items()]
    c.log_batch(parent, metrics=m)
    series = [Metric(k, v + 0.001 * s, T0 + s, s) for s in range(1, STEPS + 1) for k, v in
              (("loss", 5.0 - 0.1 * s), ("real_tokens_per_s", 8000.0), ("useful_mfu", 0.02), ("dense_mfu", 0.025),
               ("step_time_s", 0.016), ("lr", 1e-3))]
    series += [Metric("system.utilization_pct", 55.0, T0 + k, 500 * k) for k in range(6)]   # step = ms
    finals = [Metric(k, v, T0, 0) for k, v in FINALS.items()]
    finals += [Metric(f"summary.{k.split('.')[-1]}", v, T0, 0) for k, v in FINALS.items() if "." in k]
    c.log_batch(train, metrics=series + finals)
    return parent, train, register


def _new_tree(c, exp) -> tuple[str, str]:
    parent = _run(c, exp, "tiny-cpu · data 791d2730")
    train = _run(c, exp, "train", parent, "train")
    c.log_batch(parent, metrics=[Metric(f"train.{k}", v * (1.01 if "tokens" in k else 1.0), T0, 0)
                                 for k, v in FINALS.items()])
    series = [Metric(k, v, T0 + s, s) for s in range(1, STEPS + 1) for k, v in
              (("loss", 5.0 - 0.1 * s), ("real_tokens_per_s", 8080.0), ("useful_mfu", 0.02))]
    series += [Metric("system/train_utilization_percentage", 56.0, T0 + 500 * k, k) for k in range(6)]
    c.log_batch(train, metrics=series)
    return parent, train


def test_an_old_champion_is_gated_and_compared_against_a_run_in_todays_layout(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = MlflowClient(uri)
    exp = c.create_experiment("packtrain", artifact_location=str(tmp_path / "artifacts"))
    old_parent, old_train, old_register = _old_tree(c, exp)
    new_parent, new_train = _new_tree(c, exp)
    c.create_registered_model("lm")
    v1 = c.create_model_version("lm", source=str(tmp_path / "m1"), run_id=old_register,   # the old way
                                tags={"packtrain.train_run_id": old_train})
    c.set_registered_model_alias("lm", "champion", v1.version)
    for rid in (old_parent, old_train, old_register, new_parent, new_train):
        c.log_batch(rid, tags=[RunTag("packtrain.gpu", "cpu")])
        c.set_terminated(rid)

    out = tmp_path / "gate"
    code = main(["gate", "--set", f"tracking.tracking_uri={uri}", "--candidate", new_parent[:8],
                 "--baseline", "lm@champion", "--out", str(out)])
    res = json.loads((out / "gate.json").read_text())
    assert code == 0 and res["verdict"] == "PASS" and res["missing"] == [], res
    rows = {r["metric"]: r for r in res["rows"]}
    tps = rows["train.throughput.real_tokens_per_s"]   # the old run's train-run final, the new run's pipeline final
    assert (tps["baseline"], tps["candidate"]) == (8000.0, 8080.0)
    assert rows["train.system.utilization"]["baseline"] == rows["train.system.utilization"]["candidate"] == 0.55

    cmp = tmp_path / "cmp"
    assert main(["compare", "lm@champion", new_parent[:8], "--no-log", "--set", f"tracking.tracking_uri={uri}",
                 "--out", str(cmp)]) == 0
    saved = json.loads((cmp / "compare.json").read_text())
    assert [r["train_run_id"] for r in saved["runs"]] == [old_train, new_train]
    assert [r["name"] for r in saved["runs"]] == ["pipeline", "tiny-cpu · data 791d2730"]
    # each run's utilization series under its own name, both on a seconds axis
    assert saved["curves"]["utilization"] == ["system/train_utilization_percentage", "system.utilization_pct"]
    old_util, new_util = saved["histories"]["system.utilization_pct"][0], \
        saved["histories"]["system/train_utilization_percentage"][1]
    assert [x for x, _ in old_util] == [x for x, _ in new_util] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert saved["curves"]["loss"] == ["loss"] and saved["curves"]["tokens/s"][0] == "real_tokens_per_s"
    capsys.readouterr()
