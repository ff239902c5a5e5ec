"""Data-parallel training on one node: `train.gpus` ranks through torchrun, launched the same way from every
adapter, because the launch happens inside the train stage runner itself:

    packtrain train --gpus 2            (CLI: --gpus N is --set train.gpus=N)      ─┐
    components/train.py → run_stage_component("train", ...)    (a KFP pod)         ─┼─► run_train(cfg, ...)
    packtrain run / Airflow run_pipeline → run_dag → run_stage (in process)        ─┘      │
                                                                                           ▼
    train.gpus > 1 and not already a rank: launch_ranks(cfg, packs, tokens, out)
      python -m torch.distributed.run --standalone --nproc_per_node N \\
             -m packtrain.stages.train --config <tmp>/run.yaml --packs P --tokens T --out O [--resume] [--overwrite]
      → N processes, each back in run_train with RANK set: DDP (NCCL on CUDA, gloo on the CPU) or DeepSpeed
        (deepspeed.initialize reads torchrun's RANK/WORLD_SIZE/MASTER_ADDR)

Rank 0 alone opens the MLflow run and writes out_dir; `launch_ranks` returns the TrainResult rank 0 wrote
(out_dir/train_result.json), so the caller cannot tell one process from N. A PacktrainError on rank 0 is written
as an error record (packtrain.error_record.write_error_record) to PACKTRAIN_ERROR_FILE, here a file of the launcher's
temp dir, and raised again in the launching process with the same message and exit code (2 refused, 8 diverged,
...) instead of torchrun's generic 1. A multi-node job
(packtrain.pipeline.multinode) starts its ranks with an outer torchrun: RANK is set, nothing is relaunched.

    >>> torchrun_command(2, Path("/t/run.yaml"), Path("p"), Path("t"), Path("o"), resume=True)[3:9]
    ['--standalone', '--nproc_per_node=2', '-m', 'packtrain.stages.train', '--config', '/t/run.yaml']
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path

from packtrain.error_record import ERROR_FILE_ENV, read_error_record, write_error_record
from packtrain.errors import ConfigError, PacktrainError

LAUNCHED = "PACKTRAIN_LAUNCHED"
"""Set (to N) for the ranks `launch_ranks` starts, so they train instead of launching again."""
EXIT_FILE_ENV = ERROR_FILE_ENV
"""Where rank 0 writes its PacktrainError for the launching process (a file in the launcher's temp dir): the one
error-record channel of packtrain.errors, pointed at that file for the ranks."""


def is_rank() -> bool:
    """True inside a distributed launch (torchrun sets RANK; our own launch also sets PACKTRAIN_LAUNCHED)."""
    return "RANK" in os.environ or LAUNCHED in os.environ


def needs_launch(gpus: int) -> bool:
    """More than one rank asked for, and this process is not one yet."""
    return gpus > 1 and not is_rank()


def check_devices(gpus: int, device: str) -> None:
    """Refuse before N processes start: torchrun with more ranks than CUDA devices would crash every rank on
    set_device. Without CUDA (or train.device=cpu) the ranks run on the CPU over gloo, any number of them."""
    import torch

    n_dev = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device != "cpu" and 0 < n_dev < gpus:
        raise ConfigError(f"train.gpus={gpus}: this machine has {n_dev} CUDA device(s); use train.gpus ≤ {n_dev} "
                          f"(--gpus {n_dev}), or CUDA_VISIBLE_DEVICES to pick them")


def torchrun_command(gpus: int, config: Path, packs_dir: Path, tokens_dir: Path, out_dir: Path, *,
                     resume: bool = False, overwrite: bool = False) -> list[str]:
    """The command line of one node's N ranks, each running packtrain.stages.train's `main` (this interpreter:
    the same venv)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
           "-m", "packtrain.stages.train", "--config", str(config), "--packs", str(packs_dir),
           "--tokens", str(tokens_dir), "--out", str(out_dir)]
    return cmd + ["--resume"] * resume + ["--overwrite"] * overwrite


def launch_ranks(cfg, packs_dir: Path, tokens_dir: Path, out_dir: Path, *, resume: bool = False,
                 overwrite: bool = False):
    """Run the train stage as cfg.train.gpus ranks on this node; returns rank 0's TrainResult (read back from
    out_dir/train_result.json).
    Raises rank 0's PacktrainError (same message and exit code) when it failed."""
    import subprocess
    import tempfile

    gpus = cfg.train.gpus
    check_devices(gpus, cfg.train.device)
    # 0700 temp dir: the config is the run's whole recipe; the exit file is read once, then the dir goes
    with tempfile.TemporaryDirectory(prefix="packtrain-launch-") as d:
        config, exit_file = Path(d) / "run.yaml", Path(d) / "exit.json"
        cfg.to_yaml(config)
        cmd = torchrun_command(gpus, config, Path(packs_dir), Path(tokens_dir), Path(out_dir), resume=resume,
                               overwrite=overwrite)
        rc = subprocess.call(cmd, env={**os.environ, LAUNCHED: str(gpus), EXIT_FILE_ENV: str(exit_file)})
        clear_heartbeats(Path(out_dir))
        if rc:
            raise rank_error(exit_file, rc, gpus)
    from packtrain.stages.results import TrainResult

    return TrainResult.from_dir(out_dir)   # what rank 0's run_train returned, as it wrote it


def clear_heartbeats(out_dir: Path) -> None:
    """Remove the ranks' watchdog heartbeats (<out>/.guard/rank-N.json) once every rank has exited: a rank that
    torchrun killed (the other one hung) never ran its watchdog's stop(). Only those files and then the folder, if
    that left it empty; anything else in it stays."""
    beats = out_dir / ".guard"
    if not beats.is_dir() or beats.is_symlink():
        return
    for f in beats.iterdir():
        if re.fullmatch(r"\.?rank-\d+\.json(\.tmp)?", f.name) and f.is_file() and not f.is_symlink():
            with contextlib.suppress(OSError):
                f.unlink()
    with contextlib.suppress(OSError):
        beats.rmdir()


def rank_error(exit_file: Path, rc: int, gpus: int) -> PacktrainError:
    """Rank 0's PacktrainError rebuilt from the exit file (its class when packtrain.errors has it, else a
    PacktrainError with its exit code); without one, torchrun's code names a crash whose traceback is above."""
    rec = read_error_record(exit_file)
    if rec is None:
        return PacktrainError(f"train: one of the {gpus} ranks crashed (torchrun exited {rc}; the rank's traceback "
                              "is in the log above)", exit_code=rc if 0 < rc < 128 else 1)
    return rec[0]


def record_error(err: PacktrainError) -> None:
    """Rank 0 only: the error for the launching process (its message redacted: it may quote a URI)."""
    if os.environ.get("RANK", "0") != "0":
        return
    write_error_record(os.environ.get(EXIT_FILE_ENV), err, "train")
