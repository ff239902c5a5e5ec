"""`packtrain compare RUN... | --experiment NAME [--stage-runs] [--filter EXPR] [--max-runs N] [--rules FILE]
[--out DIR] [--no-log]`.

RUN: what `packtrain run` prints — a pipeline run id, its ≥6-character prefix, or NAME@ALIAS (the run behind
a registered model version); the first RUN is the gate's baseline. Each is walked to its train stage run.
Prints the runs, the params that differ (by stage), the headline numbers and the gate verdict; writes
DIR/compare.html (curves of loss, tokens/s, MFU, utilization, memory; self-contained), compare.json and
compare.md (default DIR: <workdir>/compare), and logs them as artifacts of a new MLflow run named "compare"
(unless --no-log). `--experiment NAME` compares its newest pipeline runs (with --stage-runs: stage runs).
A RUN given as NAME@ALIAS (or models:/NAME/VERSION) also prints that version's promotion verdict (its
`validation_reason` tag: the suites, each Δ with its CI; docs/validation.md).
Exit 0 whatever the gate says (`packtrain gate` is the command that fails CI); 2 for a run that is not there.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="pipeline run ids, ≥6-char prefixes or NAME@ALIAS; the first is the baseline")
    parser.add_argument("--experiment", metavar="NAME", help="compare the pipeline runs of this experiment instead")
    parser.add_argument("--stage-runs", action="store_true",
                        help="with --experiment: compare its stage runs (tag packtrain.kind=stage), not pipeline runs")
    parser.add_argument("--filter", metavar="EXPR",
                        help="MLflow search filter, e.g. \"params.`train.lr` = '0.001'\" (with --experiment)")
    parser.add_argument("--max-runs", type=int, default=20, metavar="N", help="at most N runs (the newest)")
    parser.add_argument("--rules", metavar="FILE", help="gate rules (YAML/JSON); default: the built-in rules")
    parser.add_argument("--out", metavar="DIR", help="report directory (default <workdir>/compare)")
    parser.add_argument("--no-log", action="store_true", help="do not log the report to MLflow")


def run(cfg, args) -> int:
    from pathlib import Path

    from packtrain.errors import ConfigError
    from packtrain.gate import load_rules
    from packtrain.gate.compare import compare_runs, log_report
    from packtrain.gate.report import format_table, write_report
    from packtrain.tracking import resolve_tracking_uri

    if bool(args.runs) == bool(args.experiment):
        raise ConfigError("compare: give run ids or --experiment NAME (not both, not neither)")
    if (args.filter or args.stage_runs) and not args.experiment:
        raise ConfigError(f"{'--filter' if args.filter else '--stage-runs'} needs --experiment NAME")
    if args.max_runs < 1:
        raise ConfigError(f"--max-runs {args.max_runs}: must be ≥ 1")
    rules = load_rules(args.rules)
    uri = resolve_tracking_uri(cfg)
    comp = compare_runs(args.runs or None, args.experiment, args.filter, uri, args.max_runs,
                        stage_runs=args.stage_runs, rules=rules)
    out = Path(args.out) if args.out else Path(cfg.workdir) / "compare"
    paths = write_report(comp, out)
    print(format_table(comp))
    for line in validation_lines(uri, args.runs or []):
        print(line)
    print(f"→ {paths['html']}")
    if not args.no_log:
        run_id = log_report(comp, paths, uri, args.experiment)
        print(f"logged to MLflow run {run_id} (compare/compare.html)")
    return 0


def validation_lines(uri: str, refs: list[str]) -> list[str]:
    """'lm@champion (v4): promote — promoted over v3: recent ...' for each model reference among `refs`."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from packtrain.gate.metric_sources import _model_version

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    out = []
    for ref in refs:
        try:
            mv = _model_version(client, ref)
        except MlflowException:
            continue
        if mv is not None and (mv.tags or {}).get("validation"):
            out.append(f"{ref} (v{mv.version}): {mv.tags['validation']} — {mv.tags.get('validation_reason', '')}")
    return out
