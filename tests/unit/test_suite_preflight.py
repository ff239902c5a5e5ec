"""A recipe whose suites need a package this environment lacks is refused before anything runs, naming the suite,
the package, this Python and the fix (packtrain.config.preflight.check_suite_packages). lm-eval is taken away by
a finder on sys.meta_path that refuses `import lm_eval` — in this process, and in a `packtrain run` subprocess
through a sitecustomize on its PYTHONPATH — never by uninstalling anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from packtrain.config import load_run_config
from packtrain.config.preflight import check_suite_packages, missing_suite_packages
from packtrain.errors import ConfigError

BLOCKER = '''
import sys


class _NoModule:
    """`import {name}` fails as if the package were not installed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "{name}" or fullname.startswith("{name}."):
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
        return None


sys.meta_path.insert(0, _NoModule())
'''


class _NoModule:
    def __init__(self, name: str):
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name or fullname.startswith(self.name + "."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


@pytest.fixture
def without(monkeypatch):
    """without("lm_eval"): that import fails in this process for the test's duration."""
    def take_away(name: str) -> None:
        monkeypatch.setattr(sys, "meta_path", [_NoModule(name), *sys.meta_path])
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, mod)
    return take_away


def test_task_suffixes_are_the_evaluate_rooms():
    from packtrain.config import preflight
    from packtrain.evaluate import suites

    assert preflight.TASK_SUFFIXES == suites.TASK_SUFFIXES


def test_the_default_recipe_passes_where_lm_eval_is_installed():
    cfg = load_run_config("tiny-cpu")
    assert [s.role for s in cfg.evaluate.suites] == ["task"]   # the shipped lm-eval task: what is checked
    assert missing_suite_packages(cfg.evaluate) == []
    check_suite_packages(cfg.evaluate)


@pytest.mark.parametrize("module, dist", [("lm_eval", "lm-eval"), ("accelerate", "accelerate")])
def test_a_task_suite_without_its_package_is_refused_naming_it(without, module, dist):
    without(module)
    cfg = load_run_config("retrain-cpu")   # the Airflow DAG's default recipe
    with pytest.raises(ConfigError) as e:
        check_suite_packages(cfg.evaluate)
    msg = str(e.value)
    assert e.value.exit_code == 2
    assert msg.startswith(f"evaluate.suites[0] ('wordorder', @recipes/tasks/wordorder/wordorder.yaml) is an lm-eval "
                          f"task, which needs package {dist} (import {module}: No module named '{module}'); this "
                          f"Python ({sys.executable}) lacks it. Install it there: pip install "), msg
    assert "make setup-airflow" in msg and "--set evaluate.suites=[]" in msg
    if dist == "lm-eval":   # packtrain's own range when packtrain is installed (the venvs), else the bare name
        assert "pip install 'lm-eval<0.5,>=0.4.10' (" in msg or "pip install lm-eval (" in msg, msg


def test_text_suites_need_no_lm_eval(without, tmp_path):
    without("lm_eval")
    (tmp_path / "old.jsonl").write_text('{"text": "held out"}\n')
    cfg = load_run_config("tiny-cpu", [f"evaluate.suites=[{{name: old, role: regression, path: {tmp_path / 'old.jsonl'}}}]"])
    assert missing_suite_packages(cfg.evaluate) == []
    assert missing_suite_packages(load_run_config("tiny-cpu", ["evaluate.suites=[]"]).evaluate) == []


def test_the_train_stage_refuses_before_it_writes(without, tmp_path):
    """`dvc repro` and a KFP pod call the train stage on its own: it refuses too, before its output exists."""
    from packtrain.stages.train import run_train

    without("lm_eval")
    cfg = load_run_config("tiny-cpu", [f"workdir={tmp_path / 'wd'}"])
    with pytest.raises(ConfigError, match=r"needs package lm-eval"):
        run_train(cfg, tmp_path / "packs", tmp_path / "tokens", tmp_path / "train")
    assert not (tmp_path / "train").exists() and not (tmp_path / "wd").exists()


def test_packtrain_run_without_lm_eval_fails_before_any_stage(tmp_path):
    """The real CLI in a subprocess whose `import lm_eval` fails (a sitecustomize on PYTHONPATH): exit 2, the
    package named on stderr, no stage run (no run folder, no MLflow store, no log)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(name="lm_eval"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("MLFLOW_TRACKING_URI", None)
    wd = tmp_path / "wd"
    packtrain = Path(sys.executable).with_name("packtrain")
    r = subprocess.run([str(packtrain), "run", "--set", f"workdir={wd}"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "evaluate.suites[0] ('wordorder'" in r.stderr and "needs package lm-eval" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not [p for p in ("kfp", "mlflow.db", "logs", "cache") if (wd / p).exists()], sorted(wd.rglob("*"))
