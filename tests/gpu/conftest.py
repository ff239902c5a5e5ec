"""GPU tests write real checkpoints (a 350M model's step is ~4 GB with its optimizer state): a whole `pytest tests/gpu`
left 58 GB under /tmp/pytest-of-<user> on a 64 GB device host (H100, 2026-12-07), and its last test then failed with
"no space left on the device". The tmp_path of a GPU test that passed is removed when the test ends; a failed
test's is kept to look at (as pytest's tmp_path_retention_policy=failed would, here for the GPU tests only)."""

from __future__ import annotations

import shutil

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.stash.setdefault(_FAILED, True)
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _free_passed_tmp_path(request):
    path = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None   # taken now: torn down
    yield   # after this fixture
    if path is not None and not request.node.stash.get(_FAILED, False):
        shutil.rmtree(path, ignore_errors=True)
