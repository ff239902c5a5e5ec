"""`packtrain run` against a real `mlflow server` (the session's `mlflow_server`), in a fresh git checkout with
the documented default workdir `data/` — run ids, complete cached runs after switching stores
(4), the MLflow hint (6) and the files the flows leave behind (7).

Cheap by construction: the stage cache is seeded from the session's tiny pipeline (`tiny_pipeline`, whose runs
live in its own sqlite store), so the first run here restores six stages from runs in *another* store and only
registers (the register key holds the tracking URI); the second restores all seven from the server.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import urllib.request

import pytest
from mlflow import MlflowClient
from pipeline_helpers import REPO, as_args, run_main

from packtrain import STAGES
from packtrain.cli import main
from packtrain.tracking.refs import RunRefError, resolve_run_ref, stage_run_of

pytestmark = pytest.mark.slow
CHECKOUT_FILES = (".gitignore", ".dvc/config", ".dvc/.gitignore", ".dvcignore", "dvc.yaml", "params.yaml")


@pytest.fixture(scope="module")
def server(mlflow_server):
    """The session's server; this module alone uses the default experiment and model name there."""
    return mlflow_server


@pytest.fixture(scope="module")
def runs(tiny_pipeline, server, tmp_path_factory):
    assert tiny_pipeline["result"].returncode == 0
    repo = tmp_path_factory.mktemp("checkout")
    for f in CHECKOUT_FILES:   # what a clone has that decides what git sees (+ dvc files the flows read)
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f, repo / f)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "checkout"], cwd=repo, check=True)
    shutil.copytree(tiny_pipeline["workdir"] / "cache", repo / "data" / "cache", copy_function=os.link)
    # the shared pipeline's own settings (its task suite included), so every stage but register is a cache hit
    settings = [s for s in tiny_pipeline["settings"] if not s.startswith("workdir=")]
    args = ["run", *as_args([*settings, f"tracking.tracking_uri={server.uri}"])]
    first, second = (run_main(args, cwd=repo) for _ in range(2))
    for r in (first, second):
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {"repo": repo, "first": first, "second": second, "client": MlflowClient(server.uri),
            "origin": MlflowClient(f"sqlite:///{tiny_pipeline['workdir'] / 'mlflow.db'}"),
            "origin_uri": f"sqlite:///{tiny_pipeline['workdir'] / 'mlflow.db'}", "git": git}


def _ids(out: str) -> tuple[str, str]:
    m = re.search(r"^  run id     (\w{8}) \(pipeline run (\w{32})\)$", out, re.M)
    assert m, out
    return m.group(1), m.group(2)


def _line(out: str, label: str) -> str:
    m = re.search(rf"^  {label:<10} (packtrain .*)$", out, re.M)
    assert m, out
    return m.group(1)


def _children(client, parent: str) -> dict:
    exp = client.get_run(parent).info.experiment_id
    return {r.info.run_name: r for r in client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent}'")}


def _artifacts(client, run_id: str, path: str | None = None) -> list[str]:
    out = []
    for f in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, f.path) if f.is_dir else [f.path]
    return sorted(out)


def test_printed_run_ids_resolve_and_the_printed_lines_run(runs, server, monkeypatch, capsys):
    """Issue 21 item 3: short ids, NAME@ALIAS and the printed compare/gate lines work against the server."""
    c = runs["client"]
    short1, full1 = _ids(runs["first"].stdout)
    short2, full2 = _ids(runs["second"].stdout)
    assert resolve_run_ref(c, short1) == full1 and resolve_run_ref(c, short2) == full2
    # the version's run is the train run that owns the model — here the restored copy of a cached train stage,
    # logged under the pipeline run before the register stage ran
    train1 = _children(c, full1)["train"]
    assert train1.data.tags["packtrain.cache"] == "hit"
    assert resolve_run_ref(c, "packtrain-lm@champion") == train1.info.run_id
    assert stage_run_of(c, resolve_run_ref(c, "models:/packtrain-lm@champion"), "train") == train1.info.run_id
    mv = c.get_model_version_by_alias("packtrain-lm", "champion")
    assert mv.tags["packtrain.register_run_id"] == _children(c, full1)["register"].info.run_id
    # 16 runs over 16 hex digits + the registration's: some first digit is shared; the server's LIKE says so
    ids = [r.info.run_id for r in c.search_runs([c.get_run(full1).info.experiment_id], max_results=100)]
    shared = next(ch for ch in "0123456789abcdef" if sum(i.startswith(ch) for i in ids) > 1)
    with pytest.raises(RunRefError, match=f"run prefix '{shared}' is ambiguous"):
        resolve_run_ref(c, shared, min_prefix=1)
    # the second run is the champion's rerun: compare it with the first, gate it against the first
    compare, gate = _line(runs["second"].stdout, "compare"), _line(runs["second"].stdout, "gate")
    assert compare.startswith(f"packtrain compare {short1} {short2} ") and f"--baseline {short1}" in gate
    # each line as typed in the checkout, through the CLI's entry point in this process (a `packtrain` process
    # costs ~6 s of imports on 2 cores)
    monkeypatch.chdir(runs["repo"])
    for line in (compare + " --no-log", gate):
        assert main(shlex.split(line)[1:]) == 0, (line, capsys.readouterr())   # unchanged rerun: gate passes


def test_cached_runs_are_complete_after_switching_to_the_server(runs):
    """Issue 21 item 4: a restored stage's run on the server holds its origin's params, metric histories and
    artifacts, though the origin lives in the sqlite store the cache was filled from."""
    c, origin = runs["client"], runs["origin"]
    first = _children(c, _ids(runs["first"].stdout)[1])
    assert sorted(first) == sorted(STAGES)
    assert first["register"].data.tags.get("packtrain.cache") is None   # a new store registers again
    for stage in STAGES[:-1]:
        run = first[stage]
        src = origin.get_run(run.data.tags["packtrain.restored_from"])
        assert run.data.tags["packtrain.restored_from_uri"] == runs["origin_uri"]
        assert src.data.tags["mlflow.runName"] == stage and src.data.tags.get("packtrain.cache") is None
        assert run.data.params == src.data.params and run.data.metrics == src.data.metrics, stage
        assert _artifacts(c, run.info.run_id) == _artifacts(origin, src.info.run_id) != [], stage
    train = first["train"]
    hist = [(m.step, m.value) for m in c.get_metric_history(train.info.run_id, "loss")]
    assert hist == [(m.step, m.value) for m in origin.get_metric_history(
        train.data.tags["packtrain.restored_from"], "loss")] and len(hist) == 2
    # the second run restores register from the first run's register run, in the same store
    reg2 = _children(c, _ids(runs["second"].stdout)[1])["register"]
    assert reg2.data.tags["packtrain.restored_from"] == first["register"].info.run_id
    assert "packtrain.restored_from_uri" not in reg2.data.tags
    assert reg2.data.params == first["register"].data.params


def test_mlflow_hint_opens_the_run_on_the_server(runs, server):
    """Issue 21 item 6: for a server the hint is its own address of the run, never `mlflow ui` on an URL."""
    out = runs["first"].stdout
    _, full = _ids(out)
    exp = runs["client"].get_run(full).info.experiment_id
    assert f"  MLflow     open {server.uri}/#/experiments/{exp}/runs/{full}?workflowType=machine_learning\n" in out, out
    assert "--backend-store-uri" not in out
    page = urllib.request.urlopen(f"{server.uri}/#/experiments/{exp}/runs/{full}", timeout=10)
    assert page.status == 200 and b"<html" in page.read(4096).lower()
    api = urllib.request.urlopen(f"{server.uri}/api/2.0/mlflow/runs/get?run_id={full}", timeout=10)
    assert api.status == 200


def test_documented_flows_leave_nothing_unexpected_in_git(runs):
    """Issue 21 item 7: after `packtrain run` (twice), compare and gate in a checkout, git sees nothing new;
    the other flows' outputs are ignored, except what docs/pipeline.md says to commit."""
    repo = runs["repo"]
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo,
                            capture_output=True, text=True, check=True).stdout
    assert status == "", status
    ignored = [".airflow/airflow.db", "mlartifacts/0/x", "data-350m/kfp/x", "data-1b/cache/x", "data/x"]
    r = subprocess.run(["git", "check-ignore", *ignored], cwd=repo, capture_output=True, text=True)
    assert r.stdout.split() == ignored, r.stdout
    doc = (REPO / "docs" / "pipeline.md").read_text(encoding="utf-8")
    for path in ("dvc.lock", "metrics/", "plots/"):   # `dvc repro` refuses a git-ignored dvc.lock: commit them
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=repo).returncode == 1, path
        assert re.search(rf"^\| `{re.escape(path)}` \| `dvc repro` \| commit", doc, re.M), path
