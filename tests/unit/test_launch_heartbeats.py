"""After torchrun returns, the launcher removes the ranks' watchdog heartbeats a killed rank left behind — and
nothing else."""

from __future__ import annotations

from packtrain.train.launch import clear_heartbeats


def test_heartbeats_of_killed_ranks_go_and_nothing_else(tmp_path):
    beats = tmp_path / ".guard"
    beats.mkdir()
    for name in ("rank-0.json", "rank-1.json", ".rank-1.json.tmp"):
        (beats / name).write_text("{}")
    clear_heartbeats(tmp_path)
    assert not beats.exists()

    beats.mkdir()
    (beats / "rank-0.json").write_text("{}")
    (beats / "notes.txt").write_text("a user's file")
    clear_heartbeats(tmp_path)
    assert sorted(p.name for p in beats.iterdir()) == ["notes.txt"]
    clear_heartbeats(tmp_path / "missing")   # no output dir, no heartbeats: nothing to do
