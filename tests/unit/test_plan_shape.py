"""One meaning for "budget" (tokens per pack): the shape `packtrain plan` plans is the shape `packtrain train` runs
(rows, budget, grad_accum, tokens per step) for train.rows = an integer and 'auto'; the old names are refused
naming what replaced them; one function decides every fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packtrain.cli import main
from packtrain.config import load_run_config
from packtrain.errors import ConfigError

V, BUDGET = 128, 128
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "train.device=cpu",
        "train.max_steps=2", "train.warmup_steps=1", "train.threads=1", "telemetry.interval_s=5",
        "tracking.enabled=false", "telemetry.min_utilization=0"]
# 0.85 × 0.0055 GiB ≈ 5.0 MB on the CPU: 4 rows × 128 tokens of this model fit (4.5 MB planned), 5 do not;
# with a global batch of 768 tokens (6 packs) 6 × 1 does not fit, 3 rows × grad_accum 2 (3.5 MB) does
AUTO = ["train.rows=auto", "plan.device_memory_gib=0.0055"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("plan_shape")
    make_synthetic_inputs(root, n_docs=80, vocab_size=V, budget=BUDGET, seed=2)
    return root


def _sets(*overrides: str) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def _planned(data: Path, overrides: list[str], capsys) -> dict:
    """`packtrain plan --packs` (the packs' budget and vocabulary, as train reads them) as JSON."""
    assert main(["plan", "--packs", str(data / "pack"), "--json", *_sets(*overrides)]) == 0
    return json.loads(capsys.readouterr().out)


def _trained(data: Path, out: Path, overrides: list[str]) -> dict:
    """What `packtrain train` actually ran: its setup and slot tokens per optimizer step."""
    assert main(["train", "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out", str(out),
                 *_sets(f"workdir={data / 'work'}", *overrides)]) == 0
    r = json.loads((out / "train_result.json").read_text())
    return {**r["setup"], "tokens_per_step": r["slot_tokens"] // r["steps"]}


@pytest.mark.parametrize("overrides, expect", [
    ([*TINY, "train.rows=3", "train.grad_accum=2"], (3, 2, "train.rows")),
    ([*TINY, *AUTO], (4, 1, "auto")),
    ([*TINY, *AUTO, "plan.global_batch_tokens=768"], (3, 2, "auto")),
], ids=["int", "auto", "auto-global-batch"])
def test_plan_shape_is_the_shape_training_runs(data, tmp_path, capsys, overrides, expect):
    plan = _planned(data, overrides, capsys)
    ran = _trained(data, tmp_path / "train", overrides)
    planned = (plan["rows"], plan["budget"], plan["grad_accum"], plan["gpus"], plan["tokens_per_step"])
    assert planned == (ran["rows"], ran["budget"], ran["grad_accum"], ran["world_size"], ran["tokens_per_step"])
    assert (plan["rows"], plan["grad_accum"], plan["rows_source"]) == expect and ran["rows_source"] == expect[2]
    assert plan["budget"] == BUDGET and plan["attention"] == ran["attention"] == "sdpa"
    assert plan["fits"]


@pytest.mark.parametrize("override, old, new", [
    ("train.budget=auto", "train.budget", "train.rows"),
    ("train.budget=1024", "train.budget", "train.rows"),
    ("train.budget=null", "train.budget", "train.rows"),
    ("plan.max_budget=4096", "plan.max_budget", "plan.max_rows"),
])
def test_old_budget_names_are_refused_naming_the_new_one(override, old, new, capsys):
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", [override])
    assert str(e.value).startswith(f"--set {override}: {old}: removed: set {new} instead")
    assert main(["plan", "--set", override]) == 2
    assert f"{old}: removed: set {new} instead" in capsys.readouterr().err


def test_a_recipe_with_train_budget_is_refused(tmp_path):
    recipe = tmp_path / "old.yaml"
    recipe.write_text("pack:\n  budget: 512\ntrain:\n  rows: 4\n  budget: auto\n")
    with pytest.raises(ConfigError, match=r"^recipe old.yaml: train.budget: removed: set train.rows instead — Packs"):
        load_run_config(recipe)


def test_budget_auto_on_the_plan_command_names_rows_auto(capsys):
    assert main(["plan", "--budget", "auto"]) == 2
    err = capsys.readouterr().err
    assert "a budget is tokens per pack" in err and "--rows auto" in err


def test_one_function_decides_the_shape(data, capsys):
    """train (packtrain.train.parts), `packtrain plan` and the CI gate call packtrain.planner.choose_shape; unset
    values (gpus, grad_accum, the device) fall back there only, so all callers agree on the recipe defaults."""
    import ast

    from packtrain.planner import choose_shape
    from packtrain.train import parts

    assert parts.choose_shape is choose_shape
    src = Path(__file__).resolve().parents[2] / "src" / "packtrain"
    defined = [p.relative_to(src).as_posix() for p in src.rglob("*.py")
               if any(isinstance(n, ast.FunctionDef) and n.name in ("choose_shape", "choose_budget")
                      for n in ast.walk(ast.parse(p.read_text())))]
    assert defined == ["planner/micro_batch.py"]

    cfg = load_run_config("tiny-cpu", TINY)    # no gpus, grad_accum or device memory given anywhere
    s = choose_shape(cfg.model, cfg.train, BUDGET, cfg.plan, V)
    plan = _planned(data, TINY, capsys)
    assert (s.rows, s.budget, s.grad_accum, s.gpus, s.tokens_per_step) == (
        plan["rows"], plan["budget"], plan["grad_accum"], plan["gpus"], plan["tokens_per_step"]) == (4, 128, 1, 1, 512)
