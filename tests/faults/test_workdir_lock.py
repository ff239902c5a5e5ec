"""The workdir lock through the real CLI: a second run in a busy workdir stops at once (exit 7) naming the holder
and changing nothing; a holder killed with SIGKILL leaves no lock behind (the next run says it took over a stale
one); children of the holder (torchrun workers, kfp.local components) do not lock again; log names never collide."""

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
from packtrain.pipeline.lock import HELD_ENV, LOCK_NAME, workdir_lock

HOLD = """
import sys, time
from packtrain.pipeline.lock import workdir_lock
with workdir_lock(sys.argv[1], "run"):
    print("locked", flush=True)
    time.sleep(120)
"""


def _holder(workdir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(workdir)], stdout=subprocess.PIPE, text=True)
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
