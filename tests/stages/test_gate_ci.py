"""The project's own CI gate (bench/ci_gate.py) through the real script: the committed baseline passes, a
deliberate regression (packing strategy `sequential`) fails with exit 1, missing data exits 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "ci_gate.py"


def _ci(tmp_path, *args):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    return proc


def test_committed_baseline_passes(tmp_path):
    proc = _ci(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cand = json.loads((tmp_path / "out" / "candidate.json").read_text())["metrics"]
    base = json.loads((ROOT / "bench" / "baselines" / "ci-tiny.json").read_text())["metrics"]
    assert cand == base                     # deterministic: the same numbers on every machine
    assert cand["pack.fill"] >= 0.99 and cand["train.tokens_per_step"] == 4 * 512


def test_sequential_packing_fails_the_gate(tmp_path):
    proc = _ci(tmp_path, "--set", "pack.strategy=sequential")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    res = json.loads((tmp_path / "out" / "gate.json").read_text())
    assert {"pack.fill", "pack.padding_fraction", "train.real_tokens_per_step"} <= set(res["regressions"])
    assert "below floor 0.99" in proc.stdout
    assert "REGRESSION" in (tmp_path / "out" / "gate.md").read_text()


@pytest.mark.parametrize("args,code,needle", [
    (["--baseline", "nowhere/ci.json"], 2, "metrics file not found: nowhere/ci.json"),
    (["--set", "pack.strategy=random"], 2, "pack.strategy"),
])
def test_ci_gate_bad_input(tmp_path, args, code, needle):
    proc = _ci(tmp_path, *args)
    assert proc.returncode == code and needle in proc.stderr


def test_missing_metric_in_baseline_exits_2(tmp_path):
    base = json.loads((ROOT / "bench" / "baselines" / "ci-tiny.json").read_text())
    del base["metrics"]["plan.peak_alloc_gib"]
    p = tmp_path / "base.json"
    p.write_text(json.dumps(base))
    proc = _ci(tmp_path, "--baseline", str(p))
    assert proc.returncode == 2 and "plan.peak_alloc_gib" in proc.stdout
