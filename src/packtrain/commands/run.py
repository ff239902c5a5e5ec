"""`packtrain run`: the whole DAG locally through kfp.local (ingest → ... → register) + a summary.

    packtrain run                                  # tiny-cpu recipe, default corpus, embedded MLflow
    packtrain run --set ingest.max_docs=200 --set train.max_steps=5
    packtrain run --no-cache --verbose             # rerun every stage, stream the component logs

Exit codes: 0 done; the failing stage's code otherwise (4: validation failed, the report path is printed).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-cache", action="store_true",
                        help="ignore <workdir>/cache and rerun every stage (outputs are cached again)")
    parser.add_argument("--verbose", "-v", action="store_true", help="stream every component's log")
    parser.add_argument("--json", dest="json_out", metavar="PATH",
                        help="also write the run's stats + summary as JSON to PATH")


def run(cfg, args: argparse.Namespace) -> int:
    from pathlib import Path

    from packtrain.paths import write_json
    from packtrain.pipeline.local import run_local

    result = run_local(cfg, verbose=args.verbose, use_cache=False if args.no_cache else None)
    if args.json_out:
        write_json(Path(args.json_out), result)
    return 0
