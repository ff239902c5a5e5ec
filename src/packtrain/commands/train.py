"""`packtrain train [--packs DIR] [--tokens DIR] [--out DIR] [--resume | --overwrite] [--gpus N]`.

An --out that already holds checkpoints is refused (exit 2) unless --resume (continue from the newest one that
verifies; broken ones are moved to <out>/checkpoints/quarantine/) or --overwrite (delete them, start at 0).
A loss, gradient norm or weights that become non-finite stop the run with exit 8, keeping the last good
checkpoint and saving no model.

`--gpus N` (N > 1) re-executes this command through torchrun (`python -m torch.distributed.run --standalone
--nproc_per_node N`), one process per GPU; the DeepSpeed engine uses the same launcher (deepspeed.initialize
reads torchrun's RANK/WORLD_SIZE/MASTER_ADDR). Only rank 0 opens the MLflow run and writes the outputs.
Without CUDA the N processes train on the CPU over gloo (for testing the launch path).
"""

from __future__ import annotations

import argparse
import os
import sys

LAUNCHED = "PACKTRAIN_LAUNCHED"
"""Set for the processes torchrun starts, so they train instead of launching again."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--packs", metavar="DIR", help="pack stage output holding train/ (default <workdir>/pack)")
    parser.add_argument("--tokens", metavar="DIR",
                        help="tokenize stage output holding tokenizer/ (default <workdir>/tokenize)")
    parser.add_argument("--out", metavar="DIR", help="output dir (default <workdir>/train)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest valid checkpoint in <out>/checkpoints")
    parser.add_argument("--overwrite", action="store_true",
                        help="start from step 0 even though <out>/checkpoints holds checkpoints (deletes them); "
                             "without --resume or --overwrite such a directory is refused")
    parser.add_argument("--gpus", type=int, default=1, metavar="N",
                        help="data-parallel processes (one per GPU) launched through torchrun (default 1)")


def launcher_command(args: argparse.Namespace) -> list[str]:
    """The torchrun command line that runs this same command once per GPU (without --gpus)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.gpus}",
           "-m", "packtrain.cli", "train", "--recipe", str(args.recipe)]
    for o in args.overrides:
        cmd += ["--set", o]
    for flag in ("packs", "tokens", "out"):
        if getattr(args, flag):
            cmd += [f"--{flag}", str(getattr(args, flag))]
    if args.resume:
        cmd.append("--resume")
    if getattr(args, "overwrite", False):
        cmd.append("--overwrite")
    return cmd


def run(cfg, args) -> int:
    from pathlib import Path

    from packtrain.errors import ConfigError
    from packtrain.paths import RunPaths

    if args.gpus < 1:
        raise ConfigError(f"--gpus {args.gpus}: must be ≥ 1")
    if args.gpus > 1 and LAUNCHED not in os.environ:
        import subprocess

        import torch

        n_dev = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if cfg.train.device != "cpu" and 0 < n_dev < args.gpus:
            raise ConfigError(f"--gpus {args.gpus}: this machine has {n_dev} CUDA device(s); use --gpus ≤ {n_dev} "
                              "(or CUDA_VISIBLE_DEVICES to pick them)")

        import tempfile

        from packtrain.cli import EXIT_FILE_ENV
        from packtrain.stages.train import refuse_existing_run

        paths = RunPaths(Path(cfg.workdir))
        refuse_existing_run(Path(args.out) if args.out else paths.train_dir, args.resume,
                            getattr(args, "overwrite", False))   # before N processes start, with its exit code 2
        with tempfile.TemporaryDirectory(prefix="packtrain-exit-") as d:
            exit_file = Path(d) / "code"
            rc = subprocess.call(launcher_command(args), env={**os.environ, LAUNCHED: str(args.gpus),
                                                              EXIT_FILE_ENV: str(exit_file)})
            # rank 0's own exit code (2 refused, 8 diverged, ...) instead of torchrun's generic 1
            return int(exit_file.read_text()) if rc and exit_file.is_file() else rc
    from packtrain.stages.train import run_train

    paths = RunPaths(Path(cfg.workdir))
    out = Path(args.out) if args.out else paths.train_dir
    s = run_train(cfg, args.packs or paths.pack_dir, args.tokens or paths.tokenize_dir, out, resume=args.resume,
                  overwrite=args.overwrite)
    if int(os.environ.get("RANK", "0")) == 0:
        tp = s.get("throughput") or {}
        first = s["loss_curve"][0] if s["loss_curve"] else float("nan")
        print(f"train: {s['steps']} steps ({s['setup']['attention']}, {s['setup']['precision']}, "
              f"{s['setup']['engine']}), loss {first:.4f} → {s['final_loss']:.4f}, {s['tokens']:,} tokens, "
              f"{tp.get('real_tokens_per_s', 0) * s['setup']['world_size']:,.0f} tok/s, "
              f"recompiles {s['recompiles']}, skipped {s['skipped_steps']} → {s['model_dir']}")
    return 0
