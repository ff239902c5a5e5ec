"""`packtrain mlflow replay [--buffer DIR] [--tracking-uri URI]`: send buffered MLflow ops to the store.

Ops buffered while the tracking store was unreachable (see packtrain.tracking.buffer) are replayed in order,
each exactly once (packtrain.tracking.replay), to the store each was recorded for, or all to --tracking-uri.
Ops are recorded under the redacted URI (`https://user:***@host`): their credentials come from
--tracking-uri or from MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN).

Prints first, on stderr, one human line per store the ops were recorded for, e.g.
`buffered ops were recorded for https://user:***@mlflow.example:5000 (12 ops)`, then on stdout one JSON line
{"buffer", "recorded_uris": {uri: ops}, "target", "applied", "left", "rejected", "files", "skipped_locked",
"needs_credentials", "registered"} (URIs redacted; "registered": the model versions that deferred
registrations produced). Exit 0 when nothing is left, 1 when ops remain (store still unreachable, a file
held by a running process, or credentials missing: the message names the redacted URI), 5 when --buffer
does not exist.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["replay"], help="replay: send buffered metrics/params/tags/artifacts "
                                                           "and deferred model registrations")
    parser.add_argument("--buffer", default=None, metavar="DIR",
                        help="buffer directory (default: tracking.buffer_dir or <workdir>/mlflow-buffer)")
    parser.add_argument("--tracking-uri", default=None, metavar="URI",
                        help="send every op to this store instead of the one it was recorded for (may carry "
                             "the credentials the buffer does not record)")


def run(cfg, args) -> int:
    import json
    import sys
    from pathlib import Path

    from packtrain.errors import MissingDataError
    from packtrain.secrets import redact_uri
    from packtrain.tracking import buffer_dir_for, recorded_uris, replay_dir

    buf = Path(args.buffer) if args.buffer else buffer_dir_for(cfg)
    target = redact_uri(args.tracking_uri)
    empty = {"buffer": str(buf), "recorded_uris": {}, "target": target, "applied": 0, "left": 0, "rejected": 0,
             "files": 0, "skipped_locked": [], "needs_credentials": [], "registered": []}
    if not buf.is_dir():
        if args.buffer:
            raise MissingDataError(f"--buffer {args.buffer}: no such directory (a buffer directory holds the "
                                   f"*.jsonl files written while the MLflow store was unreachable)")
        print(json.dumps(empty))
        return 0
    recorded = recorded_uris(buf)
    for uri, n in recorded.items():
        where = f" → replayed to {target}" if target else ""
        print(f"buffered ops were recorded for {uri or '(no URI)'} ({n} ops){where}", file=sys.stderr)
    res = replay_dir(buf, tracking_uri=args.tracking_uri)
    print(json.dumps({**empty, "recorded_uris": recorded, "applied": res.applied, "left": res.left,
                      "rejected": res.rejected, "files": res.files, "skipped_locked": res.skipped_locked,
                      "needs_credentials": res.needs_credentials, "registered": res.registered}))
    for r in res.registered:
        print(f"registered {r['model_name']} v{r['version']} → {r['decision']} ({r['reason']})", file=sys.stderr)
    for uri in res.needs_credentials:
        print(f"error: ops recorded for {uri} were not replayed: the buffer does not keep its credentials. "
              f"Pass --tracking-uri with them, or set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
              f"(or MLFLOW_TRACKING_TOKEN)", file=sys.stderr)
    if res.left or res.skipped_locked:
        reasons = []
        if res.skipped_locked:
            reasons.append(f"files in use by a running process: {', '.join(res.skipped_locked)}")
        if res.needs_credentials:
            reasons.append(f"credentials missing for {', '.join(res.needs_credentials)}")
        print(f"error: {res.left} buffered op(s) not replayed"
              + (f"; {'; '.join(reasons)}" if reasons else " (is the tracking store reachable?)"), file=sys.stderr)
        return 1
    return 0
