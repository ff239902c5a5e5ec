"""Bad input to `packtrain evaluate` / `packtrain register`: a clear error naming the path or field, a
non-zero exit code, and the inputs untouched."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packtrain.cli import main
from packtrain.stages.lineage import make_lineage
from packtrain.stages.results import EvaluateResult
from packtrain.testing.tiny_model import build_tiny_model_dir, write_tiny_packs

TEXTS = ["def f(x):\n    return x\n", "import os\n", "The cat sat on the mat."] * 6


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("in")
    model = build_tiny_model_dir(root / "model", TEXTS)
    rng = np.random.default_rng(0)
    write_tiny_packs(root / "packs" / "eval", [rng.integers(0, 250, size=20) for _ in range(5)], budget=32)
    ev = root / "ev"
    ev.mkdir()
    EvaluateResult(   # what `packtrain evaluate` writes (register refuses anything else)
        eval_loss=5.5, perplexity=244.7, n_label_tokens=95, n_real_tokens=100, n_slot_tokens=160, n_segments=5,
        n_batches=1, n_batches_epoch=1, complete=True, seconds=0.1, tokens_per_s=1000.0, peak_memory_gib=None,
        memory_kind="cpu_max_rss", device="cpu", precision="fp32", attention="sdpa", rows=5, budget=32,
        model_dir=str(model), eval_split_dir=str(root / "packs" / "eval"), lineage=make_lineage({"model": "m"}),
    ).write(ev)
    from packtrain.config import load_run_config
    from packtrain.evaluate.paired_scores import paired_evaluation

    # the paired evaluation register decides from (here: the model alone, no champion)
    paired_evaluation(load_run_config("tiny-cpu", ["tracking.enabled=false", "evaluate.suites=[]"]), model, "none", ev,
                      recent_packs=root / "packs" / "eval")
    (root / "suites").mkdir()
    (root / "suites" / "task.yaml").write_text("task: [unclosed\n")
    (root / "suites" / "empty.jsonl").write_text('{"prompt": "2+2=", "completion": ""}\n')
    (root / "suites" / "table.csv").write_text("text\nhello\n")
    return root, model


def run_cli(args, tmp_path, capsys):
    code = main([*args, "--set", f"workdir={tmp_path / 'work'}"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case, code, needle", [
    ("evaluate_no_model", 5, "model directory"),
    ("evaluate_not_a_model", 3, "missing config.json"),
    ("evaluate_no_eval_packs", 5, "eval packs"),
    ("evaluate_corrupt_packs", 3, "corrupt"),
    ("evaluate_bad_device_value", 2, "evaluate.device"),
    ("register_no_eval_result", 5, "evaluate_result.json"),
    ("register_corrupt_eval_result", 3, "not valid JSON"),
    ("register_eval_result_without_metric", 3, "'perplexity'"),
    ("register_tracking_disabled", 2, "tracking.enabled"),
    ("register_bad_model_name", 2, "register.model_name"),
    ("register_without_paired_evaluation", 5, "suites.json does not exist"),
    ("evaluate_missing_suite_file", 5, "evaluate.suites[0] ('replay').path"),
    ("evaluate_unknown_suite_format", 3, "unknown format '.csv'"),
    ("evaluate_malformed_task_yaml", 3, "evaluate.suites[0] ('replay').path"),
    ("evaluate_suite_with_nothing_to_score", 3, "holds no document with text to score"),
])
def test_bad_input(case, code, needle, inputs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root, model = inputs
    bad = tmp_path / "bad"
    bad.mkdir()
    packs, ev = root / "packs", root / "ev"
    args = {
        "evaluate_no_model": ["evaluate", "--model", str(tmp_path / "nope"), "--packs", str(packs)],
        "evaluate_not_a_model": ["evaluate", "--model", str(bad), "--packs", str(packs)],
        "evaluate_no_eval_packs": ["evaluate", "--model", str(model), "--packs", str(bad)],
        "evaluate_corrupt_packs": ["evaluate", "--model", str(model), "--packs", str(bad)],
        "evaluate_bad_device_value": ["evaluate", "--model", str(model), "--packs", str(packs),
                                      "--set", "evaluate.device=tpu"],
        "register_no_eval_result": ["register", "--model", str(model), "--eval", str(bad)],
        "register_corrupt_eval_result": ["register", "--model", str(model), "--eval", str(bad)],
        "register_eval_result_without_metric": ["register", "--model", str(model), "--eval", str(bad),
                                                "--set", "register.metric=perplexity"],
        "register_tracking_disabled": ["register", "--model", str(model), "--eval", str(ev),
                                       "--set", "tracking.enabled=false"],
        "register_bad_model_name": ["register", "--model", str(model), "--eval", str(ev),
                                    "--set", "register.model_name=a/b"],
        "register_without_paired_evaluation": ["register", "--model", str(model), "--eval", str(bad)],
        **{f"evaluate_{k}": ["evaluate", "--model", str(model), "--packs", str(packs), "--set",
                             f"evaluate.suites=[{{name: replay, role: regression, path: {root / 'suites' / f}}}]"]
           for k, f in (("missing_suite_file", "nope.jsonl"), ("unknown_suite_format", "table.csv"),
                        ("malformed_task_yaml", "task.yaml"), ("suite_with_nothing_to_score", "empty.jsonl"))},
    }[case]
    if case == "evaluate_corrupt_packs":
        (bad / "eval").mkdir()
        (bad / "eval" / "meta.json").write_text("{not json")
    if case == "register_corrupt_eval_result":
        (bad / "evaluate_result.json").write_text("{\"eval_loss\": ")
    if case == "register_eval_result_without_metric":
        (bad / "evaluate_result.json").write_text(json.dumps({"eval_loss": 5.0}))
    if case == "register_without_paired_evaluation":   # an evaluate_result.json alone: no recorded-loss fallback
        (bad / "evaluate_result.json").write_bytes((ev / "evaluate_result.json").read_bytes())
    before = tree_digest(root), tree_digest(bad)
    got, err = run_cli(args, tmp_path, capsys)
    assert got == code, err
    assert err.strip().splitlines()[-1].startswith("error: ") and needle in err and "Traceback" not in err
    assert not (tmp_path / "work" / "mlflow.db").exists()   # rejected before any MLflow run was opened
    assert (tree_digest(root), tree_digest(bad)) == before
    assert not (tmp_path / "work" / "evaluate").exists() and not (tmp_path / "work" / "register").exists()


def test_installed_command_exits_nonzero(tmp_path):
    """The real entry point (a subprocess): missing model → exit 5, one-line error, no traceback."""
    exe = Path(sys.executable).with_name("packtrain")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "packtrain.cli"]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    p = subprocess.run([*cmd, "evaluate", "--set", f"workdir={tmp_path}", "--model", str(tmp_path / "m")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 5 and "error: model directory" in p.stderr and "Traceback" not in p.stderr


def test_register_defers_when_the_store_is_unreachable(inputs, tmp_path):
    """Issue 22: an unreachable store no longer fails register (it used to exit 1): the registration is buffered
    as one op for `packtrain mlflow replay`, register_result.json says "deferred", the inputs are untouched."""
    root, model = inputs
    exe = Path(sys.executable).with_name("packtrain")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "packtrain.cli"]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}
    before = tree_digest(root)
    p = subprocess.run([*cmd, "register", "--set", f"workdir={tmp_path}", "--set", "tracking.system_metrics=false",
                        "--model", str(model), "--eval", str(root / "ev")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "127.0.0.1:9" in p.stderr
    result = json.loads((tmp_path / "register" / "register_result.json").read_text())
    assert result["decision"] == "deferred" and result["version"] is None
    assert tree_digest(root) == before and list((tmp_path / "mlflow-buffer").glob("*.jsonl"))
