"""dvc.yaml + params.yaml + the committed .dvc/config in a fresh git repo (a tmp copy, tiny settings):
`dvc repro` runs the chain, a second `dvc repro` does nothing, and changing pack.budget reruns pack and
the stages after it only."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pipeline_helpers import REPO, tiny_corpus, tiny_settings

from packtrain import STAGES
from packtrain.config import load_run_config

DVC = Path(sys.executable).with_name("dvc")


def _ran(out: str) -> list[str]:
    return re.findall(r"Running stage '(\w+)'", out)


def _repro(repo: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    r = subprocess.run([str(DVC), "repro"], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return r.stdout + r.stderr


def _tiny_params(repo: Path) -> dict:
    """The repo's params.yaml with the tiny test settings applied (same keys the stages read)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for s in tiny_settings(Path("data"), Path("corpus")):
        key, value = s.split("=", 1)
        *path, last = key.split(".")
        d = params
        for p in path:
            d = d.setdefault(p, {})
        d[last] = yaml.safe_load(value)
    return params


def test_params_yaml_is_a_valid_recipe():
    cfg = load_run_config(REPO / "params.yaml")
    assert cfg.workdir == "data" and cfg.pack.budget > 0
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert list(stages) == list(STAGES)
    for name, st in stages.items():
        assert st["cmd"].startswith(f"packtrain {name} --recipe params.yaml")
        assert f"pipeline export {name}" in st["cmd"]
        assert st["outs"] == [f"${{workdir}}/{name}"]
        assert list(st["metrics"][0]) == [f"metrics/{name}.json"]
        assert all((REPO / d).exists() for d in st["deps"] if not d.startswith("${"))
    assert "plots/train_steps.csv" in stages["train"]["plots"][0]


@pytest.mark.slow
def test_dvc_repro_chain_noop_and_budget_change(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    # what a fresh clone has: the committed DVC config (no `dvc init`), dvc.yaml, the code deps
    for f in (".dvc/config", ".dvc/.gitignore", ".dvcignore", ".gitignore", "dvc.yaml"):
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f, repo / f)
    shutil.copytree(REPO / "src" / "packtrain", repo / "src" / "packtrain",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    tiny_corpus(repo / "corpus")
    params = _tiny_params(repo)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    out = _repro(repo)
    assert _ran(out) == list(STAGES), out[-3000:]
    for s in STAGES:
        assert (repo / "data" / s).is_dir() and (repo / "metrics" / f"{s}.json").is_file()
    assert (repo / "plots" / "train_steps.csv").read_text().startswith("step,loss,")
    assert "pack:" in (repo / "dvc.lock").read_text()

    out = _repro(repo)
    assert _ran(out) == [] and "Data and pipelines are up to date" in out

    params["pack"]["budget"] = params["pack"]["budget"] + 32
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = _repro(repo)
    assert _ran(out) == ["pack", "train", "evaluate", "register"], out[-3000:]
    assert yaml.safe_load((repo / "metrics" / "pack.json").read_text())["budget"] == params["pack"]["budget"]

    # the outputs go to the default (local) remote of the committed config
    r = subprocess.run([str(DVC), "push"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert any((repo / ".packtrain" / "dvc-remote").rglob("*"))
