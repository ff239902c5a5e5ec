"""Helpers of the pipeline tests: a tiny real-text corpus and the settings that make a whole
pipeline run take seconds of compute (the rest is process start-up: ~3 s a stage on this machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from packtrain.testing.tiny_corpus import tiny_corpus, tiny_settings  # noqa: F401 - the tests' helpers

REPO = Path(__file__).resolve().parents[2]
PINNED_CODE = "test-pinned"
"""PACKTRAIN_CODE_VERSION of every pipeline run in these tests: the shared tree changes under them (other
people edit packtrain), and 'unchanged code' must stay unchanged for the stage cache during a test."""
PACKTRAIN = Path(sys.executable).with_name("packtrain")


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
    full_env = {**os.environ, "PACKTRAIN_CODE_VERSION": PINNED_CODE}
    full_env.pop("MLFLOW_TRACKING_URI", None)   # the session's, never a test's own (given in `env`)
    full_env.pop("PACKTRAIN_PARENT_RUN_ID", None)
    full_env.update(env or {})
    return subprocess.run([str(PACKTRAIN), *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
