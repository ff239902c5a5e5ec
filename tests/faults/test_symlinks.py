"""Symbolic links in an ingest source folder: dangling links, link loops and folder loops are
a clear error (exit 3) naming the link and its target — or, with ingest.unsupported=skip, named on stderr and
in ingest_result.json and skipped; linked folders are read (also outside the source) or reported, never
dropped silently; a failed ingest leaves the previous output byte-identical; stats always match the table."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from packtrain.cli import main
from packtrain.versioning import data_md5, files_md5

NO_TRACK = ["--set", "tracking.enabled=false"]


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def ingest(tmp_path: Path, source: Path, *extra: str) -> tuple[int, Path]:
    out = tmp_path / "out"
    return main(["ingest", "--source", str(source), "--out", str(out), "--set", f"workdir={tmp_path / 'wd'}",
                 *NO_TRACK, *extra]), out


def table(out: Path) -> dict[str, list]:
    return pq.read_table(out / "documents.parquet").to_pydict()


def stats(out: Path) -> dict:
    return json.loads((out / "ingest_result.json").read_text())


@pytest.fixture
def src(tmp_path) -> Path:
    """src/{a.txt, sub/b.txt} plus outside/{o.txt}, a folder next to the source."""
    s = tmp_path / "src"
    (s / "sub").mkdir(parents=True)
    (s / "a.txt").write_text("alpha")
    (s / "sub" / "b.txt").write_text("beta")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "o.txt").write_text("outside text")
    return s


@pytest.fixture
def previous(tmp_path) -> dict[str, str]:
    """An earlier ingest of 300 documents into tmp_path/out; returns the hash of every file of it."""
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(300)))
    code, out = ingest(tmp_path, big)
    assert code == 0 and stats(out)["documents"] == 300
    return tree(out)


BAD_LINKS = [
    # id, links to make {name: target}, fragments of the error
    ("dangling", {"dang.txt": "nowhere.txt"}, ["dang.txt -> nowhere.txt (dangling: the target does not exist)"]),
    ("self-loop", {"loop.txt": "loop.txt"}, ["loop.txt -> loop.txt (a symbolic link loop)"]),
    ("two-link-loop", {"x.txt": "y.txt", "y.txt": "x.txt"},
     ["x.txt -> y.txt (a symbolic link loop)", "y.txt -> x.txt (a symbolic link loop)"]),
    ("folder-loop", {"sub/up": ".."}, ["sub/up -> .. (a loop: links back to the source folder; not followed)"]),
    ("folder-loop-deep", {"sub/again": "../sub"},
     ["sub/again -> ../sub (a loop: links back to folder 'sub'; not followed)"]),
    ("folder-read-twice", {"alias": "sub"}, ["alias -> sub (links to folder 'sub', which is read already"]),
]


@pytest.mark.parametrize("links,fragments", [b[1:] for b in BAD_LINKS], ids=[b[0] for b in BAD_LINKS])
def test_bad_links_are_an_input_error_naming_link_and_target(tmp_path, src, previous, capsys, links, fragments):
    for name, target in links.items():
        (src / name).symlink_to(target)
    code, out = ingest(tmp_path, src)
    err = capsys.readouterr().err
    assert code == 3, err
    assert err.startswith("error: source folder") and "Traceback" not in err
    assert f"{len(links)} entr" in err and "--set ingest.unsupported=skip" in err
    for frag in fragments:
        assert frag in err, (frag, err)
    assert tree(out) == previous     # the 300-document output is byte-identical
    assert [p.name for p in tmp_path.iterdir() if ".packtrain-" in p.name] == []


def test_skip_reports_every_bad_link_and_stats_match_the_table(tmp_path, src, previous, capsys):
    """The issue's case: 300 documents before, then a folder with 2 readable files and broken links under
    unsupported=skip. It used to crash after documents.parquet was replaced (2 rows, stats still 300)."""
    (src / "dang.txt").symlink_to("nowhere.txt")
    (src / "loop.txt").symlink_to("loop.txt")
    (src / "sub" / "up").symlink_to("..")
    code, out = ingest(tmp_path, src, "--set", "ingest.unsupported=skip")
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert "warning: ingest skipped 3 entries of" in cap.err
    for frag in ("dang.txt -> nowhere.txt (dangling", "loop.txt -> loop.txt (a symbolic link loop)",
                 "sub/up -> .. (a loop"):
        assert frag in cap.err
    assert "Skipped 3 entries that cannot be read" in cap.out
    t, s = table(out), stats(out)
    assert t["text"] == ["alpha", "beta"] and t["source"] == ["a.txt", "sub/b.txt"]
    assert s["documents"] == 2 == pq.ParquetFile(out / "documents.parquet").metadata.num_rows
    assert s["skipped_entries"] == [
        {"name": "dang.txt", "target": "nowhere.txt", "problem": "dangling: the target does not exist"},
        {"name": "loop.txt", "target": "loop.txt", "problem": "a symbolic link loop"},
        {"name": "sub/up", "target": "..", "problem": "a loop: links back to the source folder; not followed"}]
    # the md5 covers exactly the files read (DVC's own walk would trip over the broken links)
    assert s["input_md5_of"] == "files read"
    assert s["lineage"]["input_md5"]["source"] == files_md5({"a.txt": src / "a.txt", "sub/b.txt": src / "sub" / "b.txt"})
    assert s["output_md5"] == data_md5(out / "documents.parquet")
    assert tree(out) != previous and sorted(os.listdir(out)) == ["documents.parquet", "ingest_result.json"]


def test_linked_folders_and_files_are_read_also_outside_the_source(tmp_path, src, capsys):
    """Decision: links are followed wherever they point (a corpus assembled from links is common); the names
    are the paths through the link, and stats list every linked folder with its resolved target."""
    (src / "ext").symlink_to(tmp_path / "outside")
    (src / "ext2").symlink_to("../outside")          # the same folder again: read once, the second reported
    (src / "z.txt").symlink_to(tmp_path / "outside" / "o.txt")
    code, out = ingest(tmp_path, src, "--set", "ingest.unsupported=skip")
    cap = capsys.readouterr()
    assert code == 0, cap.err
    t, s = table(out), stats(out)
    assert t["source"] == ["a.txt", "ext/o.txt", "sub/b.txt", "z.txt"]
    assert t["text"] == ["alpha", "outside text", "beta", "outside text"]
    assert s["linked_folders"] == [{"name": "ext", "target": str((tmp_path / "outside").resolve())}]
    assert s["skipped_entries"] == [{"name": "ext2", "target": "../outside",
                                     "problem": "links to folder 'ext', which is read already; not followed"}]
    assert "Read linked folder(s) ext →" in cap.out and "ext2 -> ../outside" in cap.err


def test_plain_folder_keeps_the_dvc_md5_of_the_folder(tmp_path, src):
    code, out = ingest(tmp_path, src)
    s = stats(out)
    assert code == 0 and s["input_md5_of"] == "source" and s["lineage"]["input_md5"]["source"] == data_md5(src)
    assert s["skipped_entries"] == [] and s["linked_folders"] == []


def test_special_files_and_a_dangling_source_link(tmp_path, src, capsys):
    os.mkfifo(src / "pipe.txt")      # reading it would block forever
    code, _ = ingest(tmp_path, src)
    err = capsys.readouterr().err
    assert code == 3 and "pipe.txt (not a regular file: a FIFO, socket or device)" in err
    link = tmp_path / "gone"
    link.symlink_to(tmp_path / "nothing-here")
    code, _ = ingest(tmp_path, link)
    err = capsys.readouterr().err
    assert code == 3 and f"source {link} is a symbolic link to {tmp_path / 'nothing-here'} (dangling" in err


def test_the_real_executable_reports_a_loop_without_a_traceback(tmp_path, src):
    (src / "sub" / "up").symlink_to("..")
    (src / "loop.txt").symlink_to("loop.txt")
    exe = Path(sys.executable).with_name("packtrain")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    p = subprocess.run([str(exe), "ingest", "--source", str(src), "--set", f"workdir={tmp_path / 'wd'}", *NO_TRACK],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 3 and "Traceback" not in p.stderr
    assert "loop.txt -> loop.txt (a symbolic link loop)" in p.stderr and "sub/up -> .. (a loop" in p.stderr
    assert not (tmp_path / "wd" / "ingest").exists()
