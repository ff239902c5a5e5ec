"""`packtrain mlflow replay [--buffer DIR] [--tracking-uri URI]`: send buffered MLflow ops to the store.

Ops buffered while the tracking store was unreachable (see packtrain.tracking.buffer) are replayed in order
to the store each was recorded for, or all to --tracking-uri. Prints one JSON line
{"buffer", "applied", "left", "rejected", "files", "skipped_locked"}. Exit 0 when nothing is left, 1 when
ops remain (store still unreachable, or a file is held by a running process), 5 when --buffer does not exist.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["replay"], help="replay: send buffered metrics/params/tags/artifacts")
    parser.add_argument("--buffer", default=None, metavar="DIR",
                        help="buffer directory (default: tracking.buffer_dir or <workdir>/mlflow-buffer)")
    parser.add_argument("--tracking-uri", default=None, metavar="URI",
                        help="send every op to this store instead of the one it was recorded for")


def run(cfg, args) -> int:
    import json
    import sys
    from pathlib import Path

    from packtrain.errors import MissingDataError
    from packtrain.tracking import buffer_dir_for, replay_dir

    buf = Path(args.buffer) if args.buffer else buffer_dir_for(cfg)
    if not buf.is_dir():
        if args.buffer:
            raise MissingDataError(f"--buffer {args.buffer}: no such directory (a buffer directory holds the "
                                   f"*.jsonl files written while the MLflow store was unreachable)")
        print(json.dumps({"buffer": str(buf), "applied": 0, "left": 0, "rejected": 0, "files": 0,
                          "skipped_locked": []}))
        return 0
    res = replay_dir(buf, tracking_uri=args.tracking_uri)
    print(json.dumps({"buffer": str(buf), "applied": res.applied, "left": res.left, "rejected": res.rejected,
                      "files": res.files, "skipped_locked": res.skipped_locked}))
    if res.left or res.skipped_locked:
        print(f"error: {res.left} buffered op(s) not replayed"
              + (f"; files in use by a running process: {', '.join(res.skipped_locked)}" if res.skipped_locked
                 else " (is the tracking store reachable?)"), file=sys.stderr)
        return 1
    return 0
