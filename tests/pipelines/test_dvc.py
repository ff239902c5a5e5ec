"""dvc.yaml (generated from the stage table) + params.yaml (generated from the tiny-cpu recipe) + the committed
.dvc/config in a fresh git repo (a tmp copy, tiny settings): `dvc repro` runs the chain, a second `dvc repro` does
nothing, an edited eval file (an item added to the task's data) changes validate, tokenize and evaluate,
changing plan.target_fraction reruns train (for real) and leaves the stages after it, only them, to rerun
(`dvc repro --dry` on train's new output), and `dvc metrics show` fits in 100 columns. The chain runs the session's `packtrain run` config (`tiny_pipeline`: the same recipe and settings but
for the paths) and reaches the same weights and the same verdict: the configs its stage runs logged, the suites
scored and the register decision are the run's."""

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
from pipeline_helpers import REPO, tiny_corpus

from packtrain import STAGES
from packtrain.config import flatten, load_run_config
from packtrain.config.base import apply_overrides
from packtrain.pipeline.dvc_export import PARAMS_RECIPE, export_stage, render_dvc_yaml, render_params_yaml
from packtrain.stages.table import stage_spec

DVC = Path(sys.executable).with_name("dvc")


def _ran(out: str) -> list[str]:
    return re.findall(r"Running stage '(\w+)'", out)


def _repro(repo: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    r = subprocess.run([str(DVC), "repro", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return r.stdout + r.stderr


PATHS = {"workdir": "data", "ingest.source": "corpus"}
"""The settings that are paths: the checkout's own (relative, as a user's params.yaml has them) in `dvc repro`."""


def _tiny_params(settings: list[str]) -> dict:
    """The committed params.yaml with the `packtrain run` settings applied as `--set` applies them, the paths made
    the checkout's (PATHS)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    local = [s for s in settings if s.split("=", 1)[0] not in PATHS] + [f"{k}={v}" for k, v in PATHS.items()]
    return apply_overrides(params, local)


def _but_paths(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in PATHS}


def test_dvc_yaml_is_the_generated_one():
    """Edit the stage table, then `python -m packtrain.pipeline.dvc_export` (never dvc.yaml by hand)."""
    assert (REPO / "dvc.yaml").read_text(encoding="utf-8") == render_dvc_yaml(), \
        "dvc.yaml differs from the stage table: run `python -m packtrain.pipeline.dvc_export`"


def test_params_yaml_is_the_recipe_resolved():
    """params.yaml is tiny-cpu with every field written out, so `dvc repro` runs what `packtrain run` runs (the
    suites, the device, the promotion rule). A recipe or a default that changes makes this fail until
    `make dvc-files` (python -m packtrain.pipeline.dvc_export) regenerates it."""
    text = (REPO / "params.yaml").read_text(encoding="utf-8")
    assert text == render_params_yaml(), \
        f"params.yaml differs from recipe {PARAMS_RECIPE} resolved: run `make dvc-files`"
    assert load_run_config(REPO / "params.yaml").to_dict() == load_run_config(PARAMS_RECIPE).to_dict()


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
def test_dvc_repro_chain_noop_plan_change_and_metrics(tiny_pipeline, tmp_path):
    assert tiny_pipeline["result"].returncode == 0
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    # what a fresh clone has: the committed DVC config (no `dvc init`), dvc.yaml, the code deps
    for f in (".dvc/config", ".dvc/.gitignore", ".dvcignore", ".gitignore", "dvc.yaml"):
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f, repo / f)
    shutil.copytree(REPO / "src" / "packtrain", repo / "src" / "packtrain",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(REPO / "recipes", repo / "recipes", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / "bench" / "results").mkdir(parents=True)   # the eval files dvc.yaml lists (eval_file_deps)
    shutil.copy(REPO / "bench" / "results" / "seed_spread_tiny-cpu.json", repo / "bench" / "results")
    tiny_corpus(repo / "corpus")   # the session pipeline's corpus, byte for byte
    params = _tiny_params(tiny_pipeline["settings"])
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    # the two resolved configs: identical but for the paths
    run_cfg = flatten(load_run_config(PARAMS_RECIPE, tiny_pipeline["settings"]).to_dict())
    dvc_cfg = flatten(load_run_config(repo / "params.yaml").to_dict())
    assert {k for k in run_cfg.keys() | dvc_cfg.keys() if run_cfg.get(k) != dvc_cfg.get(k)} == set(PATHS)

    out = _repro(repo)
    assert _ran(out) == list(STAGES), out[-3000:]
    for s in STAGES:
        assert (repo / "data" / s).is_dir() and (repo / "metrics" / f"{s}.json").is_file()
    assert (repo / "plots" / "train_steps.csv").read_text().startswith("step,loss,")
    assert "pack:" in (repo / "dvc.lock").read_text()
    _same_configs_weights_and_verdict(tiny_pipeline, repo)

    out = _repro(repo)
    assert _ran(out) == [] and "Data and pipelines are up to date" in out

    # an item added to the task's data file (its YAML unchanged): DVC sees the stages that read eval files changed
    # (the contamination check, the evaluation), as the stage cache of `packtrain run` does; restored after
    items = repo / "recipes" / "tasks" / "wordorder" / "wordorder.jsonl"
    before = items.read_bytes()
    items.write_bytes(before + before.splitlines(keepends=True)[0])
    r = subprocess.run([str(DVC), "status", "--json"], cwd=repo, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(json.loads(r.stdout)) == ["evaluate", "tokenize", "validate"], r.stdout
    items.write_bytes(before)

    # `dvc metrics show`: one short row per stage, readable in 100 columns
    r = subprocess.run([str(DVC), "metrics", "show"], cwd=repo, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "100", "DVC_NO_ANALYTICS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1 + len(STAGES) and max(map(len, lines)) <= 100, r.stdout
    assert "fill" in lines[0] and "metrics/pack.json" in r.stdout

    # the planner section reruns train and what follows it (before the stage table, train left plan out): DVC
    # reruns train for real (nothing before it), and train's new output leaves evaluate and register, and only
    # them, to rerun (`--dry`: DVC's decision on the real new output; running them would repeat the first repro's
    # evaluate and register commands: 17-42 of this test's 145-165 CPU-s on the shared 2-core machine)
    params["plan"]["target_fraction"] = 0.5
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = _repro(repo, "train")
    assert _ran(out) == ["train"], out[-3000:]
    out = _repro(repo, "--dry")
    assert _ran(out) == ["evaluate", "register"], out[-3000:]

    # the outputs go to the default (local) remote of the committed config
    r = subprocess.run([str(DVC), "push"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert any((repo / ".packtrain" / "dvc-remote").rglob("*"))


VERDICT = ("decision", "reason", "metric", "candidate_value", "champion_value", "threshold", "margin")
"""What the register stage decided, and on which number."""
SAME_TAGS = ("model_md5", "tokenizer_hash", "tokens_md5", "eval_loss", "perplexity", "validation",
             "validation_reason", "validation_against", "validation_failed", "decision", "decision_reason",
             "had_champion")
"""Version tags of the same weights judged the same way (beside the register run's validation/validation.json:
every suite scored, its md5, n, the challenger's score and the test applied)."""


def _same_configs_weights_and_verdict(tiny_pipeline, repo: Path) -> None:
    """The stage runs of `dvc repro` logged the configs the session's `packtrain run` logged (but for the paths),
    trained the same weights, scored the same suites with the same results and reached the same verdict."""
    from mlflow import MlflowClient

    run = json.loads(tiny_pipeline["json"].read_text())
    theirs = MlflowClient(run["tracking_uri"])
    ours = MlflowClient(f"sqlite:///{repo / 'data' / 'mlflow.db'}")
    dvc_runs = {r.info.run_name: r for r in ours.search_runs(
        [ours.get_experiment_by_name("packtrain").experiment_id], max_results=50)}
    for stage in STAGES:
        logged = theirs.get_run(run["stages"][stage]["mlflow_run"]["run_id"]).data.params
        assert _but_paths(dvc_runs[stage].data.params) == _but_paths(logged), stage
        assert any(k.startswith(f"{stage}.") for k in logged) or stage in ("ingest", "validate"), (stage, logged)

    reg_run = run["stages"]["register"]
    reg_dvc = json.loads((repo / "data" / "register" / "register_result.json").read_text())
    assert {k: reg_dvc[k] for k in VERDICT} == {k: reg_run[k] for k in VERDICT}
    tags_run, tags_dvc = reg_run["version_tags"], reg_dvc["version_tags"]
    assert {k: tags_dvc.get(k) for k in SAME_TAGS} == {k: tags_run.get(k) for k in SAME_TAGS}
    assert tags_dvc["model_md5"] and tags_dvc["validation"] == "promote"
    verdicts = [json.loads(Path(client.download_artifacts(reg["run_id"], "validation/validation.json")).read_text())
                for client, reg in ((ours, reg_dvc), (theirs, reg_run))]
    assert verdicts[0] == verdicts[1]
    assert [s["suite"] for s in verdicts[0]["suites"]] == ["recent", "wordorder"]   # the recipe's task suite too
