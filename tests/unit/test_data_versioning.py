"""DVC md5s equal what a real `dvc add` records; ensure_dvc_repo + push to a local directory remote; push_file
into the repo that holds a path, without a .dvc file or a config change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from packtrain.versioning import data_md5, dvc_repo_of, ensure_dvc_repo, files_md5, git_sha, push, push_file

DVC = str(Path(sys.executable).with_name("dvc"))


def _tree(root: Path):
    (root / "d" / "sub").mkdir(parents=True)
    (root / "d" / "a.txt").write_bytes(b"hello\r\nworld\n")  # CRLF: DVC 3 hashes raw bytes
    (root / "d" / "sub" / "b.bin").write_bytes(bytes(range(256)) * 10)
    (root / "d" / "ü.txt").write_text("ünïcode", encoding="utf-8")
    (root / "f.txt").write_text("file\n")


@pytest.mark.slow
def test_md5_equals_real_dvc_add_and_push_works(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _tree(repo)
    ours = {"d": data_md5(repo / "d"), "f.txt": data_md5(repo / "f.txt")}
    ensure_dvc_repo(repo, tmp_path / "remote")
    cfg = (repo / ".dvc" / "config").read_text()
    assert "no_scm = True" in cfg and "remote = local" in cfg
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run([DVC, "add", "d", "f.txt"], cwd=repo, check=True, capture_output=True, env=env)
    for name, md5 in ours.items():
        rec = yaml.safe_load((repo / f"{name}.dvc").read_text())["outs"][0]
        assert rec["md5"] == md5
    assert ours["d"].endswith(".dir") and not ours["f.txt"].endswith(".dir")
    # files_md5 over the same layout == the directory hash
    files = {p.relative_to(repo / "d").as_posix(): p for p in (repo / "d").rglob("*") if p.is_file()}
    assert files_md5(files) == ours["d"]

    # push: tracked paths go straight to the remote; an untracked one is dvc-added first
    (repo / "new.txt").write_text("new data\n")
    sent = push(["d", "f.txt", "new.txt"], root=repo)
    assert sent == 6  # 3 files in d + its .dir object + f.txt + new.txt
    assert (repo / "new.txt.dvc").is_file()
    remote_objs = {p.name for p in (tmp_path / "remote").rglob("*") if p.is_file()}
    assert ours["f.txt"][2:] in remote_objs and ours["d"][2:] in remote_objs
    assert push(["d"], root=repo) == 0  # already there
    ensure_dvc_repo(repo, tmp_path / "other")  # idempotent: keeps the configured default remote
    assert (repo / ".dvc" / "config").read_text() == cfg


def test_ensure_keeps_a_user_default_remote_and_git_rev_outside_git(tmp_path):
    repo = tmp_path / "r"
    ensure_dvc_repo(repo, tmp_path / "rem1", remote_name="local")
    text = (repo / ".dvc" / "config").read_text().replace("remote = local", "remote = s3prod")
    (repo / ".dvc" / "config").write_text(text + "['remote \"s3prod\"']\n    url = s3://bucket/dvc\n")
    ensure_dvc_repo(repo, tmp_path / "rem2", remote_name="local")
    assert "remote = s3prod" in (repo / ".dvc" / "config").read_text()
    assert git_sha(tmp_path) is None


def test_data_md5_missing_path(tmp_path):
    from packtrain.errors import MissingDataError

    with pytest.raises(MissingDataError, match="no such file"):
        data_md5(tmp_path / "nope")


def test_md5_memo_reuses_a_settled_file_and_never_a_changed_or_fresh_one(tmp_path, monkeypatch):
    """One run hashes the same model many times: a settled file is read once per version; a rewrite (new mtime)
    and a fresh file (racy: mtime within the file system's timestamp granularity) are read again, so no stale
    md5 is ever returned."""
    import hashlib
    import os
    import time

    from packtrain import versioning

    reads = []
    real = versioning._file_md5
    monkeypatch.setattr(versioning, "_file_md5", lambda p: reads.append(p) or real(p))
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 4096)
    old = time.time() - 60
    os.utime(f, (old, old))
    first = versioning.file_md5(f)
    assert versioning.file_md5(f) == first == hashlib.md5(b"a" * 4096).hexdigest() and len(reads) == 1
    f.write_bytes(b"b" * 4096)                 # same size, new content
    os.utime(f, (old + 1, old + 1))
    assert versioning.file_md5(f) == hashlib.md5(b"b" * 4096).hexdigest() and len(reads) == 2
    g = tmp_path / "fresh.bin"
    g.write_bytes(b"c" * 10)
    versioning.file_md5(g)
    g.write_bytes(b"d" * 10)                   # within the timestamp granularity: still re-read
    assert versioning.file_md5(g) == hashlib.md5(b"d" * 10).hexdigest() and len(reads) == 4
    # a model the train stage saved a moment ago (fine timestamps, 0.2 s old): memoized at once; the same age on
    # a file system that stamps whole seconds: still re-read until 2 s have passed
    now = time.time_ns()
    h = tmp_path / "saved.bin"
    h.write_bytes(b"e" * 10)
    os.utime(h, ns=(now - 200_000_000 + 1, now - 200_000_000 + 1))
    versioning.file_md5(h), versioning.file_md5(h)
    assert len(reads) == 5
    coarse = (now // 1_000_000_000 - 1) * 1_000_000_000
    os.utime(h, ns=(coarse, coarse))
    versioning.file_md5(h), versioning.file_md5(h)
    assert len(reads) == 7 or time.time_ns() - coarse >= versioning.COARSE_SETTLE_NS
    d = tmp_path / "dir"
    d.mkdir()
    (d / "x").write_bytes(b"x")
    os.utime(d / "x", (old, old))
    assert versioning.data_md5(d) == versioning.data_md5(d)


def test_hash_ahead_fills_the_memo_the_next_data_md5_reads(tmp_path, monkeypatch):
    """hash_ahead(d) hashes a just-saved model directory on a thread, waiting until its files settle; the next
    data_md5(d) waits for it and then reads each file's md5 from the memo (no second read); the md5 is DVC's."""
    from packtrain import versioning

    monkeypatch.setattr(versioning, "_HASHED", {})
    monkeypatch.setattr(versioning, "_AHEAD", {})   # not the ones earlier trainings in this process started
    d = tmp_path / "model"
    d.mkdir()
    for name, size in (("model.safetensors", 3 << 20), ("config.json", 100)):
        (d / name).write_bytes(os.urandom(size))
    versioning.hash_ahead(d)
    versioning.hash_ahead(d)                    # one hash per path in flight
    assert len(versioning._AHEAD) == 1
    ahead = next(iter(versioning._AHEAD.values()))
    got = versioning.data_md5(d)
    assert ahead.done() and not versioning._AHEAD
    assert len(versioning._HASHED) == 2, "the files were hashed before they settled: not memoized"
    monkeypatch.setattr(versioning, "_HASHED", {})
    assert got == versioning.data_md5(d)
    versioning.hash_ahead(tmp_path / "missing")   # nothing to hash: nothing started, no error
    assert not versioning._AHEAD


def test_push_file_caches_and_pushes_to_the_default_remote_and_changes_nothing_else(tmp_path):
    """What `packtrain run` does inside a DVC repo: the file goes to the repo's cache and its default remote as the
    object `dvc add` + `dvc push` would store; no .dvc file, .dvc/config as it was; without a default remote the
    file is only cached and no remote is added."""
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run([DVC, "init", "--no-scm", "-q"], cwd=repo, check=True, env=env)
    f = tmp_path / "documents.parquet"   # outside the repo, as a run's output may be
    f.write_bytes(b"documents\n")
    md5 = data_md5(f)
    obj = Path("files") / "md5" / md5[:2] / md5[2:]
    assert dvc_repo_of(repo / "data" / "not-yet") == repo and dvc_repo_of(tmp_path) is None

    config = (repo / ".dvc" / "config").read_text()
    assert push_file(f, repo) == {"md5": md5, "pushed": 0, "remote": None}
    assert (repo / ".dvc" / "cache" / obj).read_bytes() == b"documents\n"
    assert (repo / ".dvc" / "config").read_text() == config

    subprocess.run([DVC, "remote", "add", "-d", "storage", str(tmp_path / "storage")], cwd=repo, check=True,
                   env=env)
    assert push_file(f, repo) == {"md5": md5, "pushed": 1, "remote": str(tmp_path / "storage")}
    assert (tmp_path / "storage" / obj).read_bytes() == b"documents\n"
    assert push_file(f, repo)["pushed"] == 0   # already there
    assert sorted(p.name for p in repo.iterdir()) == [".dvc", ".dvcignore"]   # no .dvc file


def test_large_reads_hash_as_dvc_does_across_chunk_boundaries(tmp_path, monkeypatch):
    """`_dvc_hashed` (one reused buffer of CHUNK bytes: few GIL hand-offs beside a busy thread) gives the Meta and
    HashInfo dvc_data's own hash_file gives, for an empty file, one shorter than a chunk, exactly one, and one
    over several chunks; a directory of them has the same .dir md5 either way."""
    from dvc_data.hashfile.hash import hash_file
    from dvc_data.hashfile.tree import Tree

    from packtrain import versioning

    monkeypatch.setattr(versioning, "CHUNK", 4096)
    monkeypatch.setattr(versioning, "_HASHED", {})
    fs = versioning._fs()
    d = tmp_path / "d"
    d.mkdir()
    tree = Tree()
    for size in (0, 1, 4095, 4096, 3 * 4096 + 7):
        f = d / f"f{size}"
        f.write_bytes(os.urandom(size))
        meta, info = hash_file(str(f), fs, "md5")
        assert versioning._dvc_hashed(f, fs) == (meta, info)
        tree.add((f.name,), meta, info)
    tree.digest()
    assert versioning.data_md5(d) == tree.hash_info.value
