"""dvc.yaml (generated from the stage table) + params.yaml + the committed .dvc/config in a fresh git repo (a
tmp copy, tiny settings): `dvc repro` runs the chain, a second `dvc repro` does nothing, changing
plan.target_fraction reruns train and the stages after it only, and `dvc metrics show` fits in 100 columns."""

from __future__ import annotations

import json
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
from packtrain.pipeline.dvc_export import export_stage, render_dvc_yaml
from packtrain.stages.table import stage_spec

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


def test_dvc_yaml_is_the_generated_one():
    """Edit the stage table, then `python -m packtrain.pipeline.dvc_export` (never dvc.yaml by hand)."""
    assert (REPO / "dvc.yaml").read_text(encoding="utf-8") == render_dvc_yaml(), \
        "dvc.yaml differs from the stage table: run `python -m packtrain.pipeline.dvc_export`"


def test_params_yaml_is_a_valid_recipe():
    cfg = load_run_config(REPO / "params.yaml")
    assert cfg.workdir == "data" and cfg.pack.budget > 0
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert list(stages) == list(STAGES)
    for name, st in stages.items():
        assert st["cmd"].startswith(f"packtrain {name} --recipe params.yaml")
        assert f"pipeline export {name}" in st["cmd"]
        assert st["outs"] == [f"${{workdir}}/{name}"]
        assert list(st["metrics"][0]) == [f"metrics/{name}.json"]
        assert all((REPO / d).exists() for d in st["deps"] if not d.startswith("${"))
        assert st["params"] == list(stage_spec(name).config)
        for key in st["params"]:   # DVC refuses a stage whose parameter is missing from params.yaml
            node = params
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"params.yaml lacks {key} (stage {name})"
                node = node[part]
    assert "plots/train_steps.csv" in stages["train"]["plots"][0]
    # the planner and the loader decide what train does: a change there reruns train
    assert {"plan", "pack.budget"} <= set(stages["train"]["params"])
    assert "src/packtrain/packing" in stages["train"]["deps"]


def test_exported_metrics_are_a_few_numbers(tmp_path):
    stage_dir = tmp_path / "train"
    stage_dir.mkdir()
    (stage_dir / "train_result.json").write_text(json.dumps(
        {"final_loss": 4.061234, "throughput": {"real_tokens_per_s": 12340.57, "useful_mfu": 0.004},
         "memory": {"peak_alloc_gib": 0.0}, "setup": {"attention": "sdpa"}, "loss_curve": [5.0, 4.0612]}))
    (stage_dir / "train_log.jsonl").write_text('{"step": 1, "loss": 5.0, "lr": 0.1, "other": 3}\n')
    written = export_stage("train", stage_dir, tmp_path / "metrics", tmp_path / "plots")
    assert json.loads(written[0].read_text()) == {"tok/s": 12341, "loss": 4.0612}   # 5 significant digits
    assert written[1].read_text() == "step,loss,lr,grad_norm,step_time_s,real_tokens\n1,5.0,0.1,,,\n"
    (stage_dir / "register_result.json").write_text(json.dumps({"version": "3", "decision": "champion"}))
    assert json.loads(export_stage("register", stage_dir, tmp_path / "m")[0].read_text()) == {"version": 3}


@pytest.mark.slow
def test_dvc_repro_chain_noop_plan_change_and_metrics(tmp_path):
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

    # `dvc metrics show`: one short row per stage, readable in 100 columns
    r = subprocess.run([str(DVC), "metrics", "show"], cwd=repo, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "100", "DVC_NO_ANALYTICS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1 + len(STAGES) and max(map(len, lines)) <= 100, r.stdout
    assert "fill" in lines[0] and "metrics/pack.json" in r.stdout

    # the planner section reruns train and what follows it (before the stage table, train left plan out)
    params["plan"]["target_fraction"] = 0.5
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = _repro(repo)
    assert _ran(out) == ["train", "evaluate", "register"], out[-3000:]

    # the outputs go to the default (local) remote of the committed config
    r = subprocess.run([str(DVC), "push"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert any((repo / ".packtrain" / "dvc-remote").rglob("*"))
