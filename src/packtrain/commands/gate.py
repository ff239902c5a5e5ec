"""`packtrain gate --candidate RUN|FILE [--candidate ...] --baseline RUN|MODEL@ALIAS|FILE [--rules FILE]
[--out DIR]`: compare a candidate with a baseline and fail on regressions.

RUN is a run id (full, a ≥ 6-character prefix, runs:/ID) of any run of a `packtrain run` tree — the
pipeline run id it prints, or a stage run — read as that tree's train stage (+ pack, evaluate) under the
canonical names of docs/metrics.md; MODEL@ALIAS (packtrain-lm@champion, models:/NAME/VERSION) is the
training run that produced the version. Prints the table (metric, baseline, candidate, change, rule,
verdict), writes DIR/gate.json and DIR/gate.md (default DIR: <workdir>/gate). Exit 0 pass, 1 regression,
2 missing data (the message names the missing metric or run). Several --candidate runs are repeats: per
metric the median of their values. MLflow is only touched for runs and models (tracking URI:
MLFLOW_TRACKING_URI, tracking.tracking_uri, else sqlite:///<workdir>/mlflow.db).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--candidate", action="append", required=True, metavar="RUN|FILE",
                        help="run id (or ≥6-char prefix) of a `packtrain run`, or a metrics JSON (repeat for "
                             "repeats: median per metric)")
    parser.add_argument("--baseline", required=True, metavar="RUN|MODEL@ALIAS|FILE",
                        help="NAME@ALIAS (the training run of that model version, e.g. packtrain-lm@champion), "
                             "models:/NAME/VERSION, a run id, or a committed metrics JSON")
    parser.add_argument("--rules", metavar="FILE", help="per-metric rules (YAML/JSON); default: the built-in "
                        "noise-aware rules of the runs' device kind (docs/gate.md)")
    parser.add_argument("--out", metavar="DIR", help="where gate.json and gate.md go (default <workdir>/gate)")


def run(cfg, args) -> int:
    from pathlib import Path

    from packtrain.gate import evaluate_gate, load_rules, load_source, write_gate_outputs
    from packtrain.gate.metric_sources import needs_mlflow

    rules = load_rules(args.rules)
    uri = None
    if any(needs_mlflow(s) for s in [*args.candidate, args.baseline]):
        from packtrain.tracking import resolve_tracking_uri

        uri = resolve_tracking_uri(cfg)
    candidates = [load_source(s, uri) for s in args.candidate]
    baseline = load_source(args.baseline, uri)
    result = evaluate_gate(candidates, baseline, rules)
    out = Path(args.out) if args.out else Path(cfg.workdir) / "gate"
    jpath, mpath = write_gate_outputs(result, out)
    print(result.table())
    for row in result.missing:
        print(f"missing data: {row.metric} ({row.reason})")
    print(f"→ {jpath}  {mpath}")
    return result.exit_code
