"""`packtrain <command>`: one subcommand per stage plus run/pipeline/gate/compare/plan/mlflow.

Each command lives in `packtrain.commands.<name>` with two functions:
`add_arguments(parser)` (cheap, no heavy imports) and `run(cfg, args) -> int` (imports what it needs); the command
modules import nothing heavy at module level, so importing all of them here keeps `packtrain --help` fast.
Every command takes `--recipe NAME|PATH` (default tiny-cpu) and repeated `--set dotted.key=value`.
Bad input ends with `error: <message>` on stderr and a non-zero exit code, never a traceback. Commands that
write into the workdir hold its lock (exit 7 when another run holds it; packtrain.pipeline.lock).
"""

from __future__ import annotations

import argparse
import os
import sys
from types import ModuleType

from packtrain.commands import (
    compare,
    evaluate,
    gate,
    ingest,
    pack,
    pipeline,
    plan,
    register,
    run,
    tokenize,
    train,
    validate,
)
from packtrain.commands import mlflow as mlflow_command
from packtrain.process_exit import freeze_heap_at_exit
from packtrain.stages.table import STAGE_NAMES, STAGES

STAGE_COMMANDS: dict[str, ModuleType] = {"ingest": ingest, "validate": validate, "tokenize": tokenize,
                                         "pack": pack, "train": train, "evaluate": evaluate, "register": register}
assert tuple(STAGE_COMMANDS) == STAGE_NAMES, "one command per stage of the stage table, in its order"
COMMANDS: dict[str, tuple[ModuleType, str]] = {
    **{s.name: (STAGE_COMMANDS[s.name], s.help) for s in STAGES},   # one subcommand per stage, in DAG order
    "run": (run, "the whole DAG on this machine on the recipe (in process, or --runner kfp: through kfp.local)"),
    "pipeline": (pipeline, "compile or submit the Kubeflow pipeline"),
    "gate": (gate, "fail when a candidate run regresses against a baseline"),
    "compare": (compare, "side-by-side table and HTML report of MLflow runs"),
    "plan": (plan, "predict the peak GPU memory of a training step and choose rows per micro-batch"),
    "mlflow": (mlflow_command, "MLflow helpers: replay buffered ops, resolve a run reference"),
}
"""Subcommand → (its module in packtrain.commands, its one-line help)."""


LOCKED = (*STAGE_NAMES, "run")
"""Commands that write into the workdir: they hold its lock (packtrain.pipeline.lock) while they run (`packtrain
mlflow replay` locks the buffer it replays instead, wherever it lies: packtrain.pipeline.lock.buffer_lock). Not the
ranks of a distributed launch (RANK set by torchrun): `--gpus N` holds the lock for its ranks (packtrain.train.launch
starts them), and a multi-node job's ranks are one run, scheduled as one by the cluster."""


def build_parser() -> argparse.ArgumentParser:
    from packtrain import __version__

    parser = argparse.ArgumentParser(
        prog="packtrain",
        description="LM training pipeline built for full GPU utilization.",
    )
    parser.add_argument("--version", action="version", version=f"packtrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (command, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--recipe", default="tiny-cpu", help="recipe name in recipes/ or a YAML path")
        p.add_argument(
            "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
            help="override a config value, e.g. --set pack.budget=4096 (repeatable)",
        )
        command.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv`, load the recipe, run the command (under the workdir lock for LOCKED ones); the exit code.
    `packtrain run` reaches a stage's own code in 5 calls: main → commands.run.run → pipeline.local.run_local →
    pipeline.dag.run_dag → pipeline.runtime.run_stage → stages.<stage>.run_<stage> (run_local's docstring and
    docs/architecture.md draw them; tests/unit/test_run_path.py checks them)."""
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # MKL's conditional numerical reproducibility: without it a CPU matmul's result may depend on how its buffers
    # happen to be aligned, so an unchanged rerun could differ in the last bits (read when MKL first runs)
    os.environ.setdefault("MKL_CBWR", "AUTO")
    # MLflow prints "View run NAME at: <store URI>/#/..." with the URI as given, credentials included
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # registered here, not under `__main__`: the console script calls main()
    freeze_heap_at_exit()
    from packtrain.errors import PacktrainError
    from packtrain.log_noise import plain_own_warnings, silence_known_noise

    silence_known_noise()   # torchao's CPU-build and lm-eval's expected warnings (packtrain.log_noise)
    plain_own_warnings()    # `warning: <message>` for packtrain's own, not <file>:<line> and the source line
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    from packtrain.registry import install_handlers

    install_handlers()   # any tracked command may replay a buffered registration (packtrain.tracking.store_ops)
    command = COMMANDS[args.command][0]
    try:
        from packtrain.config import load_run_config

        cfg = load_run_config(args.recipe, args.overrides)
        if args.command not in LOCKED or "RANK" in os.environ:
            return int(command.run(cfg, args) or 0)
        from packtrain.pipeline.lock import workdir_lock

        with workdir_lock(cfg.workdir, args.command):
            return int(command.run(cfg, args) or 0)
    except PacktrainError as e:
        from packtrain.secrets import redact_text

        print(f"error: {redact_text(str(e))}", file=sys.stderr)   # messages may quote a URI with credentials
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())   # main() freezes the heap at exit (see there)
