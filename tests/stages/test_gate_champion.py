"""`packtrain gate --baseline NAME@champion` on the CPU, default rules, against a real `mlflow server` (the
session's `mlflow_server`; this module's own experiment and model name): three pipeline run trees made by the
real stage CLIs (ingest → tokenize once, then pack → train → evaluate → register under a pipeline run each, as
`packtrain run` nests them, train in its own process; bench/suites/gate_noise.py's `run_tree`, which measured the
`--trees` session of bench/baselines/noise-cpu.json the default CPU rules come from):

    a   tiny corpus, tiny-cpu, budget 512, 12 steps          → gate-champion-lm v1, champion
    b   the same again (an unchanged rerun)                   → v1 again: the same weights and lineage are
                                                                registered once (no new version)
    c   pack.strategy=sequential (fill 96.5% → 81.2%: slower on purpose), 36 steps (a better loss), with
        register.gate on as a scheduled run has it           → promoted over v1 by the paired evaluation, fails the gate: v2 challenger

The gate reads each side as its run tree under the canonical names (docs/metrics.md): the alias resolves to
the training run of v1 (before: the register run, which has no throughput metrics → exit 2).
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from packtrain.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:telemetry threshold violated")]

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gate_noise", REPO / "bench" / "suites" / "gate_noise.py")
gate_noise = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gate_noise)
NAME = "gate-champion-lm"
SEPARATE = ["tracking.experiment=gate-champion", f"register.model_name={NAME}"]   # apart on the shared server


@pytest.fixture(scope="module")
def trees(mlflow_server, tmp_path_factory):
    """The data stages once, then trees a, b, c (module doc) by bench/suites/gate_noise.py's run_tree, the same code
    that measured bench/baselines/noise-cpu.json's `--trees` session."""
    from packtrain.tracking.run_lifecycle import _close_clients

    root = tmp_path_factory.mktemp("gate_champion")
    t0 = time.perf_counter()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
        mp.chdir(root)
        corpus, tokens, base, data_run = gate_noise.data_tree(root, SEPARATE)
        runs = {"a": gate_noise.run_tree(root, "a", base, tokens), "b": gate_noise.run_tree(root, "b", base, tokens),
                "c": gate_noise.run_tree(root, "c", [*base, "pack.strategy=sequential", "train.max_steps=36",
                                                     "register.gate=true"], tokens)}
        _close_clients()
    runs.update(uri=mlflow_server.uri, root=root, corpus=corpus, data_tree=data_run,
                seconds=time.perf_counter() - t0, client=MlflowClient(mlflow_server.uri))
    print(f"\nthree run trees (+ the data stages) in {runs['seconds']:.0f} s")
    return runs


def _gate(trees, tmp_path, monkeypatch, candidate: str, baseline: str = f"{NAME}@champion") -> tuple[int, dict]:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", trees["uri"])
    code = main(["gate", "--candidate", candidate, "--baseline", baseline, "--out", str(tmp_path / "g")])
    return code, json.loads((tmp_path / "g" / "gate.json").read_text())


def _row(result: dict, metric: str) -> dict:
    return next(r for r in result["rows"] if r["metric"] == metric)


def test_registrations(trees):
    a, b, c = (trees[k]["register"] for k in "abc")
    assert (a["version"], a["decision"]) == ("1", "champion")
    assert (b["version"], b["decision"], b["existing"]) == ("1", "champion", True)   # registered once
    assert b["reason"].startswith(f"already registered: {NAME} v1 holds these weights")
    assert b["candidate_value"] == a["candidate_value"]            # an unchanged rerun: the same loss, bit for bit
    assert c["candidate_value"] < a["candidate_value"]             # c beats the champion (bits/byte, same docs) ...
    assert (c["version"], c["decision"], c["champion_version"]) == ("2", "challenger", "1")   # ... not on the gate


def test_alias_resolves_to_the_training_run(trees, tmp_path, monkeypatch, capsys):
    """Item 1: the alias names the register run; the gate reads the train run of its pipeline (before: exit 2,
    MISSING DATA, the register run has no throughput/utilization/MFU)."""
    a = trees["a"]
    train_run = trees["client"].get_model_version(NAME, "1").tags["packtrain.train_run_id"]
    code, res = _gate(trees, tmp_path, monkeypatch, a["pipeline"][:8])     # the 8 characters `packtrain run` prints
    assert code == 0, capsys.readouterr().out
    assert f"run {train_run[:8]} (train of pipeline {a['pipeline'][:8]})" in res["baseline"]
    assert f"{NAME}@champion → version 1" in res["baseline"]
    assert a["register"]["run_id"] != train_run
    tps = _row(res, "train.throughput.real_tokens_per_s")
    assert tps["baseline"] == tps["candidate"] > 0                     # the same tree on both sides
    assert _row(res, "train.throughput.useful_mfu")["baseline"] > 0
    assert _row(res, "pack.fill")["baseline"] == pytest.approx(0.964661, abs=1e-6)


def test_unchanged_rerun_passes(trees, tmp_path, monkeypatch, capsys):
    code, res = _gate(trees, tmp_path, monkeypatch, trees["b"]["pipeline"])
    out = capsys.readouterr().out
    assert code == 0 and res["verdict"] == "PASS", out
    assert "cpu noise" in res["rules"] and "noise-cpu.json" in res["rules"]
    assert _row(res, "pack.fill")["change"] == 0.0 and _row(res, "train.throughput.padding")["change"] == 0.0
    util = _row(res, "train.system.utilization")
    assert util["verdict"] == "pass" and util["rule"].startswith("report only")   # CPU utilization never fails
    print(out)


def test_slower_run_fails(trees, tmp_path, monkeypatch, capsys):
    code, res = _gate(trees, tmp_path, monkeypatch, trees["c"]["pipeline"])
    out = capsys.readouterr().out
    assert code == 1 and res["verdict"] == "REGRESSION", out
    assert {"pack.fill", "train.throughput.padding"} <= set(res["regressions"])
    assert _row(res, "pack.fill")["candidate"] == pytest.approx(0.812346, abs=1e-6)
    assert "REGRESSION" in out
    print(out)


def test_scheduled_run_gates_itself_champion_stays(trees):
    """Item 4: c beat v1's loss, its gate failed, the champion stayed v1 and the reasons say why; the
    scheduled run (retrain.check_gate on the registered version) ends with GateFailed, exit 1."""
    from packtrain.config import load_run_config
    from packtrain.gate import GateFailed
    from packtrain.pipeline.retrain import check_gate, scheduled

    client = trees["client"]
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "1"
    assert str(client.get_model_version_by_alias(NAME, "challenger").version) == "2"
    c = trees["c"]["register"]
    assert c["reason"].startswith("gate REGRESSION (exit 1) against champion v1 (run ")
    assert "pack.fill dropped" in c["reason"] and "by the paired evaluation alone: promoted over v1" in c["reason"]
    t = client.get_model_version(NAME, "2").tags
    assert (t["gate"], t["gate_exit_code"], t["decision"]) == ("REGRESSION", "1", "challenger")
    assert "pack.fill" in t["gate_failed"] and "train.throughput.padding" in t["gate_failed"]
    arts = {f.path for f in client.list_artifacts(c["run_id"], "gate")}
    assert arts == {"gate/gate.json", "gate/gate.md"}
    assert client.get_run(c["run_id"]).data.tags["packtrain.gate"] == "REGRESSION"

    cfg = load_run_config("tiny-cpu", [f"tracking.tracking_uri={trees['uri']}"])
    assert scheduled(cfg).register_.gate is True and cfg.register_.gate is None
    assert scheduled(load_run_config("tiny-cpu", ["register.gate=false"])).register_.gate is False
    with pytest.raises(GateFailed) as e:
        check_gate(cfg, NAME, "2")
    assert e.value.exit_code == 1 and "champion alias stays" in str(e.value) and "pack.fill" in str(e.value)
    assert check_gate(cfg, NAME, "1") == {}      # the first champion: nothing to gate against


def test_dataset_tags_say_what_they_hold(trees):
    """Item 8: dataset_md5 = the DVC md5 of the source data (the Airflow DAG's data version); tokens_md5 =
    the token store's md5 (what dataset_md5 used to hold)."""
    from packtrain.versioning import data_md5

    t = trees["client"].get_model_version(NAME, "1").tags
    assert t["dataset_md5"] == data_md5(trees["corpus"])
    tok_stats = json.loads((trees["root"] / "tok" / "tokenize_result.json").read_text())   # the tokenize stage's result
    assert t["tokens_md5"] == tok_stats["tokens_md5"] != t["dataset_md5"]
