"""`python -m bench` as users run it, from the repository root: `--list` names every suite module; every suite's
`--smoke` (all of them in one `python -m bench all --smoke` process, on the CPU) writes a record with the common
fields and rows of numbers; the results page is the one its template and the records give; the one-line packing
interface `python bench/pack_speed.py` still answers as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SUITES = sorted(p.stem.replace("_", "-") for p in (REPO / "bench" / "suites").glob("*.py") if p.stem != "__init__")
FIELDS = {"suite", "command", "machine", "settings", "rows", "goals", "goal_met", "created", "smoke"}


def _bench(*args: str, timeout: int = 120, script: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, script] if script else [sys.executable, "-m", "bench"]
    return subprocess.run([*cmd, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_list_names_every_suite_module():
    proc = _bench("--list")
    assert proc.returncode == 0, proc.stderr
    listed = sorted(line.split()[0] for line in proc.stdout.splitlines() if line.strip())
    assert listed == SUITES
    assert all(line.split()[1] in ("cpu", "gpu") for line in proc.stdout.splitlines() if line.strip())


def test_unknown_suite_is_named():
    proc = _bench("no-such-suite", "--out", "/nonexistent")
    assert proc.returncode == 2 and "no-such-suite" in proc.stderr and "pack-speed" in proc.stderr


@pytest.mark.parametrize("tokens", ["512", "1024,512", "a,b", "0,64"])
def test_lora_budget_refuses_bad_token_counts_and_keeps_the_record(tmp_path, tokens):
    rec = tmp_path / "lora_budget.json"
    rec.write_text('{"earlier": true}\n')
    proc = _bench("lora-budget", "--tokens", tokens, "--out", str(rec))
    assert proc.returncode == 1 and f"--tokens {tokens!r}" in proc.stderr and "0 < A < B" in proc.stderr
    assert rec.read_text() == '{"earlier": true}\n' and not rec.with_suffix(".png").exists()


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench-smoke")
    proc = _bench("all", "--smoke", "--out", str(out), timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("suite", SUITES)
def test_smoke_writes_a_record_of_numbers(smoke_dir, suite):
    rec = json.loads((smoke_dir / suite / f"{suite}.json").read_text(encoding="utf-8"))
    assert FIELDS <= set(rec), FIELDS - set(rec)
    assert rec["suite"] == suite and rec["smoke"] is True
    assert rec["command"].startswith(f"python -m bench {suite} --smoke --out ")
    assert rec["machine"]["cpus"] >= 1 and rec["machine"]["device"] == "cpu"
    assert isinstance(rec["rows"], list) and rec["rows"]
    good = [r for r in rec["rows"] if "error" not in r]
    assert good, rec["rows"]
    for r in good:
        assert any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in r.values()), r
    assert all(isinstance(v, bool) for v in rec["goal_met"].values())


def test_results_page_is_the_generated_one():
    proc = _bench("report", "--check")
    assert proc.returncode == 0, proc.stderr


def test_pack_speed_one_line_interface(tmp_path):
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.array([5, 3, 9, 2, 7, 1], dtype=np.int64))
    proc = _bench("--lengths", str(lengths), "--budget", "8", "--strategy", "ffd", script="bench/pack_speed.py")
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(row) == {"n_docs", "budget", "strategy", "fill", "seconds", "cpu_seconds", "max_pack_tokens",
                        "n_packs", "lower_bound", "l2_bound", "fill_vs_bound", "fill_vs_l2"}
    assert (row["n_docs"], row["budget"], row["strategy"]) == (6, 8, "ffd") and row["max_pack_tokens"] <= 8
    assert row["n_packs"] * 8 * row["fill"] == pytest.approx(27)
    # 27 tokens at budget 8: no packer needs fewer than ⌈27/8⌉ = 4 packs, and ffd needs 4 (fill vs bound 1.0)
    assert (row["lower_bound"], row["l2_bound"], row["n_packs"]) == (4, 4, 4)
    assert row["fill_vs_bound"] == row["fill_vs_l2"] == 1.0
    same = _bench("pack-speed", "--lengths", str(lengths), "--budget", "8", "--strategy", "ffd")   # no --out
    assert same.returncode == 0, same.stderr
    assert {k: v for k, v in json.loads(same.stdout).items() if "seconds" not in k} == \
        {k: v for k, v in row.items() if "seconds" not in k}
    bad = _bench("--lengths", str(tmp_path / "missing.npy"), "--budget", "8", script="bench/pack_speed.py")
    assert bad.returncode == 2 and "missing.npy" in bad.stderr
