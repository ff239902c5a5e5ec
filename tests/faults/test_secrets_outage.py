"""Secrets never reach disk or output, and an unreachable store never fails the register stage.

One story, real processes, no server: the tracking URI carries a password (`http://alice:<pw>@127.0.0.1:<dead
port>`), MLFLOW_TRACKING_PASSWORD holds a token-like value, and a tag value quotes it. A pipeline run with a
train stage and `packtrain register` run against the dead store: the register stage exits 0 with decision
"deferred". `packtrain mlflow replay` without credentials names the redacted URI and leaves everything; with
MLflow's credential variables it tries the recorded store (still down); with the right store it is killed
between the logged model and its version, then replayed again: exactly one run of each stage, one logged
model, one model version holding the champion alias, and register_result.json rewritten in place. Finally
every file under the test's directory (workdir, buffer, sqlite store, artifacts) and every captured
stdout/stderr is searched for the planted secrets: zero hits.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid

import pytest
import torch
from mlflow import MlflowClient

from packtrain.secrets import has_userinfo, redact_text, redact_uri, strip_userinfo
from packtrain.testing.tiny_model import build_tiny_model_dir

pytestmark = pytest.mark.slow

@pytest.mark.parametrize(("uri", "shown"), [
    ("https://user:secret@host/x", "https://user:***@host/x"),
    ("https://user:p@ss@host:5000/x", "https://user:***@host:5000/x"),
    ("https://ghp_0123456789abcdef@host/x", "https://***@host/x"),
    ("https://host/x?token=abc&v=1", "https://host/x?token=***&v=1"),
    ("sqlite:////abs/mlflow.db", "sqlite:////abs/mlflow.db"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    (None, None),
])
def test_redact_uri(uri, shown):
    assert redact_uri(uri) == shown
    assert redact_text(f"API request to {uri}/api failed") == f"API request to {shown}/api failed"


def test_redact_text_env_values_and_userinfo(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "tok-5f2e9d")
    assert redact_text("header Basic tok-5f2e9d; see postgresql://u:pw@db/x") == \
        "header Basic ***; see postgresql://u:***@db/x"
    assert has_userinfo("https://u:***@h") and not has_userinfo("https://h")
    assert strip_userinfo("https://u:***@h:1/x?y=1") == "https://h:1/x?y=1"


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_json(text: str) -> dict:
    return json.loads([ln for ln in text.splitlines() if ln.startswith("{")][-1])


@pytest.fixture
def fluent_uri_restored():
    """In-process stages set MLflow's global tracking URI: put it back for the tests after this one."""
    import mlflow

    from packtrain.tracking.run_lifecycle import _clients, _close_clients, set_fluent_tracking_uri

    before = mlflow.get_tracking_uri()
    yield
    _close_clients()
    _clients.clear()
    set_fluent_tracking_uri(before)


def test_outage_with_secrets_then_replay(tmp_path, monkeypatch, capfd, caplog, fluent_uri_restored):
    from packtrain.cli import main as cli_main
    from packtrain.config import load_run_config
    from packtrain.tracking import end_pipeline_run, stage_run, start_pipeline_run
    from packtrain.tracking.run_lifecycle import _close_clients

    password, token = f"Pw-{uuid.uuid4().hex[:16]}", f"tok_{uuid.uuid4().hex}"
    dead = f"127.0.0.1:{_dead_port()}"
    secret_uri, shown = f"http://alice:{password}@{dead}", f"http://alice:***@{dead}"
    work = tmp_path / "work"
    monkeypatch.chdir(tmp_path)   # anything dropped in the cwd is searched too
    for k, v in {"MLFLOW_TRACKING_URI": secret_uri, "MLFLOW_TRACKING_USERNAME": "alice",
                 "MLFLOW_TRACKING_PASSWORD": token}.items():
        monkeypatch.setenv(k, v)
    outputs: list[str] = []

    def captured() -> tuple[str, str]:
        out, err = capfd.readouterr()
        outputs.extend([out, err, caplog.text])
        caplog.clear()
        return out, err

    # 1. the store is down: a pipeline run (its params hold the whole config) with a train stage, then the register
    #    stage. The URI comes from MLFLOW_TRACKING_URI (a password in tracking.tracking_uri is refused at load time)
    cfg = load_run_config("tiny-cpu", [f"workdir={work}", "tracking.system_metrics=false",
                                       "tracking.flush_interval_s=0", "tracking.retry_after_s=60"])
    parent = start_pipeline_run(cfg)
    with stage_run("train", cfg, section=cfg.train) as run:
        for step in range(3):
            run.log_step({"loss": 3.0 - step}, step=step)
        run.set_tags({"packtrain.endpoint": secret_uri, "packtrain.note": f"token {token}"})
    end_pipeline_run(parent)
    model = build_tiny_model_dir(tmp_path / "model", ["def f(x):\n    return x + 1\n"] * 8, seed=1)
    (tmp_path / "eval").mkdir()
    held = tmp_path / "held.txt"
    held.write_text("def f(x):\n    return x + 1\n\ndef g(y):\n    return y\n")
    from packtrain.stages.lineage import make_lineage
    from packtrain.stages.results import EvaluateResult

    EvaluateResult(   # what `packtrain evaluate` writes (register refuses anything else)
        eval_loss=3.25, perplexity=25.79, n_label_tokens=95, n_real_tokens=100, n_slot_tokens=160, n_segments=5,
        n_batches=1, n_batches_epoch=1, complete=True, seconds=0.1, tokens_per_s=1000.0, peak_memory_gib=None,
        memory_kind="cpu_max_rss", device="cpu", precision="fp32", attention="sdpa", rows=5, budget=32,
        model_dir=str(model), eval_split_dir=str(tmp_path / "packs"), lineage=make_lineage({"model": "m"}),
    ).write(tmp_path / "eval")
    from packtrain.evaluate.paired_scores import paired_evaluation

    # the paired evaluation register decides from: the model alone on one suite (no champion yet)
    paired_evaluation(load_run_config("tiny-cpu", ["tracking.enabled=false",
                                                   "evaluate.recent_role=off",
                                                   f"evaluate.suites=[{{name: held, role: primary, path: {held}}}]"]),
                      model, "none", tmp_path / "eval")
    sets = ["--set", f"workdir={work}", "--set", "register.model_name=tiny-lm", "--set", "tracking.system_metrics=false"]
    out_dir = tmp_path / "register"
    rc = cli_main(["register", *sets, "--model", str(model), "--eval", str(tmp_path / "eval"),
                   "--train", str(tmp_path / "no-train"), "--out", str(out_dir)])
    captured()
    assert rc == 0   # an unreachable store no longer fails the stage
    _close_clients()   # what the end of those processes does: the buffer files are released
    deferred = json.loads((out_dir / "register_result.json").read_text())
    assert (deferred["decision"], deferred["version"], deferred["tracking_uri"]) == ("deferred", None, shown)
    assert deferred["op_id"] and "packtrain mlflow replay" in deferred["reason"] and shown in deferred["reason"]
    buf = work / "mlflow-buffer"
    (model_copy,) = (buf / "artifacts").glob(f"{deferred['op_id']}/model")   # the model travels with the op
    assert (model_copy / "config.json").is_file()

    replay = ["mlflow", "replay", "--set", f"workdir={work}"]
    # 2. no credentials anywhere: nothing is sent, the redacted URI is named
    for k in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(k)
    assert cli_main(replay) == 1
    out, err = captured()
    res = _last_json(out)
    assert res["recorded_uris"] == {shown: res["left"]} and res["needs_credentials"] == [shown] and res["applied"] == 0
    assert f"buffered ops were recorded for {shown}" in err
    assert f"ops recorded for {shown} were not replayed: the buffer does not keep its credentials" in err
    # 3. MLflow's credential variables: the recorded store (without userinfo) is tried; it is still down
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", token)
    assert cli_main(replay) == 1
    out, err = captured()
    assert "is the tracking store reachable?" in err
    assert _last_json(out)["needs_credentials"] == [] and _last_json(out)["applied"] == 0

    # 4. the right store: a replay killed between the logged model and its version, then one to the end
    store = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PACKTRAIN_")},
           "PACKTRAIN_FAULT": "register.model_logged"}
    proc = subprocess.run([sys.executable, "-m", "packtrain.cli", *replay, "--tracking-uri", store], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    outputs += [proc.stdout, proc.stderr]
    assert proc.returncode == -9, proc.stdout + proc.stderr[-3000:]
    assert cli_main([*replay, "--tracking-uri", store]) == 0
    out, err = captured()
    res = _last_json(out)
    assert res["left"] == 0 and res["rejected"] == 0
    assert [(r["model_name"], r["version"], r["decision"]) for r in res["registered"]] == [("tiny-lm", "1", "champion")]
    assert "registered tiny-lm v1 → champion" in err

    # exact end state
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("packtrain")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["register", "tiny-cpu", "train"]   # the pipeline run: the recipe
    assert all(r.info.status == "FINISHED" for r in runs)
    by_name = {r.info.run_name: r for r in runs}
    by_name["pipeline"] = by_name.pop("tiny-cpu")
    assert by_name["pipeline"].data.params.get("tracking.tracking_uri", "") in ("", "None")   # URI from the env
    assert by_name["train"].data.tags["packtrain.endpoint"] == shown
    assert by_name["train"].data.tags["packtrain.note"] == "token ***"
    assert [m.step for m in client.get_metric_history(by_name["train"].info.run_id, "loss")] == [0, 1, 2]
    reg = by_name["register"]
    assert reg.data.tags["packtrain.decision"] == "champion" and reg.data.metrics["promoted"] == 1.0
    assert len(client.get_metric_history(reg.info.run_id, "candidate_value")) == 1
    logged = client.search_logged_models([exp.experiment_id])
    assert len(logged) == 1 and str(logged[0].status) == "READY"   # the one logged before the kill, reused
    # `packtrain register` on its own (no pipeline run, so no train run in its tree): its run keeps the model
    assert logged[0].source_run_id == reg.info.run_id == client.get_model_version("tiny-lm", "1").run_id
    assert [str(v.version) for v in client.search_model_versions("name = 'tiny-lm'")] == ["1"]
    assert str(client.get_model_version_by_alias("tiny-lm", "champion").version) == "1"
    assert "register_result.json" in {a.path for a in client.list_artifacts(reg.info.run_id)}
    final = json.loads((out_dir / "register_result.json").read_text())   # rewritten in place by the replay
    assert (final["decision"], final["version"], final["op_id"]) == ("champion", "1", deferred["op_id"])
    assert not list(buf.glob("*.jsonl")) and not list((buf / "artifacts").iterdir())
    from packtrain.evaluate.loading import load_model_dir
    from packtrain.registry.model import load_champion

    loaded, _ = load_champion("tiny-lm", store)
    ref, _ = load_model_dir(model, "cpu")
    assert torch.equal(loaded.get_input_embeddings().weight, ref.get_input_embeddings().weight)

    # 5. no planted secret anywhere
    captured()
    secrets = [password.encode(), token.encode()]
    hits = [str(p) for p in tmp_path.rglob("*") if p.is_file() and any(s in p.read_bytes() for s in secrets)]
    hits += [f"output {i}: {text[:200]}" for i, text in enumerate(outputs) if password in text or token in text]
    assert hits == [], f"planted secrets found in: {hits}"
    assert sum(map(len, outputs)) > 1000 and len(list(tmp_path.rglob("*"))) > 20   # it did look somewhere
