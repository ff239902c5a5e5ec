"""`packtrain train [--packs DIR] [--tokens DIR] [--out DIR] [--resume | --overwrite] [--gpus N]`.

`--resume` into an --out that is missing or empty is refused (exit 5, naming the directory): nothing is started
over silently. An --out that already holds checkpoints is refused (exit 2) unless --resume (continue from the newest one that
verifies; broken ones are moved to <out>/checkpoints/quarantine/) or --overwrite (delete them, start at 0;
quarantine/ is kept as it is, and quarantined checkpoints alone are no reason to refuse). An --out that another
run is writing, from any workdir, is refused at once (exit 7, naming that run).
A loss, gradient norm or weights that become non-finite stop the run with exit 8, keeping the last good
checkpoint and saving no model.

`--gpus N` is `--set train.gpus=N`: N > 1 data-parallel ranks on this node, one per GPU, launched through
torchrun by the train stage itself (packtrain.train.launch: the same launch a KFP pod or the Airflow DAG gets);
the command exits with rank 0's code (2 refused, 8 diverged, ...). Only rank 0 opens the MLflow run and writes
the outputs. Without CUDA the N ranks train on the CPU over gloo (for testing the launch path).
"""

from __future__ import annotations

import argparse
import os


class _GpusAction(argparse.Action):
    """`--gpus N` → the override `train.gpus=N`, in command-line order among the `--set`s (a later `--set
    train.gpus=M` wins). N < 1 adds none: `check_gpus` names the flag instead of the field."""

    def __call__(self, parser, namespace, value, option_string=None):
        setattr(namespace, self.dest, value)
        if value >= 1:
            namespace.overrides = [*(getattr(namespace, "overrides", None) or []), f"train.gpus={value}"]


def add_gpus_argument(parser: argparse.ArgumentParser) -> None:
    """`--gpus N` for `packtrain train` and `packtrain run` (after `--set` is defined)."""
    parser.add_argument("--gpus", type=int, default=None, action=_GpusAction, metavar="N",
                        help="data-parallel processes on this node, one per GPU (shorthand for --set train.gpus=N; "
                             "N > 1 launches them through torchrun)")


def check_gpus(args: argparse.Namespace) -> None:
    """`--gpus 0` is refused with the flag's name (exit 2)."""
    from packtrain.errors import ConfigError

    if args.gpus is not None and args.gpus < 1:
        raise ConfigError(f"--gpus {args.gpus}: must be ≥ 1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--packs", metavar="DIR", help="pack stage output holding train/ (default <workdir>/pack)")
    parser.add_argument("--tokens", metavar="DIR",
                        help="tokenize stage output holding tokenizer/ (default <workdir>/tokenize)")
    parser.add_argument("--out", metavar="DIR", help="output dir (default <workdir>/train)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest valid checkpoint in <out>/checkpoints")
    parser.add_argument("--overwrite", action="store_true",
                        help="start from step 0 even though <out>/checkpoints holds checkpoints (deletes them, "
                             "keeps checkpoints/quarantine/); without --resume or --overwrite such a directory is "
                             "refused")
    add_gpus_argument(parser)


def run(cfg, args) -> int:
    from pathlib import Path

    from packtrain.paths import RunPaths
    from packtrain.stages.results import as_dict
    from packtrain.stages.train import refuse_nothing_to_resume, run_train

    check_gpus(args)
    paths = RunPaths(Path(cfg.workdir))
    out = Path(args.out) if args.out else paths.train_dir
    if args.resume:
        refuse_nothing_to_resume(out)
    s = as_dict(run_train(cfg, args.packs or paths.pack_dir, args.tokens or paths.tokenize_dir, out,
                          resume=args.resume, overwrite=args.overwrite))
    if int(os.environ.get("RANK", "0")) == 0:   # a multi-node job's ranks each run this command
        tp = s.get("throughput") or {}
        first = s["loss_curve"][0] if s["loss_curve"] else float("nan")
        print(f"train: {s['steps']} steps ({s['setup']['attention']}, {s['setup']['precision']}, "
              f"{s['setup']['engine']}), loss {first:.4f} → {s['final_loss']:.4f}, {s['tokens']:,} tokens, "
              f"{tp.get('real_tokens_per_s', 0) * s['setup']['world_size']:,.0f} tok/s, "
              f"recompiles {s['recompiles']}, skipped {s['skipped_steps']} → {s['model_dir']}")
    return 0
