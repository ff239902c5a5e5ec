"""packtrain.train.compile_cache: inductor's caches live under the workdir, so a fresh host (a new TMPDIR) reuses
them; a user's TORCHINDUCTOR_CACHE_DIR wins; damaged files are removed before torch loads them (and torch writes
them again).

The compile runs are fresh processes (inductor also caches in memory) with a fresh TMPDIR each: inductor's default
cache (/tmp/torchinductor_<user>) is then empty, as on a new pod. They compile `x @ w` forward and backward: only
matrix products, which inductor calls as library kernels, so no C++ is built (~1-3 s on 2 cores; a decoder layer's
forward and backward, as `packtrain train --set train.compile=true` compiles it, is ~75 s on the CPU, and its run
on a GPU is tests/gpu/test_train_gpu.py::test_compile_cache_second_run_hits)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from packtrain.train import compile_cache as cc

COMPILE = """
import json, os, sys
import torch
from packtrain.train.compile_cache import inductor_default_dir, workdir_compile_cache
with workdir_compile_cache(sys.argv[1], "cpu") as cache:
    x, w = torch.ones(4, 8, requires_grad=True), torch.full((8, 8), 0.5, requires_grad=True)
    y = torch.compile(lambda a, b: a @ b)(x, w)
    y.sum().backward()
    print(json.dumps({**cache.timings(), "removed": cache.removed, "y": y.sum().item(), "gx": x.grad.sum().item()}))
from torch._inductor.runtime.cache_dir_utils import default_cache_dir   # (imported by now: no cost)
assert inductor_default_dir() == os.path.abspath(default_cache_dir()), (inductor_default_dir(), default_cache_dir())
"""


def _compile_run(workdir: Path, tmp: Path) -> dict:
    """One fresh process on a fresh host: its own TMPDIR, no compile cache variables of the developer's."""
    tmp.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in (cc.INDUCTOR_ENV, cc.TRITON_ENV)}
    r = subprocess.run([sys.executable, "-c", COMPILE, str(workdir)], env={**env, "TMPDIR": str(tmp)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_second_run_on_a_fresh_host_hits_the_workdir_cache_even_with_damaged_modules(tmp_path):
    wd = tmp_path / "work"
    first = _compile_run(wd, tmp_path / "host1")
    key_dir = Path(first["compile_cache_dir"])
    assert first["compile_cache"] == "miss" and key_dir.parent == wd.resolve() / "compile-cache"
    assert key_dir.name.startswith("torch-") and key_dir.name.endswith("-cpu")
    assert (key_dir / cc.MANIFEST).is_file() and any((key_dir / "fxgraph").iterdir())
    assert not any(p.is_file() for p in (tmp_path / "host1").rglob("*"))   # nothing left in the host's /tmp
    # (each run also checks that inductor_default_dir() is inductor's own default_cache_dir() under its TMPDIR)

    modules = sorted(rel for rel in cc.read_manifest(key_dir) if rel.endswith(".py"))   # inductor's generated code
    assert modules
    for rel in modules:   # loaded as it is, a damaged module fails the run (NameError): the check removes it first
        (key_dir / rel).write_text("garbage")
    second = _compile_run(wd, tmp_path / "host2")                   # the next pod: only the workdir carries over
    assert second["compile_cache"] == "hit" and sorted(second["removed"]) == modules
    assert (second["y"], second["gx"]) == (first["y"], first["gx"]) == (128.0, 128.0)
    assert all((key_dir / rel).read_text() != "garbage" for rel in modules)   # written again from the entries


def _files(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def test_check_removes_changed_files_and_keeps_unlisted_and_copied_ones(tmp_path):
    root = tmp_path / "key"
    _files(root, {"fxgraph/a/entry": b"graph", "ab/mod.py": b"code", "triton/k/kernel.cubin": b"cubin"})
    assert cc.seal(root, {}) == 3
    listed = cc.read_manifest(root)
    (root / "ab" / "mod.py").write_bytes(b"CODE")             # same size, new content (and time)
    (root / "triton" / "k" / "kernel.cubin").write_bytes(b"cub")   # truncated
    _files(root, {"fxgraph/b/entry": b"new", "locks/x.lock": b"", "ab/.123.456.tmp": b"partial"})
    copy = tmp_path / "copy"                                    # a copied cache: same bytes, new times
    _files(copy, {"fxgraph/a/entry": b"graph"})
    os.utime(copy / "fxgraph/a/entry", ns=(1, 1))
    assert cc.remove_damaged(copy, listed) == []
    assert sorted(cc.remove_damaged(root, listed)) == ["ab/mod.py", "triton/k/kernel.cubin"]
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
        "ab/.123.456.tmp", "fxgraph/a/entry", "fxgraph/b/entry", "locks/x.lock", cc.MANIFEST]
    assert cc.seal(root, listed) == 2 and set(cc.read_manifest(root)) == {"fxgraph/a/entry", "fxgraph/b/entry"}
    (root / cc.MANIFEST).write_text("{not json")
    assert cc.read_manifest(root) == {} and cc.remove_damaged(root, {}) == []


@pytest.mark.parametrize(("env", "want"), [
    ({}, ("workdir", "workdir")),
    ({"TORCHINDUCTOR_CACHE_DIR": "<default>"}, ("workdir", "workdir")),   # inductor wrote its default at import
    ({"TORCHINDUCTOR_CACHE_DIR": "<own>"}, ("workdir", "workdir")),       # inherited from the launching process
    ({"TORCHINDUCTOR_CACHE_DIR": "/scratch/ind"}, ("user", "inductor")),
    ({"TORCHINDUCTOR_CACHE_DIR": "/scratch/ind", "TRITON_CACHE_DIR": "/scratch/tri"}, ("user", "user")),
    ({"TRITON_CACHE_DIR": "/scratch/tri"}, ("workdir", "user")),
])
def test_users_setting_wins_and_inductors_default_counts_as_unset(tmp_path, monkeypatch, env, want):
    own = str(cc.compile_cache_root(tmp_path) / cc.install_key("cpu"))
    default = str(tmp_path / "tmp" / "torchinductor_me")
    names = {"<default>": default, "<own>": own}
    for k in (cc.INDUCTOR_ENV, cc.TRITON_ENV):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, names.get(v, v))
    monkeypatch.setattr(cc, "inductor_default_dir", lambda: default)
    before = {k: os.environ.get(k) for k in (cc.INDUCTOR_ENV, cc.TRITON_ENV)}
    with cc.workdir_compile_cache(tmp_path, "cpu") as cache:
        assert (cache.dirs.source, cache.dirs.triton_source) == want
        assert os.environ[cc.INDUCTOR_ENV] == (own if want[0] == "workdir" else "/scratch/ind")
        assert os.environ.get(cc.TRITON_ENV) == {"workdir": own + "/triton", "user": "/scratch/tri",
                                                 "inductor": None}[want[1]]
        assert cache.timings()["compile_cache"] == "off"    # nothing compiled in between
        assert ("the workdir's" in cache.line("train")) == (want[0] == "workdir")
    assert {k: os.environ.get(k) for k in (cc.INDUCTOR_ENV, cc.TRITON_ENV)} == before   # put back
    assert not (tmp_path / "cache").exists()   # nothing compiled, nothing written
