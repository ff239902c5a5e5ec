"""The workdir lock through the real CLI: a second run in a busy workdir stops at once (exit 7) naming the holder
and changing nothing; a holder killed with SIGKILL leaves no lock behind (the next run says it took over a stale
one); children of the holder (torchrun workers, kfp.local components) do not lock again; log names never collide.
The output-directory lock the same way: a stage whose --out another process is writing stops (exit 7) whatever
its workdir, one directory spelled two ways is one lock, and a finished run leaves no lock file behind.
(Two real `packtrain train` runs into one --out: tests/faults/test_train_faults.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packtrain.cli import main
from packtrain.errors import OutputBusy
from packtrain.pipeline.lock import HELD_ENV, LOCK_NAME, output_lock, output_lock_path, workdir_lock

HOLD = """
import sys, time
from packtrain.pipeline.lock import workdir_lock
with workdir_lock(sys.argv[1], "run"):
    print("locked", flush=True)
    time.sleep(120)
"""


HOLD_OUT = """
import sys, time
from packtrain.pipeline.lock import output_lock
with output_lock(sys.argv[1], "train"):
    print("locked", flush=True)
    time.sleep(120)
"""


def _holder(workdir: Path, script: str = HOLD) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", script, str(workdir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _ingest(workdir: Path, src: Path) -> list[str]:
    return ["ingest", "--set", f"workdir={workdir}", "--set", f"ingest.source={src}", "--set", "tracking.enabled=false"]


@pytest.fixture
def src(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(3):
        (d / f"doc{i}.txt").write_text(f"document number {i} " * 20)
    return d


def test_second_command_in_a_busy_workdir_stops_naming_the_holder(tmp_path, src, capsys):
    work = tmp_path / "work"
    holder = _holder(work)
    try:
        t0 = time.monotonic()
        assert main(_ingest(work, src)) == 7
        assert time.monotonic() - t0 < 10                       # refused at once, not after waiting
        err = capsys.readouterr().err
        assert f"workdir {work.resolve()} is in use by pid {holder.pid}" in err and "`packtrain run`" in err
        assert "--set workdir=DIR" in err
        assert not (work / "ingest").exists()                  # nothing written
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_leaves_a_stale_lock_that_the_next_run_takes_over(tmp_path, src, capsys):
    work = tmp_path / "work"
    holder = _holder(work)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert json.loads((work / LOCK_NAME).read_text())["pid"] == holder.pid   # its record is still there
    assert main(_ingest(work, src)) == 0
    err = capsys.readouterr().err
    assert f"stale lock in {work.resolve() / LOCK_NAME}: pid {holder.pid}" in err and "taken over" in err
    assert (work / "ingest" / "documents.parquet").is_file()
    assert (work / LOCK_NAME).read_text() == ""                # a clean exit clears the record


def test_children_of_the_holder_do_not_lock_again(tmp_path, src):
    work = tmp_path / "work"
    with workdir_lock(work, "run") as path:
        assert path == work.resolve() / LOCK_NAME and os.environ[HELD_ENV] == str(work.resolve())
        res = subprocess.run([sys.executable, "-m", "packtrain.cli", *_ingest(work, src)], capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        with workdir_lock(work, "train") as inner:             # the same process: re-entrant
            assert inner is None
    assert HELD_ENV not in os.environ


def test_run_log_names_never_collide(tmp_path):
    from packtrain.pipeline.local import new_log_path

    logs = tmp_path / "logs"
    logs.mkdir()
    first = new_log_path(logs)
    first.write_text("run 1")
    second = new_log_path(logs)
    assert second != first and str(os.getpid()) in first.name and second.name.endswith("-2.log")


# ------------------------------------------------------------------------------------- the output-directory lock
def test_a_stage_whose_out_another_run_is_writing_stops_naming_it(tmp_path, src, capsys):
    out = tmp_path / "shared" / "ingest"
    holder = _holder(out, HOLD_OUT)
    try:
        cmd = [*_ingest(tmp_path / "work2", src), "--out", str(out)]   # its own workdir: only --out is shared
        assert main(cmd) == 7
        err = capsys.readouterr().err
        lock = output_lock_path(out)
        assert f"output directory {out.resolve()} is in use by pid {holder.pid}" in err and "`packtrain train`" in err
        assert f"--out DIR); lock file {lock}" in err
        assert not out.exists()                                  # nothing written
    finally:
        holder.kill()
        holder.wait()
    assert main(cmd) == 0                                        # the holder died: its stale lock is taken over
    err = capsys.readouterr().err
    assert f"stale lock in {lock}: pid {holder.pid}" in err and "taken over" in err
    assert (out / "documents.parquet").is_file()
    assert not lock.exists()                                     # a finished run leaves no lock file


def test_one_directory_spelled_two_ways_is_one_lock(tmp_path):
    real = tmp_path / "real" / "train"
    real.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(real)
    holder = _holder(link, HOLD_OUT)
    try:
        assert output_lock_path(link) == output_lock_path(tmp_path / "real" / ".." / "real" / "train")
        with pytest.raises(OutputBusy, match=f"output directory {real} is in use by pid {holder.pid}"), \
                output_lock(real, "train"):
            pytest.fail("the block must not run")
    finally:
        holder.kill()
        holder.wait()
    with output_lock(real, "train") as path:                     # free again; re-entrant within one process
        assert json.loads(path.read_text())["pid"] == os.getpid()
        with output_lock(link, "pack") as inner:
            assert inner is None
    assert not path.exists()
