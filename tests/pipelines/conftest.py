"""Fixtures of the pipeline tests (helpers: pipeline_helpers.py)."""

from __future__ import annotations

import time

import pytest
from pipeline_helpers import PINNED_CODE, as_args, run_cli, tiny_corpus, tiny_settings


@pytest.fixture
def pinned_code(monkeypatch):
    """The shared tree changes under the tests (other people edit packtrain): pin the stage cache's code
    part so that 'unchanged code' really is unchanged for the duration of a test."""
    monkeypatch.setenv("PACKTRAIN_CODE_VERSION", PINNED_CODE)
    return PINNED_CODE


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory):
    """One full `packtrain run` on tiny data, shared by the local-pipeline and Airflow tests (the Airflow
    DAG's local run then restores every stage from this run's stage cache instead of training again).

    Returns {"root", "workdir", "corpus", "settings", "result" (CompletedProcess), "seconds"}.
    """
    root = tmp_path_factory.mktemp("tiny_pipeline")
    corpus = tiny_corpus(root / "corpus")
    workdir = root / "wd"
    settings = tiny_settings(workdir, corpus)
    t0 = time.perf_counter()
    result = run_cli(["run", *as_args(settings)], cwd=root)
    return {"root": root, "workdir": workdir, "corpus": corpus, "settings": settings, "result": result,
            "seconds": time.perf_counter() - t0}
