"""A stage run whose process died without ending it (SIGKILL) does not stay RUNNING: the next stage run in the
experiment marks it KILLED with a tag saying why. Runs whose owner lives, or cannot be judged from here, are
never touched. Real MLflow on sqlite in tmp; the killed process is a real `packtrain train` of its own, forked from
this one (tests/forked.py: its own pid, named by its run's owner tags, SIGKILLed alone)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from forked import Forked

from packtrain.cli import main
from packtrain.tracking import owner

TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "train.rows=4",
        "train.max_steps=10", "train.warmup_steps=2", "train.checkpoint.every_steps=5", "train.threads=1",
        "telemetry.interval_s=5", "tracking.system_metrics=false", "tracking.experiment=orphans"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("orphan_data")
    make_synthetic_inputs(root, n_docs=200, vocab_size=128, budget=128, seed=1)
    return root


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory, seed_mlflow_store) -> Path:
    """An MLflow sqlite store with its schema made and nothing in it, copied by each test: a fresh file costs
    ~2 s of alembic migrations on the CPU, paid once a session (tests/conftest.py's `seed_mlflow_store`) instead
    of once per test (and in the killed run)."""
    return seed_mlflow_store(tmp_path_factory.mktemp("orphan_store") / "mlflow.db")


def _store(empty_store: Path, work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(empty_store, work / "mlflow.db"))


def _train(data: Path, work: Path, *extra: str) -> list[str]:
    sets = [*TINY, f"workdir={work}"]
    return ["train", "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out", str(work / "train"),
            *[x for s in sets for x in ("--set", s)], *extra]


def _runs(work: Path) -> dict:
    from mlflow import MlflowClient

    c = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    exp = c.get_experiment_by_name("orphans")
    return {r.info.run_id: r for r in c.search_runs([exp.experiment_id])} if exp else {}


def test_a_sigkilled_train_run_is_marked_killed_when_the_next_run_starts(data, empty_store, tmp_path, capsys):
    work = tmp_path / "work"
    _store(empty_store, work)                                   # sqlite:///<workdir>/mlflow.db, the default
    # step 6 stalls (fault point train.slow_step) after checkpoint 5 is written: the kill lands mid-run however fast
    # the machine trains the other steps
    proc = Forked(_train(data, work), env={**os.environ, "PACKTRAIN_FAULT": "train.slow_step@6=120"})
    try:
        deadline = time.monotonic() + 300
        while not (work / "train" / "checkpoints" / "step_000005").is_dir() and time.monotonic() < deadline:
            assert proc.poll() is None, "the train run ended before it could be killed"
            time.sleep(0.1)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    (killed,) = _runs(work).values()
    assert killed.info.status == "RUNNING"                      # what a SIGKILL leaves behind
    assert killed.data.tags[owner.PID] == str(proc.pid) and owner.STARTED in killed.data.tags

    assert main(_train(data, work, "--resume")) == 0
    runs = _runs(work)
    old, new = runs[killed.info.run_id], next(r for k, r in runs.items() if k != killed.info.run_id)
    assert old.info.status == "KILLED" and old.info.end_time is not None
    reason = old.data.tags[owner.REASON]
    assert reason.startswith(f"its process (pid {proc.pid} on {killed.data.tags[owner.HOST]}) is gone")
    assert "opening stage train" in reason
    assert new.info.status == "FINISHED" and int(new.data.tags["packtrain.train.resumed_from"]) >= 5
    assert f"note: MLflow run {killed.info.run_id} (train) was still RUNNING" in capsys.readouterr().err


def test_only_runs_whose_owner_is_provably_gone_are_ended(empty_store, tmp_path):
    from packtrain.tracking.buffer import BufferedClient

    client = BufferedClient(f"sqlite:///{_store(empty_store, tmp_path)}", tmp_path / "buffer")
    here = owner.owner_tags()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    cases = {
        "alive": here,                                                   # this test process
        "gone": {**here, owner.PID: dead.stdout.strip()},                # exited: no such pid (or another's)
        "pid reused": {**here, owner.STARTED: "1"},                      # this pid, but not the process that ran it
        "other host": {**here, owner.PID: dead.stdout.strip(), owner.HOST: "elsewhere"},
        "other container": {**here, owner.PID: dead.stdout.strip(), owner.PIDNS: "pid:[1]"},
        "no owner tags": {},
    }
    ids = {name: client.create_run("orphans", "train", tags) for name, tags in cases.items()}
    finished = client.create_run("orphans", "pack", {**here, owner.PID: dead.stdout.strip()})
    client.set_terminated(finished, "FINISHED")

    ended = owner.end_orphaned_runs(client, "orphans", "evaluate")
    assert sorted(ended) == sorted([ids["gone"], ids["pid reused"]])
    status = {name: client._client.get_run(rid).info.status for name, rid in ids.items()}
    assert status == {"alive": "RUNNING", "gone": "KILLED", "pid reused": "KILLED", "other host": "RUNNING",
                      "other container": "RUNNING", "no owner tags": "RUNNING"}
    assert client._client.get_run(finished).info.status == "FINISHED"
    assert owner.end_orphaned_runs(client, "orphans", "evaluate") == []   # once
    assert owner.end_orphaned_runs(client, "no such experiment", "ingest") == []
    client.close()


@pytest.mark.parametrize("run, now, gone", [
    ({"pid": "42", "started": "700"}, None, True),                       # no process with that pid
    ({"pid": "42", "started": "700"}, "700", False),                     # the same process, alive
    ({"pid": "42", "started": "700"}, "900", True),                      # the pid now belongs to another process
    ({"pid": "42"}, "900", False),                                       # no start recorded: a live pid is alive
    ({"pid": "42", "host": "n2"}, None, False),                          # another host: cannot tell
    ({"pid": "42", "boot": "b2"}, None, False),                          # another boot (or machine of that name)
    ({"pid": "42", "pidns": "pid:[2]"}, None, False),                    # another pid namespace (container)
    ({"pid": "x"}, None, False),
    ({}, None, False),
])
def test_owner_gone_table(run, now, gone):
    here = {owner.HOST: "n1", owner.BOOT: "b1", owner.PIDNS: "pid:[1]"}
    tags = {**here, **{f"packtrain.owner.{k}": v for k, v in run.items()}} if run else {}
    assert owner.owner_gone(tags, here, lambda pid: now) is gone


def test_owner_tags_name_this_process():
    tags = owner.owner_tags()
    assert tags[owner.PID] == str(os.getpid()) and tags[owner.STARTED] == owner.process_start(os.getpid())
    assert owner.process_start(2**22 + 1) is None                       # above Linux's pid_max: no such process
    assert all(isinstance(v, str) for v in tags.values())              # plain strings, ready to be tags
