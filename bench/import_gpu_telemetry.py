"""Bring a GPU machine's train run into a local MLflow store: replay its tracking buffer, add the sampler series.

    python bench/import_gpu_telemetry.py TELEMETRY.tgz bench/results/mlflow_350m_h200

The GPU machine has no MLflow server: `packtrain train` ran there with MLFLOW_TRACKING_URI pointing at a dead
address, so every call went to the tracking buffer (packtrain.tracking.buffer), which `bench/gpu_session.sh
telemetry` tars up with telemetry.json. This script replays the buffer into <out>/mlflow.db (artifacts in
<out>/mlartifacts) exactly as `packtrain mlflow replay` does, then logs the NVML samples of the run's
telemetry.json as time series with `packtrain.telemetry.report.system_series` — what the train stage itself
now logs (the recorded run predates that, so its series are added here, from its own samples).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv=None) -> int:
    tgz, out = (argv or sys.argv[1:])[:2]
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="gputel-"))
    with tarfile.open(tgz) as t:
        t.extractall(tmp, filter="data")
    uri = f"sqlite:///{out / 'mlflow.db'}"
    subprocess.run([sys.executable, "-m", "packtrain.cli", "mlflow", "replay", "--buffer", str(tmp / "mlbuf"),
                    "--tracking-uri", uri], check=True, cwd=out, env={**os.environ, "PYTHONPATH": str(
                        Path(__file__).resolve().parents[1] / "src")})
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    from packtrain.telemetry.report import system_series

    c = MlflowClient(uri)
    run = c.search_runs([e.experiment_id for e in c.search_experiments()],
                        filter_string="attributes.run_name = 'train'")[0]
    samples = json.loads((tmp / "train" / "telemetry.json").read_text())["samples"]
    ts = int(run.info.start_time)
    rows = [Metric(k, v, ts + step, step) for step, m in system_series(samples) for k, v in m.items()]
    for i in range(0, len(rows), 900):
        c.log_batch(run.info.run_id, metrics=rows[i:i + 900])
    print(json.dumps({"run_id": run.info.run_id, "series_points": len(rows), "store": uri}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
