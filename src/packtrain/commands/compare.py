"""`packtrain compare RUN... | --experiment NAME [--filter EXPR] [--max-runs N] [--out DIR] [--no-log]`.

Prints the side-by-side table (params that differ, key metrics), writes DIR/compare.html (self-contained,
curves + bar charts), compare.json and compare.md (default DIR: <workdir>/compare), and logs them as
artifacts of a new MLflow run named "compare" (unless --no-log).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="*", metavar="RUN", help="MLflow run ids")
    parser.add_argument("--experiment", metavar="NAME", help="compare the runs of this experiment instead")
    parser.add_argument("--filter", metavar="EXPR",
                        help="MLflow search filter, e.g. \"attributes.run_name = 'train'\" (with --experiment)")
    parser.add_argument("--max-runs", type=int, default=20, metavar="N", help="at most N runs (newest first)")
    parser.add_argument("--out", metavar="DIR", help="report directory (default <workdir>/compare)")
    parser.add_argument("--no-log", action="store_true", help="do not log the report to MLflow")


def run(cfg, args) -> int:
    from pathlib import Path

    from packtrain.errors import ConfigError
    from packtrain.gate.compare import compare_runs, log_report, write_report
    from packtrain.tracking import resolve_tracking_uri

    if bool(args.runs) == bool(args.experiment):
        raise ConfigError("compare: give run ids or --experiment NAME (not both, not neither)")
    if args.filter and not args.experiment:
        raise ConfigError("--filter needs --experiment NAME")
    if args.max_runs < 1:
        raise ConfigError(f"--max-runs {args.max_runs}: must be ≥ 1")
    uri = resolve_tracking_uri(cfg)
    comp = compare_runs(args.runs or None, args.experiment, args.filter, uri, args.max_runs)
    out = Path(args.out) if args.out else Path(cfg.workdir) / "compare"
    paths = write_report(comp, out)
    print(comp.table())
    print(f"→ {paths['html']}")
    if not args.no_log:
        run_id = log_report(comp, paths, uri, args.experiment)
        print(f"logged to MLflow run {run_id} (compare/compare.html)")
    return 0
