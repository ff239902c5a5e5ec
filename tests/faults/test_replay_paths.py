"""`packtrain mlflow replay` treats a buffer file as data: every path a line names is resolved (`..` and
symbolic links) and must lie inside the buffer's artifacts/. A line that points elsewhere — `../victim/x`, a
copy that is a symbolic link out, a buffered directory holding such a link, an absolute path, the old
`"buffered": true` layout pointing out — is refused by name (buffer file, line number, the path, what is
allowed) with exit 3: nothing is uploaded for it and the victim folder is byte-identical afterwards. The
other ops of the same file still apply, and the refused line is kept in rejected.jsonl.

One buffer is recorded per module with a real BufferedClient against a dead port (create_run, one artifact,
set_terminated) and replayed into a real sqlite store (migrated once, copied into each case).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from pathlib import Path

import pytest
from mlflow import MlflowClient

from packtrain.cli import main as cli_main
from packtrain.tracking.buffer import BufferedClient

EXPERIMENT = "replay-paths"


def _dead_uri() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"   # closed again: nothing listens there


def tree(root: Path) -> dict[str, str]:
    """Every entry under `root`: a symlink's target, a folder, or a file's sha256."""
    return {str(p.relative_to(root)): f"link:{os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir()
            else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(buffer with one file: create_run, log_artifact, set_terminated; an empty migrated store db)."""
    root = tmp_path_factory.mktemp("paths")
    src = root / "report.txt"
    src.write_text("the real artifact\n")
    client = BufferedClient(_dead_uri(), root / "buffer", retry_after_s=30)
    rid = client.create_run(EXPERIMENT, "train", {})
    client.log_artifact(rid, src, "reports")
    client.set_terminated(rid)
    client.close()
    template = root / "template.db"
    MlflowClient(f"sqlite:///{template}").search_experiments()   # migrations run once
    (buf_file,) = (root / "buffer").glob("*.jsonl")
    assert [json.loads(ln)["op"] for ln in buf_file.read_text().splitlines()] == [
        "create_run", "log_artifact", "set_terminated"]
    return root / "buffer", template


def _case(recorded, tmp_path: Path, edit) -> tuple[Path, Path, str]:
    """A copy of the buffer whose artifact line (line 2) `edit(op, buffer)` rewrote; (buffer, its file, uri)."""
    buf, template = recorded
    shutil.copytree(buf, tmp_path / "buffer", symlinks=True)
    shutil.copy(template, tmp_path / "mlflow.db")
    (path,) = (tmp_path / "buffer").glob("*.jsonl")
    lines = path.read_text().splitlines()
    op = json.loads(lines[1])
    edit(op, tmp_path / "buffer")
    lines[1] = json.dumps(op)
    path.write_text("\n".join(lines) + "\n")
    return tmp_path / "buffer", path, f"sqlite:///{tmp_path / 'mlflow.db'}"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "x").write_bytes(b"secret bytes\x00\xff")
    (victim / "sub" / "y").write_text("more of the user's data\n")
    return victim


def _relative(op, buf):
    op["buffered_path"] = "../victim/x"


def _dotdot_inside_artifacts(op, buf):
    op["buffered_path"] = "artifacts/../../victim/x"


def _absolute(op, buf):
    op["buffered_path"] = str(buf.parent / "victim" / "x")


def _symlinked_copy(op, buf):
    copy = buf / op["buffered_path"]
    copy.unlink()
    copy.symlink_to(buf.parent / "victim" / "x")


def _link_inside_a_copied_dir(op, buf):
    copy = buf / op["buffered_path"]
    copy.unlink()
    copy.mkdir()
    (copy / "ok.txt").write_text("fine\n")
    (copy / "leak").symlink_to(buf.parent / "victim" / "sub")


def _old_layout(op, buf):
    op.pop("buffered_path")
    op["path"], op["buffered"] = str(buf.parent / "victim" / "x"), True


def _path_only(op, buf):
    op.pop("buffered_path")
    op["path"] = str(buf.parent / "victim" / "x")


@pytest.mark.parametrize("edit", [_relative, _dotdot_inside_artifacts, _absolute, _symlinked_copy,
                                  _link_inside_a_copied_dir, _old_layout, _path_only],
                         ids=lambda f: f.__name__.strip("_"))
def test_a_line_pointing_outside_the_buffer_is_refused_and_touches_nothing(recorded, tmp_path, capsys, edit):
    victim = _victim(tmp_path)
    before = tree(victim)
    buf, buf_file, uri = _case(recorded, tmp_path, edit)
    capsys.readouterr()
    rc = cli_main(["mlflow", "replay", "--buffer", str(buf), "--tracking-uri", uri])
    cap = capsys.readouterr()
    out = json.loads(cap.out.strip().splitlines()[-1])
    assert rc == 3, cap.err
    (msg,) = out["refused"]
    assert msg.startswith(f"{buf_file}:2: log_artifact op ") and "refused" in msg, msg
    assert f"(allowed: a path inside {Path(os.path.realpath(buf)) / 'artifacts'}, after resolving" in msg, msg
    assert f"error: {msg}" in cap.err and cap.err.count(msg) == 1   # said once, on stderr
    # the victim folder is untouched, nothing of it reached the store
    assert victim.is_dir() and tree(victim) == before
    c = MlflowClient(uri)
    (run,) = c.search_runs([c.get_experiment_by_name(EXPERIMENT).experiment_id])
    assert run.info.status == "FINISHED"   # the other lines of the file applied
    assert c.list_artifacts(run.info.run_id) == []
    # the refused line is kept for a human, with the reason
    (kept,) = [json.loads(ln) for ln in (buf / "rejected.jsonl").read_text().splitlines()]
    assert kept["op"] == "log_artifact" and msg.startswith(kept["error"])
    # a second replay has nothing left to do and still touches nothing
    assert cli_main(["mlflow", "replay", "--buffer", str(buf), "--tracking-uri", uri]) == 0
    assert tree(victim) == before


@pytest.mark.parametrize("name", ["applied.log", "rejected.jsonl", "run_ids.json"])
def test_a_ledger_file_linked_out_of_the_buffer_stops_the_replay(recorded, tmp_path, capsys, name):
    """A replay appends to applied.log and rejected.jsonl and rewrites run_ids.json: one that is a symbolic
    link out of the buffer would write into the file it points at. Refused before anything is sent."""
    victim = _victim(tmp_path)
    before = tree(victim)
    buf, _, uri = _case(recorded, tmp_path, lambda op, buf: None)
    (buf / name).symlink_to(victim / "x")
    assert cli_main(["mlflow", "replay", "--buffer", str(buf), "--tracking-uri", uri]) == 3
    err = capsys.readouterr().err
    assert f"buffer file {name} (a symbolic link)" in err and str(victim / "x") in err, err
    assert tree(victim) == before
    c = MlflowClient(uri)
    assert c.get_experiment_by_name(EXPERIMENT) is None   # nothing was sent


def test_the_buffers_own_copy_still_replays_and_is_dropped(recorded, tmp_path, capsys):
    """The untouched buffer: its copy (inside artifacts/) is uploaded, then only artifacts/<op id>/ goes."""
    buf, _, uri = _case(recorded, tmp_path, lambda op, buf: None)
    (tmp_path / "buffer" / "artifacts" / "keep.txt").write_text("not an op's folder\n")
    assert cli_main(["mlflow", "replay", "--buffer", str(buf), "--tracking-uri", uri]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["refused"] == []
    c = MlflowClient(uri)
    (run,) = c.search_runs([c.get_experiment_by_name(EXPERIMENT).experiment_id])
    assert [a.path for a in c.list_artifacts(run.info.run_id, "reports")] == ["reports/report.txt"]
    assert sorted(p.name for p in (buf / "artifacts").iterdir()) == ["keep.txt"]
