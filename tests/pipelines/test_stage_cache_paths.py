"""A stage cache entry is data read from disk: one that leads outside the cache — a symbolic link inside its
out/ to a user's file, out/ itself linked elsewhere, or the whole entry a link out of the cache — is refused
by name (PathOutsideError, exit 3) and restores nothing: the stage's previous output and the linked files
stay byte-identical (before, copytree followed the link and copied the user's file into the output)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from packtrain.paths import PathOutsideError
from packtrain.pipeline.cache import StageCache
from packtrain.stages.table import stage_spec


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): f"link:{os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir()
            else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}


def _link_in_out(entry: Path, victim: Path) -> None:
    (entry / "out" / "model" / "w.bin").unlink()
    (entry / "out" / "model" / "w.bin").symlink_to(victim / "id_rsa")


def _out_is_a_link(entry: Path, victim: Path) -> None:
    shutil.rmtree(entry / "out")
    (entry / "out").symlink_to(victim)


def _entry_is_a_link(entry: Path, victim: Path) -> None:
    shutil.copytree(entry, victim / "entry")
    shutil.rmtree(entry)
    entry.symlink_to(victim / "entry")


@pytest.mark.parametrize("tamper", [_link_in_out, _out_is_a_link, _entry_is_a_link],
                         ids=lambda f: f.__name__.strip("_"))
def test_an_entry_leading_outside_the_cache_is_refused(tmp_path, tamper):
    victim = tmp_path / "home"
    victim.mkdir()
    (victim / "id_rsa").write_bytes(b"-----BEGIN PRIVATE KEY-----\n")
    src = tmp_path / "out"
    (src / "model").mkdir(parents=True)
    (src / "model" / "w.bin").write_bytes(b"w" * 64)
    (src / stage_spec("train").stats_file).write_text("{}")   # the stage's record: an entry without it is a miss
    cache = StageCache(tmp_path / "cache")
    entry = cache.store("train", "k1", src, {"steps": 2}, {})
    tamper(entry, victim)
    before_victim = tree(victim)
    dst = tmp_path / "run2" / "train"
    (dst / "model").mkdir(parents=True)
    (dst / "model" / "w.bin").write_bytes(b"previous output")
    before_dst = tree(dst)
    with pytest.raises(PathOutsideError) as err:
        hit = cache.lookup("train", "k1")
        cache.restore(hit, dst)   # reached only if lookup let it through
    msg = str(err.value)
    assert err.value.exit_code == 3
    assert "outside" in msg and "allowed: a path inside" in msg and f"delete {entry}" in msg, msg
    assert tree(dst) == before_dst and tree(victim) == before_victim


def test_a_checked_entry_still_restores(tmp_path):
    src = tmp_path / "out"
    (src / "model").mkdir(parents=True)
    (src / "model" / "w.bin").write_bytes(b"w" * 64)
    (src / stage_spec("train").stats_file).write_text("{}")   # the stage's record: an entry without it is a miss
    cache = StageCache(tmp_path / "cache")
    cache.store("train", "k1", src, {"steps": 2}, {})
    hit = cache.lookup("train", "k1")
    assert hit is not None and hit.stats == {"steps": 2}
    cache.restore(hit, tmp_path / "run2" / "train")
    assert tree(tmp_path / "run2" / "train") == tree(src)
