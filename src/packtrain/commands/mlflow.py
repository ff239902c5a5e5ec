"""`packtrain mlflow replay [--buffer DIR] [--tracking-uri URI]`: send buffered MLflow ops to the store.
`packtrain mlflow resolve REF [--stage STAGE]`: the full run id a reference names.

resolve takes what every run-taking command takes (packtrain.tracking.refs): a full id, a unique prefix of ≥ 6
characters (`packtrain run` prints 8), `runs:/ID`, `NAME@ALIAS`, `models:/NAME@ALIAS`, `models:/NAME/VERSION`;
with --stage, the run of that stage in the same pipeline run (e.g. the train run behind a champion). Prints
the full id on stdout, and on stderr its name and where to open it; exit 2 when the reference names no run
or several (the message lists the candidates).

Ops buffered while the tracking store was unreachable (see packtrain.tracking.buffer) are replayed in order,
each exactly once (packtrain.tracking.replay), to the store each was recorded for, or all to --tracking-uri.
Ops are recorded under the redacted URI (`https://user:***@host`): their credentials come from
--tracking-uri or from MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN).

Prints first, on stderr, one human line per store the ops were recorded for, e.g.
`buffered ops were recorded for https://user:***@mlflow.example:5000 (12 ops)`, then on stdout one JSON line
{"buffer", "recorded_uris": {uri: ops}, "target", "applied", "left", "rejected", "files", "skipped_locked",
"needs_credentials", "registered", "refused"} (URIs redacted; "registered": the model versions that deferred
registrations produced; "refused": one message per buffer line whose file path leads outside the buffer's
artifacts/ — buffer file, line, path, what is allowed — which is not applied, uploads nothing and deletes
nothing, and is kept in rejected.jsonl). Exit 0 when nothing is left, 1 when ops remain (store still
unreachable, a file held by a running process, or credentials missing: the message names the redacted URI),
3 when a line was refused (whatever else is left), 5 when --buffer does not exist, 7 while another replay of the
same buffer runs. A replay locks the buffer it replays (a lock file beside it), never the workdir of the folder it
is started from: replays of unrelated buffers run side by side.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from packtrain.commands import nested_common

    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    text = ("send buffered metrics/params/tags/artifacts and deferred model registrations to the store, each op "
            "exactly once")
    rp = sub.add_parser("replay", help=text, description=text)
    rp.add_argument("--buffer", default=None, metavar="DIR",
                    help="buffer directory (default: tracking.buffer_dir or <workdir>/mlflow-buffer)")
    rp.add_argument("--tracking-uri", default=None, metavar="URI",
                    help="send every op to this store instead of the one it was recorded for (may carry "
                         "the credentials the buffer does not record)")
    text = "print the full run id a reference names (and, on stderr, its name and where to open it)"
    rs = sub.add_parser("resolve", help=text, description=text)
    rs.add_argument("ref", metavar="REF",
                    help="run id, ≥ 6-character prefix, runs:/ID, NAME@ALIAS, models:/NAME@ALIAS or models:/NAME/VERSION")
    rs.add_argument("--stage", metavar="STAGE", help="the run of this stage in the same pipeline run")
    for p in (rp, rs):
        nested_common(p)


def run(cfg, args) -> int:
    from packtrain.errors import ConfigError

    if args.action == "resolve":
        return resolve(cfg, args)
    if args.action == "replay":
        return replay(cfg, args)
    raise ConfigError("packtrain mlflow: choose an action: replay or resolve REF")


def resolve(cfg, args) -> int:
    import sys

    from mlflow import MlflowClient

    from packtrain.errors import ConfigError
    from packtrain.tracking import resolve_tracking_uri
    from packtrain.tracking.links import mlflow_hint
    from packtrain.tracking.refs import RunRefError, resolve_run_ref, stage_run_of

    if not args.ref:
        raise ConfigError("packtrain mlflow resolve REF: give a run id (or ≥ 6-character prefix), NAME@ALIAS or "
                          "models:/NAME/VERSION")
    uri = resolve_tracking_uri(cfg)
    client = MlflowClient(uri)
    run_id = resolve_run_ref(client, args.ref)
    if args.stage:
        found = stage_run_of(client, run_id, args.stage)
        if found is None:
            raise RunRefError(f"{args.ref}: run {run_id} has no {args.stage!r} run in its pipeline run")
        run_id = found
    run = client.get_run(run_id)
    print(run_id)
    print(f"{run.info.run_name} · {mlflow_hint(uri, run.info.experiment_id, run_id)}", file=sys.stderr)
    return 0


def replay(cfg, args) -> int:
    import json
    from pathlib import Path

    from packtrain.errors import MissingDataError
    from packtrain.secrets import redact_uri
    from packtrain.tracking import buffer_dir_for

    buf = Path(args.buffer) if args.buffer else buffer_dir_for(cfg)
    target = redact_uri(args.tracking_uri)
    empty: dict[str, Any] = {"buffer": str(buf), "recorded_uris": {}, "target": target, "applied": 0, "left": 0, "rejected": 0,
             "files": 0, "skipped_locked": [], "needs_credentials": [], "registered": [], "refused": []}
    if not buf.is_dir():
        if args.buffer:
            raise MissingDataError(f"--buffer {args.buffer}: no such directory (a buffer directory holds the "
                                   f"*.jsonl files written while the MLflow store was unreachable)")
        print(json.dumps(empty))
        return 0
    from packtrain.pipeline.lock import buffer_lock

    with buffer_lock(buf, "mlflow replay"):   # the buffer's own location, not the workdir of the current folder
        return _replay_locked(buf, args, target, empty)


def _replay_locked(buf, args, target: str | None, empty: dict[str, Any]) -> int:
    import json
    import sys

    from packtrain.tracking import recorded_uris, replay_dir

    recorded = recorded_uris(buf)
    for uri, n in recorded.items():
        where = f" → replayed to {target}" if target else ""
        print(f"buffered ops were recorded for {uri or '(no URI)'} ({n} ops){where}", file=sys.stderr)
    res = replay_dir(buf, tracking_uri=args.tracking_uri)
    print(json.dumps({**empty, "recorded_uris": recorded, "applied": res.applied, "left": res.left,
                      "rejected": res.rejected, "files": res.files, "skipped_locked": res.skipped_locked,
                      "needs_credentials": res.needs_credentials, "registered": res.registered,
                      "refused": res.refused}))
    for r in res.registered:
        print(f"registered {r['model_name']} v{r['version']} → {r['decision']} ({r['reason']})", file=sys.stderr)
    for uri in res.needs_credentials:
        print(f"error: ops recorded for {uri} were not replayed: the buffer does not keep its credentials. "
              f"Pass --tracking-uri with them, or set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
              f"(or MLFLOW_TRACKING_TOKEN)", file=sys.stderr)
    for msg in res.refused:
        print(f"error: {msg}", file=sys.stderr)
    if res.left or res.skipped_locked:
        reasons = []
        if res.skipped_locked:
            reasons.append(f"files in use by a running process: {', '.join(res.skipped_locked)}")
        if res.needs_credentials:
            reasons.append(f"credentials missing for {', '.join(res.needs_credentials)}")
        print(f"error: {res.left} buffered op(s) not replayed"
              + (f"; {'; '.join(reasons)}" if reasons else " (is the tracking store reachable?)"), file=sys.stderr)
    if res.refused:
        return 3   # a buffer line pointing outside the buffer: bad input data (packtrain.errors), first
    return 1 if res.left or res.skipped_locked else 0
