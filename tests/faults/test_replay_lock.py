"""`packtrain mlflow replay --buffer DIR` locks the buffer it replays, not `./data` of the folder it is started
from: with a `packtrain run` holding that folder's workdir, two replays of unrelated buffers both succeed
(before: exit 7, "workdir ./data is in use"); a second replay of the *same* buffer stops with exit 7 naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from packtrain.cli import main as cli_main
from packtrain.pipeline.lock import output_lock_path

HOLD = """
import sys, time
from packtrain.pipeline.lock import {fn}
with {fn}(sys.argv[1], "run"):
    print("locked", flush=True)
    time.sleep(120)
"""


def _hold(fn: str, path: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD.format(fn=fn), str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "locked"
    return p


def test_replays_of_unrelated_buffers_from_one_folder_both_succeed(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "here"
    folder.mkdir()
    monkeypatch.chdir(folder)
    bufs = [tmp_path / "a" / "mlflow-buffer", tmp_path / "b" / "mlflow-buffer"]
    for b in bufs:
        b.mkdir(parents=True)
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    holder = _hold("workdir_lock", folder / "data")   # a `packtrain run` in this folder's default workdir
    try:
        for b in bufs:
            assert cli_main(["mlflow", "replay", "--buffer", str(b), "--tracking-uri", uri]) == 0
            assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["buffer"] == str(b)
        for b in bufs:   # a finished replay leaves no lock file beside its buffer
            assert not output_lock_path(b).exists()
    finally:
        holder.kill()
        holder.wait()
    busy = _hold("buffer_lock", bufs[0])   # another replay of the same buffer is running
    try:
        assert cli_main(["mlflow", "replay", "--buffer", str(bufs[0]), "--tracking-uri", uri]) == 7
        err = capsys.readouterr().err
        assert f"MLflow buffer {bufs[0].resolve()} is being replayed by pid {busy.pid}" in err
        assert cli_main(["mlflow", "replay", "--buffer", str(bufs[1]), "--tracking-uri", uri]) == 0
    finally:
        busy.kill()
        busy.wait()
