"""`make run` (= `packtrain run --recipe tiny-cpu`) on this machine: a first run in a fresh directory (its default
workdir `data/` is new), then a second one on unchanged data (every stage from the stage cache). The README and
docs/pipeline.md quote their times and output from the record this writes, nowhere else
(tests/pipelines/test_docs_numbers.py checks it).

    python -m bench cpu-run --out bench/results/cpu_run_tiny.json     # ~2 min on 2 cores
    python -m bench cpu-run --smoke --out /tmp/cr                     # `packtrain --help` twice instead

Writes the record with {"recorded", "machine", "command", "runs": [{"name": "first"|"cached", "seconds" (the
summary's own figure; --smoke: the wall time), "wall_s", "stdout": [lines]}]} and the same two as its rows.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import Record, machine_info
from bench.packtrain_runs import clean_env, run_packtrain_cli, run_seconds

SUMMARY = "`make run` on the CPU: a first run in a fresh directory and a second, cached one"
DEVICE = "cpu"
PACKTRAIN = Path(sys.executable).with_name("packtrain")


def add_arguments(p) -> None:
    p.add_argument("--keep", action="store_true", help="keep the workdir")


def record_runs(cwd: Path, cmd: list[str]) -> list[dict]:
    """`cmd` twice in `cwd`: (first, cached) with the summary's seconds, the wall time and the output."""
    from packtrain.pipeline.cache import source_md5
    from packtrain.versioning import code_version

    runs = []
    env = clean_env()
    # the stage cache's code part, computed once as `make run` computes it: an edit elsewhere in a shared
    # checkout between the two runs must not turn the second run into a first one
    env.setdefault("PACKTRAIN_CODE_VERSION", f"{code_version()}:{source_md5()}")
    for name in ("first", "cached"):
        r, wall = run_packtrain_cli(cmd, cwd, f"{name} run", env)
        runs.append({"name": name, "seconds": run_seconds(r.stdout, wall), "wall_s": round(wall, 1),
                     "stdout": r.stdout.splitlines()})
    return runs


def run(args, out: Path) -> Record:
    # workdir: the recipe's `data`, under cwd; --smoke: the recorder on a command of a second (no pipeline)
    cmd = [str(PACKTRAIN), "--help"] if args.smoke else [str(PACKTRAIN), "run", "--recipe", "tiny-cpu"]
    load = os.getloadavg()
    cwd = Path(tempfile.mkdtemp(prefix="packtrain-cpu-run-"))
    try:
        runs = record_runs(cwd, cmd)
    finally:
        if args.keep:
            print(f"workdir kept: {cwd / 'data'}", file=sys.stderr)
        else:
            shutil.rmtree(cwd, ignore_errors=True)
    print(" · ".join(f"{r['name']} {r['seconds']} s" for r in runs), file=sys.stderr)
    return Record(suite="cpu-run", study="`make run` on the CPU, first and cached", command=args.command,
                  machine=machine_info(), settings={"run": " ".join(["packtrain", *cmd[1:]])},
                  rows=[{k: v for k, v in r.items() if k != "stdout"} for r in runs],
                  extra={"recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                         "loadavg_before": [round(x, 2) for x in load], "runs": runs})
