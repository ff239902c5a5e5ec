"""Helpers of the pipeline tests: a tiny real-text corpus and the settings that make a whole
pipeline run take seconds of compute (the rest is process start-up: ~3 s a stage on this machine)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PINNED_CODE = "test-pinned"
"""PACKTRAIN_CODE_VERSION of every pipeline run in these tests: the shared tree changes under them (other
people edit packtrain), and 'unchanged code' must stay unchanged for the stage cache during a test."""
PACKTRAIN = Path(sys.executable).with_name("packtrain")

# Words of real English/Python prose with a long tail: documents of lognormal length (median ~90 words).
_WORDS = ("the of and to in is that for it as with was on be by this are or from at which not have an but "
          "function returns value list string object module class method argument default error file data "
          "token model train pack budget document attention memory loss step batch rank device").split()


def tiny_corpus(folder: Path, n_docs: int = 60, seed: int = 0) -> Path:
    """`n_docs` unique .txt documents (one per file) of 10–1000 words; deterministic for a seed."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_docs):
        n = min(1000, int(rng.lognormvariate(4.5, 0.9)) + 10)
        words = [rng.choice(_WORDS) for _ in range(n)]
        (folder / f"doc{i:03d}.txt").write_text(f"Document {i}. " + " ".join(words) + ".\n", encoding="utf-8")
    return folder


def tiny_settings(workdir: Path, corpus: Path) -> list[str]:
    """--set overrides of the tiny-cpu recipe: ~30k tokens, 2 train steps, 1 eval batch, 3 samples of 4
    tokens (3 × 32 greedy tokens were ~1–2 s of every evaluate; test_register_champion and
    test_publish_stages check the samples)."""
    return [
        f"workdir={workdir}", f"ingest.source={corpus}", "validate.min_rows=10",
        "tokenize.vocab_size=300", "tokenize.train_chars=60000", "tokenize.eval_fraction=0.2",
        "tokenize.workers=1", "pack.budget=64", "train.rows=2", "train.max_steps=2", "train.warmup_steps=1",
        "evaluate.rows=2", "evaluate.max_batches=1", "evaluate.sample_tokens=4", "tracking.system_metrics=false",
    ]


def as_args(settings: list[str]) -> list[str]:
    return [a for s in settings for a in ("--set", s)]


def run_main(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`packtrain ARGS` through the CLI's entry point in this process (a `packtrain` process costs ~6 s of imports
    on 2 cores; `packtrain run` runs its stages in process by default), in `cwd`, with the environment `run_cli`
    gives its process; returns what `run_cli` returns (exit code, stdout, stderr)."""
    import contextlib
    import io

    from packtrain.cli import main
    from packtrain.paths import patched_env

    out, err = io.StringIO(), io.StringIO()
    values = {"PACKTRAIN_CODE_VERSION": PINNED_CODE, "MLFLOW_TRACKING_URI": None, "PACKTRAIN_PARENT_RUN_ID": None,
              **(env or {})}
    before = os.getcwd()
    try:
        with patched_env(**{k: (v or None) for k, v in values.items()}), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            os.chdir(cwd)
            code = main(list(args))
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(["packtrain", *args], code, out.getvalue(), err.getvalue())


def run_cli(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """The real `packtrain` console script of this venv in a subprocess."""
    full_env = {**os.environ, "PACKTRAIN_CODE_VERSION": PINNED_CODE, **(env or {})}
    full_env.pop("MLFLOW_TRACKING_URI", None)
    full_env.pop("PACKTRAIN_PARENT_RUN_ID", None)
    return subprocess.run([str(PACKTRAIN), *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
