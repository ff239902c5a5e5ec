"""`packtrain run` and `dvc repro` in one checkout share one DVC repository and one remote (docs/data.md, "One
repository, one remote").

A fresh git checkout (the committed .dvc/config, dvc.yaml, params.yaml with the run's config, the code deps), a
remote added as the README says (`dvc remote add -d storage DIR`), then `packtrain run` and `dvc repro ingest` +
`dvc push`: both land in that remote, the documents as one object under the md5 the run prints (dvc.lock's
`data/ingest` lists the same file), no second DVC repo appears, and the run leaves .dvc/config and what git sees
as they were; both register into the one MLflow store `data/mlflow.db`; a `.dvc` file naming the md5 pulls the
documents back from that remote alone.

A workdir of an older version, whose nested repo `<workdir>/dataset/` has its own remote, keeps everything it had;
the run versions into the checkout and names that repo and its remote under the `dvc` line.

Cheap by construction: the stage cache is seeded from the session's tiny pipeline (`tiny_pipeline`), so the run
restores six stages and registers (the register key holds the tracking URI); `dvc repro ingest` is two
`packtrain` processes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pipeline_helpers import REPO, as_args, run_main

from packtrain.config import load_run_config
from packtrain.pipeline.local import snapshot_documents
from packtrain.pipeline.summary import format_summary
from packtrain.versioning import data_md5, push

DVC = Path(sys.executable).with_name("dvc")
CHECKOUT_FILES = (".gitignore", ".dvc/config", ".dvc/.gitignore", ".dvcignore", "dvc.yaml")


def _sh(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{cmd}: {r.stdout[-3000:]}{r.stderr[-3000:]}"
    return r.stdout


def _object(remote: Path, md5: str) -> Path:
    return remote / "files" / "md5" / md5[:2] / md5[2:]


@pytest.mark.slow
def test_packtrain_run_and_dvc_repro_share_one_repo_and_remote(tiny_pipeline, tmp_path):
    assert tiny_pipeline["result"].returncode == 0
    repo, storage = tmp_path / "checkout", tmp_path / "storage"
    for f in CHECKOUT_FILES:
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f, repo / f)
    for dep in ("data", "stages"):   # the ingest stage's deps in dvc.yaml
        shutil.copytree(REPO / "src" / "packtrain" / dep, repo / "src" / "packtrain" / dep,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # the shared pipeline's own settings in the default workdir `data/`: the stage cache serves it, and
    # params.yaml is the same config, so `dvc repro` ingests the same documents
    settings = [s for s in tiny_pipeline["settings"] if not s.startswith("workdir=")]
    params = load_run_config("tiny-cpu", settings).model_dump(mode="json", by_alias=True)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    _sh(["git", "init", "-q"], repo)
    _sh([*git, "add", "-A"], repo)
    _sh([*git, "commit", "-qm", "checkout"], repo)
    # the README's one remote setting, in the repository root
    _sh([str(DVC), "remote", "add", "-d", "storage", str(storage)], repo)
    config = (repo / ".dvc" / "config").read_text()
    shutil.copytree(tiny_pipeline["workdir"] / "cache", repo / "data" / "cache", copy_function=os.link)

    r = run_main(["run", *as_args(settings)], cwd=repo)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = re.search(r"^  dvc        documents md5 (\w{32}) in DVC remote (\S+)$", r.stdout, re.M)
    assert m and m.group(2) == str(storage), r.stdout
    md5 = m.group(1)
    assert _object(storage, md5).is_file()
    # one repository: no nested repo, no .dvc file, no remote added, nothing new for git
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob(".dvc") if p.is_dir()) == [".dvc"]
    assert not [p for p in repo.rglob("*.dvc") if p.is_file()] and (repo / ".dvc" / "config").read_text() == config
    assert not (repo / ".packtrain").exists() and not (repo / "data" / "dvc-remote").exists()
    assert _sh(["git", "status", "--porcelain", "--untracked-files=all"], repo) == " M .dvc/config\n"
    # each remote configured once, `storage` the default: what the README's line made, nothing more
    assert re.findall(r"^\['remote \"(\w+)\"'\]$", config, re.M) == ["local", "storage"], config
    assert re.search(r"^\s*remote = storage$", config, re.M), config

    _sh([str(DVC), "repro", "ingest"], repo)
    _sh([str(DVC), "push"], repo)
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    out = next(o for o in lock["stages"]["ingest"]["outs"] if o["path"] == "data/ingest")
    listing = yaml.safe_load(_object(storage, out["md5"]).read_text())   # the .dir object, pushed to `storage`
    assert {e["relpath"]: e["md5"] for e in listing}["documents.parquet"] == md5   # the same data version
    assert _object(storage, md5).is_file() and not (repo / ".packtrain").exists()
    # the data version is retrievable from the remote alone, as docs/data.md says: a .dvc file naming the md5
    shutil.rmtree(repo / ".dvc" / "cache")
    (repo / "fetched").mkdir()
    (repo / "fetched" / "documents.parquet.dvc").write_text(
        f"outs:\n- md5: {md5}\n  hash: md5\n  path: documents.parquet\n")
    _sh([str(DVC), "pull", "fetched/documents.parquet.dvc"], repo)
    assert data_md5(repo / "fetched" / "documents.parquet") == md5

    # one MLflow store: the run's pipeline and the dvc-repro ingest both in data/mlflow.db
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'data' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("packtrain").experiment_id], max_results=100)
    ingest = [x for x in runs if x.info.run_name == "ingest"]
    assert {"mlflow.parentRunId" in x.data.tags for x in ingest} == {True, False}, [x.data.tags for x in ingest]


def test_an_older_workdirs_nested_repo_is_named_and_kept(tmp_path):
    """Before one repository, `packtrain run` made `<workdir>/dataset/` a DVC repo (no git) with the remote
    `<workdir>/dvc-remote/`, also inside the checkout. Now the documents go to the checkout's repo and remote; the
    old repo, its files and its remote stay byte for byte, and the summary names them and what to do."""
    repo, wd = tmp_path / "checkout", tmp_path / "checkout" / "data"
    for f in (".gitignore", ".dvc/config", ".dvc/.gitignore"):
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f, repo / f)
    _sh(["git", "init", "-q"], repo)
    old = wd / "dataset"
    old.mkdir(parents=True)
    _sh([str(DVC), "init", "--no-scm", "-q"], old)   # what older versions made
    _sh([str(DVC), "remote", "add", "-d", "local", str(wd / "dvc-remote")], old)
    (old / "documents.parquet").write_bytes(b"older documents\n")
    push([old / "documents.parquet"], old)
    before = {p: p.read_bytes() for p in [*old.rglob("*"), *(wd / "dvc-remote").rglob("*")]
              if p.is_file() and "tmp" not in p.relative_to(wd).parts}
    docs = wd / "kfp" / "packtrain-2026-12-02-10-00-00-000000" / "ingest" / "documents" / "documents.parquet"
    docs.parent.mkdir(parents=True)
    docs.write_bytes(b"new documents\n")

    ds = snapshot_documents(wd)
    md5, remote = data_md5(docs), repo / ".packtrain" / "dvc-remote"
    assert ds == {"md5": md5, "pushed": 1, "remote": str(remote), "repo": str(repo),
                  "legacy": {"repo": str(old), "remote": str(wd / "dvc-remote")}}
    assert _object(remote, md5).read_bytes() == b"new documents\n"
    assert {p: p.read_bytes() for p in before} == before   # nothing of the old repo or its remote touched
    lines = format_summary("tiny-cpu", {"cached": [], "dataset": ds}, 1.0, 7, None).splitlines()[1:]
    assert lines == [
        f"  dvc        documents md5 {md5} in DVC remote {remote}",
        f"             older runs' DVC repo {old} (remote {wd / 'dvc-remote'}) is no longer used, left as it is: "
        f"a remote set there goes to {repo} (dvc remote add -d), then remove it (docs/data.md)"]
