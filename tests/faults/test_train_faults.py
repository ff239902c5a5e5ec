"""Train faults, each ending in an exact state: checkpoints are never deleted implicitly, a broken checkpoint is
quarantined byte-identical and resume falls back to the previous one, kill -9 at seeded random points (and at
every checkpoint commit point) resumes to the bit-identical result, a diverged run stops with exit 8 keeping the
last good checkpoint, retention keeps the last K and the best.

Reference: one uninterrupted 20-step run (`straight`, checkpoints every 5). Every other case must end with the
same loss curve and the same final weights, to the last bit.

The runs that are killed (or must be another process: the second `packtrain train` into one --out) are processes of
their own forked from this one (tests/forked.py): a real pid and a real SIGKILL, without a fresh interpreter's
~4-5 CPU-s of imports each (8 of them: ~40 CPU-s of this file's ~60 before).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest
from forked import Forked, run_forked

from packtrain.cli import main

V = 128
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "train.rows=4",
        "train.max_steps=20", "train.warmup_steps=2", "train.checkpoint.every_steps=5",
        "train.checkpoint.keep_last=2", "train.threads=1", "telemetry.interval_s=5", "tracking.enabled=false"]
CKPT_FILES = ["model.safetensors", "optimizer.pt", "rng.pt", "state.json", "manifest.json"]


def _args(data: Path, out: Path, *extra: str, sets: tuple[str, ...] = ()) -> list[str]:
    all_sets = [*TINY, f"workdir={out.parent / 'work'}", *sets]
    return ["train", "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out", str(out),
            *[x for s in all_sets for x in ("--set", s)], *extra]


def _digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _losses(out: Path) -> list[float]:
    return json.loads((out / "train_result.json").read_text())["loss_curve"]


def _weights_equal(a: Path, b: Path) -> bool:
    from safetensors.torch import load_file

    x, y = load_file(a / "model" / "model.safetensors"), load_file(b / "model" / "model.safetensors")
    return x.keys() == y.keys() and all((x[k] == y[k]).all() for k in x)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("fault_data")
    make_synthetic_inputs(root, n_docs=200, vocab_size=V, budget=128, seed=1)
    return root


@pytest.fixture(scope="module")
def straight(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "train"
    assert main(_args(data, out)) == 0
    return out


@pytest.fixture(scope="module")
def forked_seconds(data, straight, tmp_path_factory) -> float:
    """The wall seconds of one whole forked run (tests/forked.py), the span a random kill is drawn from; the run
    itself ends as `straight` did."""
    out = tmp_path_factory.mktemp("forked") / "train"
    t0 = time.perf_counter()
    assert run_forked(_args(data, out), timeout=300) == 0
    seconds = time.perf_counter() - t0
    assert _losses(out) == _losses(straight) and _weights_equal(out, straight)
    return seconds


def _copy(straight: Path, tmp_path: Path) -> Path:
    out = tmp_path / "train"
    shutil.copytree(straight, out)
    return out


# ------------------------------------------------------------------------------------- never deleted implicitly
def test_fresh_train_into_a_run_with_checkpoints_is_refused_and_changes_nothing(data, straight, tmp_path, capsys):
    out = _copy(straight, tmp_path)
    before = _digest(out)
    assert main(_args(data, out)) == 2
    err = capsys.readouterr().err
    assert f"{out / 'checkpoints'} already holds 2 checkpoint(s) (step_000020, step_000015)" in err
    assert "--resume" in err and "--overwrite" in err
    assert _digest(out) == before                         # byte-identical: nothing removed, nothing written


def test_overwrite_is_the_explicit_way_to_start_again(data, straight, tmp_path, capsys):
    out = _copy(straight, tmp_path)
    (out / "checkpoints" / "step_000015" / "marker").write_text("old run")
    assert main(_args(data, out, "--overwrite")) == 0
    assert "--overwrite: removing 2 checkpoint(s)" in capsys.readouterr().err
    assert not (out / "checkpoints" / "step_000015" / "marker").exists()
    assert _losses(out) == _losses(straight) and _weights_equal(out, straight)


def _quarantine(out: Path, *steps: str) -> dict[str, str]:
    """Move checkpoints of `out` to quarantine/ as a failed `--resume` does; returns quarantine/'s digest."""
    from packtrain.train.checkpoint import quarantine_checkpoint

    for step in steps:
        quarantine_checkpoint(out / "checkpoints" / step, "state.json fails its sha256 checksum")
    return _digest(out / "checkpoints" / "quarantine")


def test_refusal_counts_only_the_runs_own_checkpoints_and_says_quarantined_ones_are_kept(data, straight, tmp_path,
                                                                                         capsys):
    out = _copy(straight, tmp_path)
    shutil.copytree(out / "checkpoints" / "step_000015", out / "checkpoints" / "step_000010")
    _quarantine(out, "step_000010")
    before = _digest(out)
    assert main(_args(data, out)) == 2
    err = capsys.readouterr().err
    q = out / "checkpoints" / "quarantine"
    assert "already holds 2 checkpoint(s) (step_000020, step_000015) from an earlier run" in err
    assert f"the 1 quarantined checkpoint(s) in {q} are kept either way" in err
    assert _digest(out) == before


def test_overwrite_keeps_quarantined_checkpoints_byte_identical(data, straight, tmp_path, capsys):
    out = _copy(straight, tmp_path)
    kept = _quarantine(out, "step_000015")
    assert main(_args(data, out, "--overwrite", sets=("train.max_steps=5",))) == 0
    q = out / "checkpoints" / "quarantine"
    assert _digest(q) == kept                                  # the reason file and every byte of the checkpoint
    err = capsys.readouterr().err
    assert f"--overwrite: removing 1 checkpoint(s) under {out / 'checkpoints'}; the 1 quarantined checkpoint(s) " \
           f"in {q} are kept" in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["quarantine", "step_000005"]


def test_quarantined_checkpoints_alone_do_not_refuse_a_fresh_run(data, straight, tmp_path):
    out = _copy(straight, tmp_path)
    kept = _quarantine(out, "step_000015", "step_000020")
    assert main(_args(data, out, sets=("train.max_steps=5",))) == 0
    assert _digest(out / "checkpoints" / "quarantine") == kept
    assert json.loads((out / "train_result.json").read_text())["steps"] == 5


# ------------------------------------------------------------------------------------- one --out, two runs
def _steps_logged(out: Path) -> list[int]:
    log = out / "train_log.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return [json.loads(x)["step"] for x in lines if x.endswith("}")]


def test_two_trains_into_one_out_the_second_stops_naming_the_first(data, tmp_path, capsys):
    """Both started from their own workdir; only --out is shared. The second is refused (exit 7) before it writes
    anything, naming the first, which keeps training undisturbed."""
    out = tmp_path / "shared" / "train"
    first = Forked(_args(data, out, sets=("train.max_steps=100000", f"workdir={tmp_path / 'w1'}",
                                          "train.checkpoint.every_steps=0")))
    try:
        deadline = time.monotonic() + 300
        while not _steps_logged(out) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _steps_logged(out), "the first run did not start training"
        assert main(_args(data, out, sets=(f"workdir={tmp_path / 'w2'}",))) == 7
        err = capsys.readouterr().err
        assert f"output directory {out.resolve()} is in use by pid {first.pid}" in err and "`packtrain train`" in err
        assert first.poll() is None                              # still training
        time.sleep(0.5)
        steps = _steps_logged(out)
        assert steps == list(range(1, len(steps) + 1))           # one run's log: 1, 2, 3, ... never interleaved
        assert not (out / "model").exists()
    finally:
        first.kill()
        first.wait()


# ------------------------------------------------------------------------------------- broken checkpoint files
@pytest.mark.parametrize("damage", ["truncate", "delete"])
@pytest.mark.parametrize("name", CKPT_FILES)
def test_broken_file_in_newest_checkpoint_is_quarantined_and_resume_falls_back(data, straight, tmp_path, name,
                                                                                damage):
    out = _copy(straight, tmp_path)
    newest = out / "checkpoints" / "step_000020"
    f = newest / name
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    else:
        f.unlink()
    broken = _digest(newest)
    with pytest.warns(RuntimeWarning, match="step_000020.*moved to .*quarantine"):
        assert main(_args(data, out, "--resume")) == 0
    q = out / "checkpoints" / "quarantine"
    assert _digest(q / "step_000020") == broken            # kept exactly as found
    reason = (q / "step_000020.reason.txt").read_text()
    assert (name in reason) or ("manifest.json" in reason), reason
    result = json.loads((out / "train_result.json").read_text())
    assert result["setup"]["resumed_from"] == 15
    assert _losses(out) == _losses(straight) and _weights_equal(out, straight)
    ok = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert ok == ["step_000015", "step_000020"]              # step 20 written again, fresh and verified
    from packtrain.train.checkpoint_manifest import verify_checkpoint

    assert verify_checkpoint(out / "checkpoints" / "step_000020") is None


def test_every_checkpoint_broken_keeps_them_all_and_starts_from_zero(data, straight, tmp_path):
    out = _copy(straight, tmp_path)
    for step in ("step_000015", "step_000020"):
        (out / "checkpoints" / step / "state.json").write_text("{")
    with pytest.warns(RuntimeWarning, match="no valid checkpoint.*quarantined checkpoints kept"):
        assert main(_args(data, out, "--resume")) == 0
    q = out / "checkpoints" / "quarantine"
    assert sorted(p.name for p in q.iterdir() if p.is_dir()) == ["step_000015", "step_000020"]
    assert json.loads((out / "train_result.json").read_text())["setup"]["resumed_from"] is None
    assert _losses(out) == _losses(straight)
    assert (out / "train_log.before-resume-0.jsonl").read_text() == (straight / "train_log.jsonl").read_text()


# ------------------------------------------------------------------------------------- kill -9, then --resume
def _kill_after(args: list[str], seconds: float) -> int:
    proc = Forked(args)
    try:
        proc.wait(timeout=seconds)
    except TimeoutError:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode


def _resume_and_compare(data, straight, out: Path) -> None:
    # in-process: the killed run was the forked process. Killed before it wrote anything (during setup), the run left
    # no directory to resume (--resume there is refused as a typo'd --out would be): it is started again instead
    started = out.is_dir() and any(out.iterdir())
    assert main(_args(data, out, *(["--resume"] if started else []))) == 0
    assert _losses(out) == _losses(straight) and _weights_equal(out, straight)
    ck = out / "checkpoints"
    assert not list(ck.glob(".tmp-*")) and not list(ck.glob(".old-*")) and not (out / ".model.tmp").exists()
    assert not (ck / "quarantine").exists()   # a kill never leaves a step_N that fails verification


@pytest.mark.parametrize("point", ["checkpoint.payload", "checkpoint.manifest", "checkpoint.renamed",
                                   "model.saved"])
def test_kill_at_each_commit_point_then_resume_is_exact(data, straight, tmp_path, point):
    out = tmp_path / "train"
    env = {**os.environ, "PACKTRAIN_FAULT": point}
    log = tmp_path / "killed.log"
    assert run_forked(_args(data, out), env, log, timeout=300) == -signal.SIGKILL, log.read_text()[-2000:]
    ck = out / "checkpoints"
    if point == "checkpoint.payload" or point == "checkpoint.manifest":
        assert list(ck.glob(".tmp-step_000005")) and not list(ck.glob("step_*"))   # the first save, half done
    elif point == "checkpoint.renamed":
        assert [p.name for p in ck.glob("step_*")] == ["step_000005"]
    else:
        assert (out / ".model.tmp").is_dir() and not (out / "model").exists()
    _resume_and_compare(data, straight, out)


@pytest.mark.parametrize("seed", [11, 23, 37])
def test_kill_at_a_seeded_random_time_then_resume_is_exact(data, straight, forked_seconds, tmp_path, seed):
    """The kill lands anywhere: during setup, a step, a checkpoint save or the final save (seed in the test id)."""
    delay = random.Random(seed).uniform(0.0, forked_seconds)   # a fork starts with its imports done
    out = tmp_path / "train"
    _kill_after(_args(data, out), delay)
    if (out / "train_result.json").exists():                 # the run finished before the kill: compare it
        assert _losses(out) == _losses(straight)
        return
    _resume_and_compare(data, straight, out)


# ------------------------------------------------------------------------------------- divergence
def test_nan_loss_stops_with_exit_8_and_keeps_the_last_good_checkpoint(data, straight, tmp_path, capsys,
                                                                        monkeypatch):
    out = tmp_path / "train"
    monkeypatch.setenv("PACKTRAIN_FAULT", "train.nan_loss@12")
    assert main(_args(data, out)) == 8
    err = capsys.readouterr().err
    assert "training diverged at step 12: loss nan" in err
    assert f"the last good checkpoint {out / 'checkpoints' / 'step_000010'} is kept" in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000005", "step_000010"]
    assert not (out / "model").exists() and not (out / "train_result.json").exists()
    logged = [json.loads(x)["step"] for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert logged == list(range(1, 12))                       # the NaN step is never logged as a good step
    monkeypatch.delenv("PACKTRAIN_FAULT")
    assert main(_args(data, out, "--resume")) == 0            # continue from step 10: same result as straight
    assert _losses(out) == _losses(straight) and _weights_equal(out, straight)


def test_a_learning_rate_that_blows_up_the_weights_stops_the_run(data, tmp_path, capsys):
    out = tmp_path / "train"
    assert main(_args(data, out, sets=("train.lr=1e30", "train.warmup_steps=0"))) == 8
    err = capsys.readouterr().err
    assert "training diverged at step" in err and "no checkpoint was saved before it" in err
    assert not (out / "model").exists() and not list((out / "checkpoints").glob("step_*"))


# ------------------------------------------------------------------------------------- retention
def test_retention_keeps_the_last_k_and_the_best(tmp_path):
    from packtrain.train import checkpoint as ck
    from packtrain.train.checkpoint_manifest import manifest_loss

    root = tmp_path / "checkpoints"
    losses = {5: 4.1, 10: 3.2, 15: 3.6, 20: 3.5, 25: 3.9}
    for step, loss in losses.items():
        hist = [{"step": s, "loss": loss} for s in range(step - 4, step + 1)]
        ck.save_checkpoint(root, step, {"history": hist}, lambda d: (d / "w.bin").write_bytes(b"x"), keep_last=2,
                           keep_best=True)
    assert sorted(p.name for _, p in ck.list_checkpoints(root)) == ["step_000010", "step_000020", "step_000025"]
    assert manifest_loss(root / "step_000010") == pytest.approx(3.2)
    (root / "quarantine").mkdir()
    (root / "quarantine" / "step_000003").mkdir()
    ck.prune_checkpoints(root, keep_last=1, keep_best=False)
    assert [p.name for _, p in ck.list_checkpoints(root)] == ["step_000025"]
    assert (root / "quarantine" / "step_000003").is_dir()    # never pruned


def test_interval_loss_averages_the_steps_since_the_previous_checkpoint():
    from packtrain.train.checkpoint import interval_loss

    hist = [{"step": 1, "loss": 4.0}, {"step": 2, "loss": 2.0}, {"step": 3, "loss": 1.0}]
    assert interval_loss(hist, 0) == pytest.approx(7 / 3)
    assert interval_loss(hist, 1) == pytest.approx(1.5)
    assert interval_loss([], 0) is None
