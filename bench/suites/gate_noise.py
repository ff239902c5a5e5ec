"""Run-to-run noise of the gate's metrics: the same training run repeated, unchanged, N times.

    python -m bench gate-noise --out bench/baselines/noise-cpu.json --merge             # CPU, tiny corpus
    python -m bench gate-noise --out $OUT/noise-gpu.json --synthetic --recipe 350m-h200 \
        --set train.max_steps=60                                                      # GPU (H200 session)
    python -m bench gate-noise --smoke --out /tmp/gn                                  # 1 repeat, 2 steps

CPU: the corpus and settings of the gate acceptance test (tests/stages/test_gate_champion.py: tiny corpus,
tiny-cpu recipe, budget 512, 12 steps); ingest → tokenize → pack once, then `packtrain train` N times on the
same packs, each its own process tracked in a sqlite MLflow store as in a real run (the MLflow client's
threads and imports are part of the peak RSS). GPU: synthetic packs (packtrain.testing.synthetic_inputs) of the
recipe's budget, `--no-tracking` where MLflow is not installed. Each repeat's
train_result.json is read under the canonical names (`train.throughput.real_tokens_per_s`, ...:
packtrain.gate.metrics); per metric the file records every value, the median and

    noise = (max − min) / |median|        (0 when the median is 0)

the spread between two unchanged runs that the default rules must tolerate (packtrain.gate.noise turns it
into thresholds). `--trees`: whole pipeline trees (pack → train → evaluate → register under a pipeline run,
as tests/stages/test_gate_champion.py makes them) tracked at `--tracking-uri` (default: a fresh sqlite store;
the recorded CPU session used a fresh `mlflow server`, pass its URI). The command line, device, CPU count and
date are recorded with the numbers. `--merge`
adds the session to an existing file: the file keeps every session, and its top-level `metrics.*.noise` is the
largest noise any session saw (the load of a shared machine varies; the gate must tolerate the worst).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

SUMMARY = "run-to-run noise of the gate's metrics: one unchanged training run repeated N times"
DEVICE = "cpu"
REPO = Path(__file__).resolve().parents[2]
CLEAN_ENV = dict(os.environ)   # before any in-process stage ran (they leave variables behind)

# the acceptance test's settings (tests/stages/test_gate_champion.py imports them from here)
GATE_TEST_SETTINGS = ["pack.budget=512", "train.max_steps=12", "evaluate.max_batches=1"]


def _packtrain(args: list[str], cwd: Path) -> None:
    exe = [sys.executable, "-m", "packtrain.cli"]
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    r = subprocess.run(exe + args, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"packtrain {' '.join(args[:1])} failed ({r.returncode}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}")


def prepare_cpu(root: Path, sets: list[str]) -> tuple[Path, Path, list[str]]:
    """Tiny corpus → ingest → tokenize → pack (the acceptance test's corpus and settings)."""
    from packtrain.testing.tiny_corpus import tiny_corpus, tiny_settings

    corpus = tiny_corpus(root / "corpus")
    settings = tiny_settings(root / "wd", corpus) + GATE_TEST_SETTINGS + sets
    args = [a for s in settings + ["tracking.enabled=false"] for a in ("--set", s)]
    _packtrain(["ingest", *args, "--out", str(root / "ingest")], root)
    _packtrain(["tokenize", *args, "--docs", str(root / "ingest"), "--out", str(root / "tokenize")], root)
    _packtrain(["pack", *args, "--tokens", str(root / "tokenize"), "--out", str(root / "pack")], root)
    return root / "pack", root / "tokenize", settings


def prepare_synthetic(root: Path, recipe: str, sets: list[str], n_docs: int = 6000) -> tuple[Path, Path, list[str]]:
    from packtrain.config import load_run_config
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    settings = [f"workdir={root / 'wd'}", *sets]
    cfg = load_run_config(recipe, settings)
    make_synthetic_inputs(root, n_docs=n_docs, vocab_size=cfg.tokenize.vocab_size, budget=cfg.pack.budget)
    return root / "pack", root / "tokenize", settings


def _args(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def data_tree(root: Path, sets: list[str]) -> tuple[Path, Path, list[str], str]:
    """The tiny corpus, ingest → tokenize in-process under a pipeline run (tracked at MLFLOW_TRACKING_URI);
    returns (corpus, token store, settings, pipeline run id)."""
    from packtrain.cli import main as cli
    from packtrain.config import load_run_config
    from packtrain.testing.tiny_corpus import tiny_corpus, tiny_settings
    from packtrain.tracking import end_pipeline_run, start_pipeline_run

    corpus = tiny_corpus(root / "corpus")
    settings = [*tiny_settings(root / "wd", corpus), *GATE_TEST_SETTINGS, *sets]
    parent = start_pipeline_run(load_run_config("tiny-cpu", settings))
    try:
        assert cli(["ingest", *_args(settings), "--out", str(root / "ingest")]) == 0
        assert cli(["tokenize", *_args(settings), "--docs", str(root / "ingest"), "--out", str(root / "tok")]) == 0
    finally:
        end_pipeline_run(parent)
    return corpus, root / "tok", settings, parent


def run_tree(root: Path, tag: str, sets: list[str], tokens: Path) -> dict:
    """pack → train → evaluate → register under one pipeline run, as `packtrain run` nests them; train in its
    own process with the environment this process started with (as under `packtrain run`), the others
    in-process. Returns {"pipeline": run id, "register": register_result.json, "dirs": {stage: dir}}."""
    from packtrain.cli import main as cli
    from packtrain.config import load_run_config
    from packtrain.tracking import end_pipeline_run, start_pipeline_run

    d = {s: root / f"{tag}-{s}" for s in ("pack", "train", "evaluate", "register")}
    parent = start_pipeline_run(load_run_config("tiny-cpu", sets))
    try:
        assert cli(["pack", *_args(sets), "--tokens", str(tokens), "--out", str(d["pack"])]) == 0
        env = {**CLEAN_ENV, "MLFLOW_TRACKING_URI": os.environ["MLFLOW_TRACKING_URI"], "PACKTRAIN_PARENT_RUN_ID": parent}
        r = subprocess.run([sys.executable, "-m", "packtrain.cli", "train", *_args(sets), "--packs", str(d["pack"]),
                            "--tokens", str(tokens), "--out", str(d["train"])], capture_output=True, text=True,
                           timeout=300, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert cli(["evaluate", *_args(sets), "--model", str(d["train"] / "model"), "--packs", str(d["pack"]),
                    "--out", str(d["evaluate"])]) == 0
        assert cli(["register", *_args(sets), "--model", str(d["train"] / "model"), "--eval", str(d["evaluate"]),
                    "--train", str(d["train"]), "--out", str(d["register"])]) == 0
    finally:
        end_pipeline_run(parent)
    reg = json.loads((d["register"] / "register_result.json").read_text())
    return {"pipeline": parent, "register": reg, "dirs": d}


def measure_trees(root: Path, sets: list[str], repeats: int, uri: str | None) -> tuple[list[dict], list[float],
                                                                                list[str]]:
    """`repeats` unchanged pipeline trees tracked at `uri` (None: a fresh sqlite store under `root`), each read
    back as the gate reads a run (packtrain.gate.metric_sources.load_run: canonical names)."""
    from mlflow import MlflowClient

    from packtrain.gate.metric_sources import load_run
    from packtrain.tracking.run_lifecycle import _close_clients

    uri = uri or f"sqlite:///{root / 'mlflow.db'}"
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    runs, seconds = [], []
    try:
        _, tokens, settings, _ = data_tree(root, sets)
        for i in range(repeats):
            t0 = time.perf_counter()
            tree = run_tree(root, f"t{i}", settings, tokens)
            _close_clients()
            seconds.append(round(time.perf_counter() - t0, 1))
            src = load_run(MlflowClient(uri), tree["pipeline"])
            runs.append({k: v for k, v in src.metrics.items() if k in _names()})
            print(f"tree {i + 1}/{repeats}: {seconds[-1]} s, "
                  f"{runs[-1].get('train.throughput.real_tokens_per_s', 0):,.0f} real tok/s", flush=True)
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous
    return runs, seconds, settings


def _names() -> set[str]:
    from packtrain.gate.metrics import BY_NAME

    return set(BY_NAME)


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


def _worst(sessions: list[dict], name: str) -> dict:
    """{"noise", "median"} of the session with the largest noise of metric `name` (among those measuring it)."""
    worst = max((x for x in sessions if name in x["metrics"]), key=lambda x: x["metrics"][name]["noise"])
    worst = worst["metrics"][name]
    return {"noise": worst["noise"], "median": worst["median"]}


def measure_trains(root: Path, a) -> tuple[list[dict], list[float], list[str], str]:
    """`a.repeats` `packtrain train` processes on the same packs (tiny corpus, or --synthetic)."""
    n_docs = SMOKE_DOCS if a.smoke else 6000
    packs, tokens, settings = (prepare_synthetic(root, a.recipe, a.set, n_docs) if a.synthetic
                               else prepare_cpu(root, a.set))
    track = ["tracking.enabled=false"] if a.no_tracking else [f"tracking.tracking_uri=sqlite:///{root}/mlflow.db",
                                                             "tracking.system_metrics=false"]
    args = ["--recipe", a.recipe] + _args(settings + track)
    runs, seconds, device = [], [], "?"
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
    return runs, seconds, settings, device


def add_arguments(ap) -> None:
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--recipe", default="tiny-cpu")
    ap.add_argument("--synthetic", action="store_true", help="synthetic packs of the recipe (GPU sessions)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--no-tracking", action="store_true", help="train with tracking.enabled=false")
    ap.add_argument("--merge", action="store_true", help="add this session to --out (noise = max over sessions)")
    ap.add_argument("--trees", action="store_true", help="CPU: whole pipeline trees (pack → train → evaluate → "
                    "register), as tests/stages/test_gate_champion.py makes them")
    ap.add_argument("--tracking-uri", default=None, help="--trees: the MLflow to track them in (default: a fresh "
                    "sqlite store)")


SMOKE = ["train.max_steps=2", "evaluate.max_batches=1"]
SMOKE_DOCS = 400
"""--smoke: one repeat of 2 steps on synthetic packs of the recipe (SMOKE_DOCS documents: ~150 packs, for 8 a
run), tracking off. One repeat runs the same code (a `packtrain train` process read back under the canonical
names, the per-metric median and noise, the session record); each repeat is a whole process (~14 CPU-s on the
2-core CI machine, almost all of it importing torch and transformers), and the noise of one run is 0."""


def run(a, out: Path):
    """The noise record: {"what", "device_kind", "metrics": worst noise per metric, "sessions": [...]} — the
    shape bench/baselines/noise-<kind>.json has (packtrain.gate.noise reads it) — plus the Record fields."""
    import tempfile

    from bench.harness import Record, machine_info

    if a.smoke:
        a.repeats, a.no_tracking, a.synthetic, a.set = 1, True, True, [*a.set, *SMOKE]
    with tempfile.TemporaryDirectory(prefix="gate-noise-") as tmp:
        if a.trees:
            runs, seconds, settings = measure_trees(Path(tmp), a.set, a.repeats, a.tracking_uri)
            device = "cpu"
        else:
            runs, seconds, settings, device = measure_trains(Path(tmp), a)
    names = sorted(set.intersection(*(set(r) for r in runs)))
    metrics = {}
    for n in names:
        vals = [r[n] for r in runs]
        metrics[n] = {"values": vals, "median": statistics.median(vals), "noise": round(noise_of(vals), 4)}
    gpu = None
    if "torch" in sys.modules:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    session = {
        "command": a.command,
        "device": gpu or platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "train_device": device, "recipe": a.recipe,
        "settings": [s for s in settings if not s.startswith(("workdir=", "ingest.source="))],
        "tracking": ("whole pipeline trees" if a.trees else "off" if a.no_tracking else "sqlite store (as a real run)"),
        "repeats": a.repeats, "seconds_per_repeat": seconds, "date": time.strftime("%Y-%m-%d"), "metrics": metrics,
    }
    path = a.record_path
    sessions = json.loads(path.read_text())["sessions"] if a.merge and path.is_file() else []
    sessions.append(session)
    names = sorted(set().union(*(set(x["metrics"]) for x in sessions)))
    for n, m in metrics.items():
        print(f"{n:40s} median {m['median']:<12.6g} noise {100 * m['noise']:6.2f}%")
    return Record(suite="gate-noise", study="run-to-run noise of unchanged training runs", command=a.command,
                  machine=machine_info(), settings={"recipe": a.recipe, "repeats": a.repeats, "set": a.set,
                                                    "trees": a.trees, "synthetic": a.synthetic},
                  rows=[{"metric": n, "median": m["median"], "noise": m["noise"]} for n, m in metrics.items()],
                  extra={"what": "run-to-run noise of unchanged training runs: noise = (max - min) / |median| per "
                                 "canonical metric and session; metrics.*: the largest noise over the sessions and "
                                 "that session's median",
                         "device_kind": "gpu" if gpu else "cpu",
                         "metrics": {n: _worst(sessions, n) for n in names}, "sessions": sessions})
