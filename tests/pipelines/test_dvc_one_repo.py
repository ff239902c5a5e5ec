"""`packtrain run` and `dvc repro` in one checkout share one DVC repository and one remote (docs/data.md, "One
repository, one remote").

A fresh git checkout (the committed .dvc/config, dvc.yaml, params.yaml with the run's config, the code deps), a
remote added as the README says (`dvc remote add -d storage DIR`), then `packtrain run` and `dvc repro ingest` +
`dvc push`: both land in that remote, the documents as one object under the md5 the run prints (dvc.lock's
`data/ingest` lists the same file), no second DVC repo appears, and the run leaves .dvc/config and what git sees
as they were; both register into the one MLflow store `data/mlflow.db`.

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

pytestmark = pytest.mark.slow
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
    remotes = _sh([str(DVC), "remote", "list"], repo).split()
    assert remotes.count("storage") == 1 and remotes.count("local") == 1, remotes   # each configured once

    _sh([str(DVC), "repro", "ingest"], repo)
    _sh([str(DVC), "push"], repo)
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    out = next(o for o in lock["stages"]["ingest"]["outs"] if o["path"] == "data/ingest")
    listing = yaml.safe_load(_object(storage, out["md5"]).read_text())   # the .dir object, pushed to `storage`
    assert {e["relpath"]: e["md5"] for e in listing}["documents.parquet"] == md5   # the same data version
    assert _object(storage, md5).is_file() and not (repo / ".packtrain").exists()

    # one MLflow store: the run's pipeline and the dvc-repro ingest both in data/mlflow.db
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'data' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("packtrain").experiment_id], max_results=100)
    ingest = [x for x in runs if x.info.run_name == "ingest"]
    assert {"mlflow.parentRunId" in x.data.tags for x in ingest} == {True, False}, [x.data.tags for x in ingest]
