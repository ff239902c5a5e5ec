"""The gate on real H200 numbers: the committed baseline passes against itself, and the first, slower
packtrain run (chunked loss, a host sync every step: 151.9k vs 169.3k tok/s) is flagged as a regression."""

from __future__ import annotations

import json
from pathlib import Path

from packtrain.cli import main

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "bench/baselines/gpu-350m-h200.json"
RULES = REPO / "bench/baselines/gpu-rules.yaml"


def _gate(candidate: Path, out: Path) -> tuple[int, dict]:
    code = main(["gate", "--candidate", str(candidate), "--baseline", str(BASE), "--rules", str(RULES),
                 "--out", str(out)])
    return code, json.loads((out / "gate.json").read_text())


def test_latest_gpu_result_passes_against_the_baseline(tmp_path):
    code, report = _gate(REPO / "bench/results/gpu_bench_350m.json", tmp_path)
    assert code == 0, report


def test_first_gpu_run_is_a_throughput_regression(tmp_path):
    code, report = _gate(REPO / "bench/results/history/gpu_bench_350m_run1_chunked_sync.json", tmp_path)
    assert code == 1 and report["verdict"] == "REGRESSION"
    assert {"packtrain.real_tok_per_s", "packtrain.useful_mfu"} <= set(report["regressions"])
    assert report["missing"] == []
