"""Fixtures of the pipeline tests (helpers: pipeline_helpers.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def pinned_code(monkeypatch):
    """The shared tree changes under the tests (other people edit packtrain): pin the stage cache's code
    part so that 'unchanged code' really is unchanged for the duration of a test."""
    monkeypatch.setenv("PACKTRAIN_CODE_VERSION", "test-pinned")
    return "test-pinned"
