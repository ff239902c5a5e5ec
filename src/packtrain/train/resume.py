"""The checkpointing part of a `TrainSession`: where a run starts (`restore`) and each save (`save_checkpoint`).

    Checkpointing        checkpoints/ root, train_log.jsonl, the per-step history, start step, the newest checkpoint
    CheckpointedSession  what `restore` / `save_checkpoint` read of the session (a TrainSession is one)

Nothing is deleted implicitly: `--resume` falls back past checkpoints that fail verification (quarantined by
checkpoint.py), a fresh run into a directory with checkpoints is refused unless `--overwrite`, and a killed
run's train_log.jsonl with steps past the restart point is kept as train_log.before-resume-<step>.jsonl.
Rank 0 decides and touches the files; every rank gets the decision (or the same error) by broadcast.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from packtrain.errors import ConfigError, PacktrainError
from packtrain.train import checkpoint as ckpt
from packtrain.train.distributed import DistInfo, barrier, broadcast_object

if TYPE_CHECKING:
    from packtrain.config import TrainConfig
    from packtrain.train.parts import DataParts, ModelParts

T = TypeVar("T")


@dataclass(slots=True)
class Checkpointing:
    """What checkpoints and train_log.jsonl hold about this run, and where they are."""

    root: Path                          # out_dir/checkpoints
    log_path: Path                      # out_dir/train_log.jsonl: one line per optimizer step
    history: list[dict[str, Any]] = field(default_factory=list)   # the same records (saved in each checkpoint)
    start_step: int = 0                 # 0, or the step of the checkpoint this run resumed from
    resumed_from: int | None = None
    last: Path | None = None            # the newest checkpoint this run saved or resumed from

    @classmethod
    def under(cls, out_dir: Path) -> Checkpointing:
        return cls(out_dir / "checkpoints", out_dir / "train_log.jsonl")


class CheckpointedSession(Protocol):
    """The parts of a TrainSession (packtrain.train.session) that restoring and saving a checkpoint use."""

    checkpoints: Checkpointing
    cfg: TrainConfig
    dist: DistInfo
    data: DataParts
    parts: ModelParts
    timings: dict[str, float]

    def check_finite_weights(self, step: int) -> None: ...


def restore(s: CheckpointedSession, resume: bool, overwrite: bool = False) -> int:
    """Where this run starts; returns the first step. Nothing is deleted implicitly:

    - resume: the newest checkpoint that verifies (broken newer ones are quarantined and named); no
      checkpoint at all → step 0;
    - fresh (no resume) into a directory that holds checkpoints: refused (ConfigError, exit 2) unless
      `overwrite`, which removes them (not quarantine/: it stays byte-identical) and keeps train_log.jsonl as
      train_log.before-resume-0.jsonl, saying so; quarantined checkpoints alone are no reason to refuse.
    """
    c = s.checkpoints
    if resume:
        return _resume(s)

    def decide() -> None:
        found = ckpt.existing_run(c.root)
        if found and not overwrite:
            raise ConfigError(ckpt.existing_run_message(c.root, found))
        if found:
            q = ckpt.quarantined(c.root)
            kept = f"; the {len(q)} quarantined checkpoint(s) in {c.root / ckpt.QUARANTINE} are kept" if q else ""
            print(f"--overwrite: removing {len(found)} checkpoint(s) under {c.root}{kept}", file=sys.stderr)
            ckpt.remove_run(c.root)
        keep_old_log(c.log_path, 0)   # a log without checkpoints (killed before the first save) is kept, renamed

    on_main(s.dist, c.root, decide)
    return 0


def on_main(dist: DistInfo, root: Path, fn: Callable[[], T]) -> T:
    """Run `fn` on rank 0 and hand its result — or its PacktrainError/OSError, as the same PacktrainError —
    to every rank, so no rank is left waiting in a collective while rank 0 has failed."""
    out, err = None, None
    if dist.is_main:
        try:
            out = fn()
        except PacktrainError as e:
            err = (type(e).__name__, str(e), e.exit_code)
        except OSError as e:
            err = ("PacktrainError", f"checkpoints under {root}: {e}", 1)
    out, err = broadcast_object((out, err), dist)
    if err:
        name, msg, code = err
        cls = {"ConfigError": ConfigError}.get(name, PacktrainError)
        raise cls(msg, exit_code=code)
    return out   # rank 0's fn() result, broadcast


def _resume(s: CheckpointedSession) -> int:
    c, m = s.checkpoints, s.parts
    path = on_main(s.dist, c.root, lambda: ckpt.find_latest_checkpoint(c.root, quarantine=True))
    if path is None:
        kept = c.root / ckpt.QUARANTINE
        note = f" (quarantined checkpoints kept in {kept})" if kept.is_dir() else ""
        warnings.warn(f"--resume: no valid checkpoint under {c.root}{note}; starting from step 0",
                      RuntimeWarning, stacklevel=4)
        if s.dist.is_main:
            keep_old_log(c.log_path, 0)
        barrier(s.dist)
        return 0
    m.stepper.load(path)
    state = ckpt.read_state(path)
    m.scheduler.load_state_dict(state["scheduler"])
    m.stepper.load_scaler_state(state.get("scaler"))
    s.data.loader.load_state_dict(state["loader"])
    c.history = list(state["history"])
    c.start_step = c.resumed_from = int(state["step"])
    c.last = path
    if s.dist.is_main:   # the log may hold steps past the checkpoint from the killed run
        keep_old_log(c.log_path, c.start_step)
        c.log_path.write_text("".join(json.dumps(h) + "\n" for h in c.history))
    print(f"resumed from {path} (step {c.start_step})", file=sys.stderr)
    return c.start_step


def keep_old_log(log_path: Path, step: int) -> None:
    """The killed run's train_log.jsonl, when it holds steps past `step`, is kept as
    train_log.before-resume-<step>[-k].jsonl (the resumed run recomputes those steps)."""
    if not log_path.exists() or log_path.stat().st_size == 0:
        return
    dst, k = log_path.with_name(f"train_log.before-resume-{step}.jsonl"), 1
    while dst.exists():
        k += 1
        dst = log_path.with_name(f"train_log.before-resume-{step}-{k}.jsonl")
    log_path.rename(dst)


def save_checkpoint(s: CheckpointedSession, step: int) -> None:
    """Checkpoint `step` (atomic, verified on resume) after checking the weights are finite, so the newest
    checkpoint is always one training can continue from; then the retention policy (checkpoint.py)."""
    t0 = time.perf_counter()
    c, m, cfg = s.checkpoints, s.parts, s.cfg.checkpoint
    s.check_finite_weights(step)
    tmp = ckpt.begin_checkpoint(c.root, step) if s.dist.is_main else None
    barrier(s.dist)
    tmp = tmp or c.root / f".tmp-{ckpt.step_dir_name(step)}"
    try:
        if s.cfg.engine in ("deepspeed", "fsdp2") or s.dist.is_main:   # every rank writes its DeepSpeed/DCP shard
            m.stepper.save(tmp)
        barrier(s.dist)
        if s.dist.is_main:
            state = {"scheduler": m.scheduler.state_dict(), "scaler": m.stepper.scaler_state(),
                     "loader": s.data.loader_state(), "history": c.history}
            prev = int(c.last.name.split("_")[1]) if c.last else 0
            keep_best = cfg.keep_best or s.cfg.eval_every_steps > 0   # the lowest-eval_loss one gets exported
            c.last = ckpt.commit_checkpoint(c.root, tmp, step, state, cfg.keep_last, keep_best, after_step=prev)
    except Exception as e:   # a full disk: one clear error, the earlier checkpoints untouched
        if not ckpt.is_disk_full(e, c.root):
            raise
        raise ckpt.disk_full_error(c.root, tmp, step, e) from None
    barrier(s.dist)
    s.timings["checkpoint_s"] += time.perf_counter() - t0
