"""`packtrain run`: the whole DAG locally through kfp.local (ingest → ... → register) + a summary.

    packtrain run                                  # tiny-cpu recipe, default corpus, embedded MLflow
    packtrain run --set ingest.max_docs=200 --set train.max_steps=5
    packtrain run --no-cache --verbose             # rerun every stage, stream the component logs
    packtrain run --progress 30                    # a progress line of a long stage every 30 s (default 10)

Ends with the summary, where to look in MLflow, the pipeline run id (`run id  3f2a9c0e (pipeline run
3f2a9c0e…)`) and the `packtrain compare ...` / `packtrain gate ...` lines to type next.

Exit codes: 0 done; the failing stage's code otherwise (4: validation failed, the report path is printed).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-cache", action="store_true",
                        help="ignore <workdir>/cache and rerun every stage (outputs are cached again)")
    parser.add_argument("--verbose", "-v", action="store_true", help="stream every component's log")
    parser.add_argument("--progress", type=float, default=None, metavar="S",
                        help="print a progress line of a long stage (step, loss, tok/s, ETA) every S seconds "
                             "(default 10; 0: every update; ignored with --verbose)")
    parser.add_argument("--json", dest="json_out", metavar="PATH",
                        help="also write the run's stats + summary as JSON to PATH")
    from packtrain.commands.train import add_gpus_argument

    add_gpus_argument(parser)   # --gpus N = --set train.gpus=N: the train stage launches N ranks


def run(cfg, args: argparse.Namespace) -> int:
    from pathlib import Path

    from packtrain.commands.train import check_gpus
    from packtrain.errors import ConfigError
    from packtrain.pipeline.local import PROGRESS_S, run_local
    from packtrain.publish import write_json

    check_gpus(args)
    if args.progress is not None and not args.progress >= 0:
        raise ConfigError(f"--progress {args.progress}: must be a number of seconds ≥ 0")
    result = run_local(cfg, verbose=args.verbose, use_cache=False if args.no_cache else None,
                       progress_s=PROGRESS_S if args.progress is None else args.progress)
    if args.json_out:
        write_json(Path(args.json_out), result)
    return 0
