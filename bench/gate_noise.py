"""Run-to-run noise of the gate's metrics: the same training run repeated, unchanged, N times.

    python bench/gate_noise.py --out bench/baselines/noise-cpu.json                    # CPU, tiny corpus
    python bench/gate_noise.py --out $OUT/noise-gpu.json --synthetic --recipe 350m-h200 \
        --set train.max_steps=60                                                      # GPU (H200 session)

CPU: the corpus and settings of the gate acceptance test (tests/stages/test_gate_champion.py: tiny corpus,
tiny-cpu recipe, budget 512, 12 steps); ingest → tokenize → pack once, then `packtrain train` N times on the
same packs. GPU: synthetic packs (packtrain.train.synthetic) of the recipe's budget. Each repeat's
train_result.json is read under the canonical names (`train.throughput.real_tokens_per_s`, ...:
packtrain.gate.metrics); per metric the file records every value, the median and

    noise = (max − min) / |median|        (0 when the median is 0)

the spread between two unchanged runs that the default rules must tolerate (packtrain.gate.noise turns it
into thresholds). The command line, device, CPU count and date are recorded with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests" / "pipelines"))

# the acceptance test's settings (tests/stages/test_gate_champion.py imports them from here)
GATE_TEST_SETTINGS = ["pack.budget=512", "train.max_steps=12", "evaluate.max_batches=1"]


def _packtrain(args: list[str], cwd: Path) -> None:
    exe = [sys.executable, "-m", "packtrain.cli"]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    r = subprocess.run(exe + args, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"packtrain {' '.join(args[:1])} failed ({r.returncode}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}")


def prepare_cpu(root: Path, sets: list[str]) -> tuple[Path, Path, list[str]]:
    """Tiny corpus → ingest → tokenize → pack (the acceptance test's corpus and settings)."""
    from pipeline_helpers import tiny_corpus, tiny_settings

    corpus = tiny_corpus(root / "corpus")
    settings = tiny_settings(root / "wd", corpus) + GATE_TEST_SETTINGS + sets + ["tracking.enabled=false"]
    args = [a for s in settings for a in ("--set", s)]
    _packtrain(["ingest", *args, "--out", str(root / "ingest")], root)
    _packtrain(["tokenize", *args, "--docs", str(root / "ingest"), "--out", str(root / "tokenize")], root)
    _packtrain(["pack", *args, "--tokens", str(root / "tokenize"), "--out", str(root / "pack")], root)
    return root / "pack", root / "tokenize", settings


def prepare_synthetic(root: Path, recipe: str, sets: list[str]) -> tuple[Path, Path, list[str]]:
    from packtrain.config import load_run_config
    from packtrain.train.synthetic import make_synthetic_inputs

    settings = [f"workdir={root / 'wd'}", *sets, "tracking.enabled=false"]
    cfg = load_run_config(recipe, settings)
    make_synthetic_inputs(root, n_docs=6000, vocab_size=cfg.tokenize.vocab_size, budget=cfg.pack.budget)
    return root / "pack", root / "tokenize", settings


def canonical_train_metrics(train_result: dict) -> dict[str, float]:
    """train_result.json → {canonical name: value} for the names of packtrain.gate.metrics (stage train)."""
    from packtrain.config.base import flatten
    from packtrain.gate.metrics import BY_NAME

    flat = flatten({"train": train_result})
    return {k: float(v) for k, v in flat.items() if k in BY_NAME and isinstance(v, (int, float))
            and not isinstance(v, bool)}


def noise_of(values: list[float]) -> float:
    """(max − min) / |median|; 0 for a zero median.

    >>> round(noise_of([90.0, 100.0, 110.0]), 3)
    0.2
    """
    med = statistics.median(values)
    return 0.0 if med == 0 else (max(values) - min(values)) / abs(med)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--recipe", default="tiny-cpu")
    ap.add_argument("--synthetic", action="store_true", help="synthetic packs of the recipe (GPU sessions)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gate-noise-") as tmp:
        root = Path(tmp)
        packs, tokens, settings = (prepare_synthetic(root, a.recipe, a.set) if a.synthetic
                                   else prepare_cpu(root, a.set))
        args = ["--recipe", a.recipe] + [x for s in settings for x in ("--set", s)]
        runs, seconds = [], []
        for i in range(a.repeats):
            t0 = time.perf_counter()
            out = root / f"train_{i}"
            _packtrain(["train", *args, "--packs", str(packs), "--tokens", str(tokens), "--out", str(out)], root)
            seconds.append(round(time.perf_counter() - t0, 1))
            result = json.loads((out / "train_result.json").read_text())
            runs.append(canonical_train_metrics(result))
            device = result.get("setup", {}).get("device") or "?"
            print(f"repeat {i + 1}/{a.repeats}: {seconds[-1]} s, "
                  f"{runs[-1].get('train.throughput.real_tokens_per_s', 0):,.0f} real tok/s", flush=True)
    names = sorted(set.intersection(*(set(r) for r in runs)))
    metrics = {}
    for n in names:
        vals = [r[n] for r in runs]
        metrics[n] = {"values": vals, "median": statistics.median(vals), "noise": round(noise_of(vals), 4)}
    gpu = None
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    record = {
        "what": "run-to-run noise of unchanged training runs: noise = (max - min) / |median| per canonical metric",
        "command": " ".join(shlex.quote(x) for x in ["python", "bench/gate_noise.py", *sys.argv[1:]]),
        "device_kind": "gpu" if gpu else "cpu", "device": gpu or platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "train_device": device, "recipe": a.recipe, "settings": settings,
        "repeats": a.repeats, "seconds_per_repeat": seconds, "date": time.strftime("%Y-%m-%d"),
        "metrics": metrics,
    }
    record["settings"] = [s for s in settings if not s.startswith(("workdir=", "ingest.source="))]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(record, indent=1) + "\n")
    for n, m in metrics.items():
        print(f"{n:40s} median {m['median']:<12.6g} noise {100 * m['noise']:6.2f}%")
    print(f"→ {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
