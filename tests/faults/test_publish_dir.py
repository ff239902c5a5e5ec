"""The one publish helper (packtrain.publish.staged_output / publish_dir) under faults: SIGKILL at every point of
a publish, in both the atomic-exchange and the two-rename fallback mode, an exception at every point, stale
staging directories, foreign files, a symlinked output directory. Every case asserts the exact end state:
the complete previous output or the complete new one, never a mix, and a rerun that succeeds."""

from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from packtrain import publish
from packtrain.errors import ConfigError, PacktrainError
from packtrain.publish import FAULT_ENV, clean_stale, publish_dir, replace_dir, staged_output, staging_dir

OUTPUTS = ("a.txt", "sub")
POINTS = {"exchange": ["staged", "synced", "swapped", "removing-old"],
          "fallback": ["staged", "synced", "moved-old", "swapped", "removing-old"]}
COMMITTED = {"swapped", "removing-old"}   # from here on the new output is in place

WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from packtrain.publish import staged_output
    dst, tag = Path(sys.argv[1]), sys.argv[2]
    with staged_output(dst, ("a.txt", "sub"), "demo") as tmp:
        (tmp / "a.txt").write_text(tag)
        (tmp / "sub").mkdir()
        for i in range(3):
            (tmp / "sub" / f"{i}.bin").write_bytes(tag.encode() * (i + 1) * 100)
""")


def tree(root: Path) -> dict[str, str]:
    """{relpath: sha256 or 'dir'} of everything under root: equal trees are byte-identical."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def write(dst: Path, tag: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WRITER, str(dst), tag], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60)


def expected(tmp_path: Path, tag: str) -> dict[str, str]:
    ref = tmp_path / f"ref-{tag}"
    assert write(ref, tag).returncode == 0
    return tree(ref)


def leftovers(dst: Path) -> list[str]:
    return sorted(p.name for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}."))


@pytest.mark.parametrize("mode,point", [(m, i) for m, pts in POINTS.items() for i in range(len(pts))],
                         ids=[f"{m}-{p}" for m, pts in POINTS.items() for p in pts])
def test_sigkill_at_each_publish_point_leaves_old_or_new_whole(tmp_path, mode, point):
    old, new = expected(tmp_path, "old"), expected(tmp_path, "new")
    dst = tmp_path / "out"
    assert write(dst, "old").returncode == 0 and tree(dst) == old
    spec = f"publish@{point}" + (",publish.no_exchange" if mode == "fallback" else "")
    r = write(dst, "new", {FAULT_ENV: spec})
    name = POINTS[mode][point]
    assert r.returncode == -9, r.stderr
    assert f"PACKTRAIN_FAULT publish@{point}: {name} of {dst}" in r.stderr
    if name == "moved-old":
        # the one state that is neither: dst renamed away, the new copy not yet in place; the next
        # staging_dir (any rerun) puts the previous copy back before doing anything else
        assert not dst.exists() and len([n for n in leftovers(dst) if ".packtrain-old-" in n]) == 1
        assert clean_stale(dst)[0] == dst
    assert tree(dst) == (new if name in COMMITTED else old)
    r = write(dst, "rerun")
    assert r.returncode == 0, r.stderr
    assert tree(dst) == expected(tmp_path, "rerun") and leftovers(dst) == []


@pytest.fixture
def fresh_counter(monkeypatch):
    monkeypatch.setattr(publish, "_fault_counter", itertools.count())


def _stage(dst: Path, tag: str) -> None:
    with staged_output(dst, OUTPUTS, "demo") as tmp:
        (tmp / "a.txt").write_text(tag)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b").write_text(tag * 10)


@pytest.mark.parametrize("point", range(4), ids=POINTS["exchange"])
def test_an_exception_at_each_point(tmp_path, monkeypatch, fresh_counter, capsys, point):
    """Before the swap an exception abandons the new output (previous byte-identical, no staging dir left);
    after it the new output stays published, a warning names the previous copy it could not remove, and
    staged_output removes it on its way out."""
    dst = tmp_path / "out"
    _stage(dst, "old")
    before = tree(dst)
    monkeypatch.setenv(FAULT_ENV, f"publish.raise@{point}")
    name = POINTS["exchange"][point]
    if name in COMMITTED:
        _stage(dst, "new")
        assert (dst / "a.txt").read_text() == "new"
        assert "could not remove the previous copy" in capsys.readouterr().err
        assert leftovers(dst) == []
    else:
        with pytest.raises(PacktrainError, match=f"demo: publishing {dst} failed .*injected fault "
                                                 f"publish.raise@{point} at publish point '{name}'.*it is as it was"):
            _stage(dst, "new")
        assert tree(dst) == before and leftovers(dst) == []
    monkeypatch.delenv(FAULT_ENV)
    _stage(dst, "again")
    assert (dst / "a.txt").read_text() == "again" and leftovers(dst) == []


def test_failure_inside_the_block_publishes_nothing(tmp_path):
    dst = tmp_path / "out"
    _stage(dst, "old")
    before = tree(dst)
    with pytest.raises(ValueError), staged_output(dst, OUTPUTS, "demo") as tmp:
        (tmp / "a.txt").write_text("half")
        raise ValueError("a check failed")
    assert tree(dst) == before and leftovers(dst) == []
    with pytest.raises(Exception, match="sub not written; nothing was published"), \
            staged_output(dst, OUTPUTS, "demo") as tmp:
        (tmp / "a.txt").write_text("no sub")
    assert tree(dst) == before and leftovers(dst) == []


def test_foreign_entries_and_non_directories_are_refused(tmp_path):
    dst = tmp_path / "out"
    _stage(dst, "old")
    (dst / "notes.md").write_text("mine")
    before = tree(dst)
    with pytest.raises(ConfigError, match=r"holds 1 entry that is not demo output \(notes.md; demo writes a.txt, "
                                          r"sub\).*move them away or choose a new or empty output directory"):
        _stage(dst, "new")
    assert tree(dst) == before and leftovers(dst) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not a directory"):
        _stage(tmp_path / "file", "new")
    # legacy `.<output>.tmp` leftovers of earlier versions count as the stage's own
    (dst / "notes.md").unlink()
    (dst / ".a.txt.tmp").write_text("stale")
    _stage(dst, "new")
    assert sorted(os.listdir(dst)) == ["a.txt", "sub"]


def test_symlinked_output_is_published_at_its_target(tmp_path):
    real = tmp_path / "disk" / "out"
    real.mkdir(parents=True)
    link = tmp_path / "out"
    link.symlink_to(real)
    _stage(link, "one")
    _stage(link, "two")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert (real / "a.txt").read_text() == "two" and leftovers(real) == [] and leftovers(link) == []


def test_stale_staging_dirs_of_dead_processes_are_removed_live_ones_kept(tmp_path):
    dst = tmp_path / "out"
    _stage(dst, "old")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".out.packtrain-new-{dead_pid}-0123abcd"
    stale_old = tmp_path / f".out.packtrain-old-{dead_pid}-0123abce"
    legacy = tmp_path / ".out.tmp"
    live = tmp_path / f".out.packtrain-new-{os.getppid()}-0123abcf"
    for d in (stale, stale_old, legacy, live):
        (d / "sub").mkdir(parents=True)
        (d / "a.txt").write_text("never output")
    before = tree(dst)
    removed = clean_stale(dst)
    assert sorted(removed) == sorted([stale, stale_old, legacy]) and tree(dst) == before
    assert leftovers(dst) == [live.name]


def test_replace_dir_keeps_its_contract_for_other_callers(tmp_path):
    """train/ and tracking/ call replace_dir(tmp, root) with their own temp names."""
    root = tmp_path / "model"
    for tag in ("v1", "v2"):
        tmp = tmp_path / ".model.tmp"
        tmp.mkdir()
        (tmp / "w.bin").write_text(tag)
        replace_dir(tmp, root)
        assert (root / "w.bin").read_text() == tag and not tmp.exists()
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_published_directory_gets_a_normal_mode(tmp_path):
    """Not mkdtemp's 0700: readers running as another user (serving, a shared cache) can read the output."""
    dst = tmp_path / "out"
    old_umask = os.umask(0o022)
    try:
        _stage(dst, "one")
        assert (dst.stat().st_mode & 0o777) == 0o755
        dst.chmod(0o750)
        _stage(dst, "two")
        assert (dst.stat().st_mode & 0o777) == 0o750   # a replaced output keeps the mode it had
    finally:
        os.umask(old_umask)


def test_staging_dir_is_hidden_and_unique(tmp_path):
    dst = tmp_path / "out"
    a, b = staging_dir(dst), staging_dir(dst)
    assert a != b and a.name.startswith(".out.packtrain-new-") and a.parent == tmp_path
    publish_dir(a, dst)
    assert dst.is_dir() and not a.exists() and b.exists()


def test_unpublishable_places_are_a_clear_error_before_any_work():
    """A mount point cannot be swapped by a rename; an output whose parent cannot hold a staging directory
    cannot be published: both are refused up front, naming the path (Linux /proc stands for both)."""
    with pytest.raises(ConfigError, match="output /proc is a mount point.*pass a directory below it"), \
            staged_output(Path("/proc"), OUTPUTS, "demo"):
        pytest.fail("the block must not run")
    with pytest.raises(PacktrainError, match="cannot create a staging directory next to /proc/packtrain-x/out"), \
            staged_output(Path("/proc/packtrain-x/out"), OUTPUTS, "demo"):
        pytest.fail("the block must not run")


def test_atomic_copy_file_replaces_whole_and_a_failed_copy_leaves_the_old_file_and_no_temp(tmp_path):
    src, dst = tmp_path / "src.db", tmp_path / "out" / "dst.db"
    dst.parent.mkdir()
    dst.write_bytes(b"earlier output")
    src.write_bytes(b"new" * 1000)
    publish.atomic_copy_file(src, dst)
    assert dst.read_bytes() == b"new" * 1000 and sorted(p.name for p in dst.parent.iterdir()) == ["dst.db"]
    dst.write_bytes(b"earlier output")
    with pytest.raises(FileNotFoundError):
        publish.atomic_copy_file(tmp_path / "missing.db", dst)
    assert dst.read_bytes() == b"earlier output" and sorted(p.name for p in dst.parent.iterdir()) == ["dst.db"]
