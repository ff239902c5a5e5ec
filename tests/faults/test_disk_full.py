"""A full disk while checkpointing: one clear `error:` line (what was being written, where, how much was free),
exit 9, the MLflow run FAILED, the tracking buffer intact, the earlier checkpoints intact and `--resume` continuing
from the newest one once there is room. A real small file system that fills up (a 3 MiB tmpfs mounted here, which
needs root: skipped otherwise) holding the output directory and the workdir (its sqlite store and buffer) alike —
no mock of torch.save. Before: ~590 lines of traceback ending in the buffer's `OSError: [Errno 28]`, no `error:`
line, the run RUNNING. Both trainings are processes of their own, forked from this one (tests/forked.py: a fresh
interpreter's imports were ~5 CPU-s of each)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from forked import run_forked

TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "train.rows=4",
        "train.max_steps=20", "train.warmup_steps=2", "train.checkpoint.every_steps=1",
        "train.checkpoint.keep_last=100", "train.threads=1", "telemetry.interval_s=5",
        "tracking.system_metrics=false", "tracking.experiment=disk"]


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_while_checkpointing_is_one_clear_error(small_disk, tmp_path, seed_mlflow_store):
    from mlflow import MlflowClient

    from packtrain.testing.synthetic_inputs import make_synthetic_inputs
    from packtrain.train.checkpoint import list_checkpoints
    from packtrain.train.checkpoint_manifest import verify_checkpoint

    data = tmp_path / "data"
    make_synthetic_inputs(data, n_docs=200, vocab_size=128, budget=128, seed=1)
    work = small_disk / "work"
    # the workdir's store on the small disk, empty (the size a fresh one has: its creation is not the subject)
    seed_mlflow_store(work / "mlflow.db")
    args = ["train", "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out", str(work / "train"),
            *[x for s in [*TINY, f"workdir={work}"] for x in ("--set", s)]]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    log = tmp_path / "full.log"   # the run's stdout and stderr (nothing in it on the small disk)
    code = run_forked(args, env, log, timeout=600)
    stderr = log.read_text()
    assert code == 9, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    ckpts = work / "train" / "checkpoints"
    assert "no space left on the device while writing checkpoint step" in errors[0]
    assert f"to {ckpts}/.tmp-step_" in errors[0] and " free of 3.0 MiB on that file system" in errors[0]
    kept = list_checkpoints(ckpts)
    assert kept and f"newest: {kept[0][1].name}" in errors[0]
    assert all(verify_checkpoint(p) is None for _, p in kept)   # every earlier checkpoint verifies
    assert not list(ckpts.glob(".tmp-*"))                         # the incomplete write is gone
    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("disk").experiment_id])
    assert [x.info.status for x in runs] == ["FAILED"]
    for f in (work / "mlflow-buffer").glob("*.jsonl"):           # the buffer, if any, holds whole ops only
        assert all(json.loads(line) for line in f.read_text().splitlines())
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    log2 = tmp_path / "resume.log"
    assert run_forked([*args, "--resume"], env, log2, timeout=600) == 0, log2.read_text()[-3000:]
    res = json.loads((work / "train" / "train_result.json").read_text())
    assert res["steps"] == 20 and res["setup"]["resumed_from"] == kept[0][0], res["setup"]
