"""`packtrain mlflow replay` applies every buffered op exactly once: replayed twice, killed (SIGKILL) at a
seeded random op and replayed again, or replayed from a copy of the buffer, the store (sqlite; one case a
real `mlflow server`) ends with exactly one copy of every run, param, metric step, tag, dataset input and
artifact.

The buffer is recorded once per module (two files: the pipeline + train stage of one "process", a validate
stage of another, all against a dead port) and copied into each test. The expected end state is that of a
single clean replay into a fresh store; every other case must equal it exactly (run ids normalised to run
names). Kill points: PACKTRAIN_FAULT=replay.before_record@K dies after the store applied the K-th op, before
its id is on disk — the window only the store's own idempotency covers; replay.after_record@K just after.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.entities import ViewType

from packtrain.cli import main as cli_main
from packtrain.config import load_run_config
from packtrain.tracking import end_pipeline_run, stage_run, start_pipeline_run
from packtrain.tracking.buffer import BufferedClient, replay_dir
from packtrain.tracking.ledger import read_ops
from packtrain.tracking.run_handle import StageRun
from packtrain.tracking.run_lifecycle import _clients, _close_clients

EXPERIMENT = "replay"
# (seed, fault point): the kill op k is drawn from the seed (shown in the test id and every failure message).
# Of the 23 recorded ops (file 1: pipeline create, params, train create, params, tags, 8 steps, NaN metric, 2
# artifacts, dataset input + tags, 2 ends; file 2: validate create, metrics, end) these seeds land on both
# creates of file 1 (23 → k=1, 30 → 3), a file artifact (12 → 15), an artifact directory (5 → 16), the
# dataset input (4 → 17), a run end (3 → 19), the create and the end of file 2 (13 → 21, 39 → 23), and,
# with the id already recorded, the params (11 → 4) and file 2's metrics (7 → 22).
CASES = [(23, "before_record"), (30, "before_record"), (12, "before_record"), (5, "before_record"),
         (4, "before_record"), (3, "before_record"), (13, "before_record"), (39, "before_record"),
         (11, "after_record"), (7, "after_record")]


def _dead_uri() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"   # closed again: nothing listens there


def record_buffer(root: Path) -> Path:
    """Run a pipeline + two stages against a dead store; returns the buffer directory (2 files)."""
    os.environ["MLFLOW_TRACKING_URI"] = dead = _dead_uri()
    try:
        cfg = load_run_config("tiny-cpu", [f"workdir={root}", "tracking.flush_interval_s=0",
                                           "tracking.retry_after_s=30", "tracking.system_metrics=false",
                                           f"tracking.experiment={EXPERIMENT}"])
        parent = start_pipeline_run(cfg)
        plots = root / "plots"
        plots.mkdir(parents=True)
        (plots / "a.txt").write_text("a\n")
        (plots / "b.txt").write_text("bb\n")
        docs = root / "documents.parquet"
        docs.write_bytes(b"not really parquet")
        with stage_run("train", cfg, section=cfg.train, tags={"packtrain.note": "outage"}) as run:
            for step in range(8):
                run.log_step({"loss": 8.0 - step, "lr": 1e-3 * (step + 1)}, step=step)
            run.log_metrics({"nan_metric": float("nan")})
            run.log_json({"steps": 8}, "train_result.json")
            run.log_artifact(plots, "plots")
            run.log_dataset(docs, "documents", "0f343b0931126a20f133d67c2b018a3b")
        end_pipeline_run(parent)
        # a second "process": its own buffer file, a stage nested under the (pending) parent
        other = BufferedClient(dead, root / "mlflow-buffer", retry_after_s=30)
        rid = other.create_run(EXPERIMENT, "validate", {"mlflow.parentRunId": parent, "packtrain.stage": "validate"})
        StageRun(other, rid, "validate", 0).log_metrics({"n_failed": 0, "n_passed": 11})
        other.set_terminated(rid)
        other.close()
    finally:
        _close_clients()
        _clients.clear()
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    buf = root / "mlflow-buffer"
    assert len(list(buf.glob("*.jsonl"))) == 2
    return buf


def n_ops(buf: Path) -> int:
    return sum(len(read_ops(p.read_text())[0]) for p in buf.glob("*.jsonl"))


def store_state(uri: str) -> dict:
    """Everything a replay writes, run ids replaced by run names; fails on a duplicated run."""
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(EXPERIMENT)
    runs = c.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=1000)
    names = {r.info.run_id: r.info.run_name for r in runs}
    assert len(names) == len(set(names.values())), f"duplicated runs: {sorted(names.values())}"

    def artifacts(rid, path=None):
        out = []
        for a in c.list_artifacts(rid, path):
            out += artifacts(rid, a.path) if a.is_dir else [(a.path, a.file_size)]
        return out

    state = {}
    for r in runs:
        rid = r.info.run_id
        state[r.info.run_name] = {
            "status": r.info.status, "start": r.info.start_time, "end": r.info.end_time,
            "params": r.data.params,
            "tags": {k: names.get(v, v) if k == "mlflow.parentRunId" else v for k, v in r.data.tags.items()},
            "metrics": {k: sorted((m.step, m.timestamp, str(m.value)) for m in c.get_metric_history(rid, k))
                        for k in r.data.metrics},
            "artifacts": sorted(artifacts(rid)),
            "inputs": sorted((d.dataset.name, d.dataset.digest) for d in r.inputs.dataset_inputs),
        }
    return state


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, seed_mlflow_store):
    """(buffer, empty migrated store db, expected state): recorded and replayed cleanly once."""
    root = tmp_path_factory.mktemp("recorded")
    buf = record_buffer(root / "work")
    template = seed_mlflow_store(root / "template.db")   # the cases' empty store: copied, not migrated (2-8 s)
    ref = root / "ref"
    shutil.copytree(buf, ref / "buffer")
    shutil.copy(template, ref / "mlflow.db")
    uri = f"sqlite:///{ref / 'mlflow.db'}"
    assert cli_main(["mlflow", "replay", "--buffer", str(ref / "buffer"), "--tracking-uri", uri]) == 0
    expected = store_state(uri)
    # sanity of the reference itself: what was recorded arrived once
    assert set(expected) == {"tiny-cpu", "train", "validate"}   # the pipeline run: named after the recipe
    train = expected["train"]
    assert [s for s, _, _ in train["metrics"]["loss"]] == list(range(8))
    assert train["tags"]["mlflow.parentRunId"] == "tiny-cpu" == expected["validate"]["tags"]["mlflow.parentRunId"]
    assert train["artifacts"] == [("plots/a.txt", 2), ("plots/b.txt", 3), ("train_result.json", 17)]
    assert train["inputs"] == [("documents", "0f343b0931126a20f133d67c2b018a3b")]
    assert train["params"]["train.max_steps"] == "30" and train["tags"]["packtrain.note"] == "outage"
    assert len(train["metrics"]["nan_metric"]) == 1 and all(r["status"] == "FINISHED" for r in expected.values())
    return buf, template, expected


def _case(recorded, tmp_path) -> tuple[Path, str]:
    buf, template, _ = recorded
    shutil.copytree(buf, tmp_path / "buffer")
    shutil.copy(template, tmp_path / "mlflow.db")
    return tmp_path / "buffer", f"sqlite:///{tmp_path / 'mlflow.db'}"


def _replay(buf: Path, uri: str, capsys) -> dict:
    capsys.readouterr()
    rc = cli_main(["mlflow", "replay", "--buffer", str(buf), "--tracking-uri", uri])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["left"] == 0 and out["rejected"] == 0, out
    return out


def _assert_drained(buf: Path) -> None:
    assert not list(buf.glob("*.jsonl")) and not (buf / "applied.log").exists()
    assert not [p for p in (buf / "artifacts").rglob("*") if p.is_file()]   # the buffer's copies are gone
    assert not (buf / "rejected.jsonl").exists()


def test_replay_twice_and_from_a_copy(recorded, tmp_path, capsys):
    buf, uri = _case(recorded, tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(buf, copy)   # e.g. the same buffer brought back from a GPU machine twice
    total = n_ops(buf)
    assert _replay(buf, uri, capsys)["applied"] == total
    assert _replay(buf, uri, capsys)["applied"] == 0   # nothing left to do
    _assert_drained(buf)
    assert _replay(copy, uri, capsys)["applied"] == total   # the copy has no applied.log of the first …
    assert store_state(uri) == recorded[2]                  # … and still adds nothing
    _assert_drained(copy)


def test_torn_last_line_is_set_aside_not_a_traceback(recorded, tmp_path, capsys):
    """A writer killed mid-line leaves half a JSON object at the end of its file: replay applies the rest,
    puts the fragment in rejected.jsonl and deletes the file."""
    buf, uri = _case(recorded, tmp_path)
    last = sorted(buf.glob("*.jsonl"))[-1]
    with open(last, "a") as f:
        f.write('{"op": "log_batch", "id": "0123456789abcdef0123456789abcdef", "run_id": "pen')
    capsys.readouterr()
    assert cli_main(["mlflow", "replay", "--buffer", str(buf), "--tracking-uri", uri]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["left"] == 0
    assert store_state(uri) == recorded[2]
    (rejected,) = [json.loads(ln) for ln in (buf / "rejected.jsonl").read_text().splitlines()]
    assert rejected["raw"].endswith('"run_id": "pen') and "unreadable" in rejected["error"]
    assert [p.name for p in buf.glob("*.jsonl")] == ["rejected.jsonl"]


@pytest.mark.parametrize(("seed", "point"), CASES)
def test_kill_at_random_op_then_replay(recorded, tmp_path, capsys, seed, point):
    buf, uri = _case(recorded, tmp_path)
    total = n_ops(buf)
    k = int(np.random.default_rng(seed).integers(1, total + 1))
    why = f"seed {seed}: SIGKILL at replay.{point}@{k} of {total} ops"
    # the replaying process: a fork of this one (imports done: ~0.3 s instead of ~5 s for a new interpreter;
    # the real CLI in a new process is killed the same way in the server case and in test_secrets_outage)
    pid = os.fork()
    if pid == 0:   # child: replay until the fault point kills it
        try:
            import signal

            signal.alarm(120)   # a child stuck on a lock inherited through fork dies (SIGALRM), never hangs
            from packtrain.tracking import replay as replay_mod

            replay_mod._applied_in_process = 0
            os.environ["PACKTRAIN_FAULT"] = f"replay.{point}@{k}"
            replay_dir(buf, tracking_uri=uri)
        finally:
            os._exit(3)   # reached only if the fault point did not fire
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9, f"{why}: wait status {status}"
    applied_ids = (buf / "applied.log").read_text().split() if (buf / "applied.log").exists() else []
    assert len(applied_ids) == (k - 1 if point == "before_record" else k), why
    assert n_ops(buf) <= total   # files are never rewritten; a fully applied one is deleted
    left = total - len(applied_ids)
    out = _replay(buf, uri, capsys)
    assert out["applied"] == left, why
    assert store_state(uri) == recorded[2], why
    _assert_drained(buf)


@pytest.mark.slow
def test_kill_then_replay_and_copy_against_a_real_server(recorded, mlflow_server, tmp_path, capsys):
    """The same guarantees through the REST API of the session's real `mlflow server` (experiment "replay" is
    this module's alone there): SIGKILL mid-replay (seed 5 → op 16, an artifact directory), replay again, then
    replay a copy of the buffer taken before anything was applied."""
    buf, _ = _case(recorded, tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(buf, copy)
    total = n_ops(buf)
    k = int(np.random.default_rng(5).integers(1, total + 1))
    uri = mlflow_server.uri
    env = {**os.environ, "PACKTRAIN_FAULT": f"replay.before_record@{k}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-m", "packtrain.cli", "mlflow", "replay", "--buffer", str(buf),
                           "--tracking-uri", uri], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == -9, f"seed 5, k={k}: rc {proc.returncode}\n{proc.stderr[-2000:]}"
    assert _replay(buf, uri, capsys)["applied"] == total - (k - 1)
    assert _replay(copy, uri, capsys)["applied"] == total
    assert store_state(uri) == recorded[2], f"seed 5, k={k}"
    _assert_drained(buf)
    _assert_drained(copy)
