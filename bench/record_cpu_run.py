"""Record `make run` (= `packtrain run --recipe tiny-cpu`) on this machine: a first run in a fresh directory (its
default workdir `data/` is new), then a second one on unchanged data (every stage from the stage cache). The README and docs/pipeline.md quote their
times and output from the file this writes, nowhere else (tests/pipelines/test_docs_numbers.py checks it).

    python bench/record_cpu_run.py                       # → bench/results/cpu_run_tiny.json
    python bench/record_cpu_run.py --out x.json --keep   # keep the workdir (printed)

Writes {"recorded", "machine": {"cpus", "loadavg_before", "python", "platform"}, "command", "runs": [
{"name": "first"|"cached", "seconds" (the summary's own figure), "wall_s", "stdout": [lines]}]}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKTRAIN = Path(sys.executable).with_name("packtrain")


def record(cwd: Path) -> dict:
    from packtrain.pipeline.cache import code_version, source_md5

    load = os.getloadavg()
    runs = []
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PACKTRAIN_PARENT_RUN_ID")}
    # the stage cache's code part, computed once as `make run` computes it: an edit elsewhere in a shared
    # checkout between the two runs must not turn the second run into a first one
    env.setdefault("PACKTRAIN_CODE_VERSION", f"{code_version()}:{source_md5()}")
    for name in ("first", "cached"):
        cmd = [str(PACKTRAIN), "run", "--recipe", "tiny-cpu"]   # workdir: the recipe's `data`, under cwd
        t0 = time.perf_counter()
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            sys.exit(f"{name} run failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        m = re.search(r"7 stages in ([\d.]+) s", r.stdout)
        runs.append({"name": name, "seconds": float(m.group(1)) if m else None, "wall_s": round(wall, 1),
                     "stdout": r.stdout.splitlines()})
    return {"recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load],
                        "python": platform.python_version(), "platform": platform.platform()},
            "command": "packtrain run --recipe tiny-cpu  (= make run), in a fresh directory", "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cpu_run_tiny.json"))
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    args = ap.parse_args()
    cwd = Path(tempfile.mkdtemp(prefix="packtrain-cpu-run-"))
    try:
        rec = record(cwd)
    finally:
        if args.keep:
            print(f"workdir kept: {cwd / 'data'}", file=sys.stderr)
        else:
            shutil.rmtree(cwd, ignore_errors=True)
    Path(args.out).write_text(json.dumps(rec, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(" · ".join(f"{r['name']} {r['seconds']} s" for r in rec["runs"]), "→", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
