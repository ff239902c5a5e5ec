"""Bring a GPU machine's train run into a local MLflow store: replay its tracking buffer, add the sampler series.

    python -m bench import-telemetry TELEMETRY.tgz /tmp/mlflow_350m_h200     # then: mlflow ui --backend-store-uri ...

The GPU machine has no MLflow server: `packtrain train` ran there with MLFLOW_TRACKING_URI pointing at a dead
address, so every call went to the tracking buffer (packtrain.tracking.buffer), tarred up with its train/
telemetry.json (bench/results/GPU_RESULTS.md, section 4, has the commands). This replays the buffer into <out>/mlflow.db (artifacts in
<out>/mlartifacts) exactly as `packtrain mlflow replay` does, then logs the NVML samples of the run's
telemetry.json as MLflow system metrics with `packtrain.tracking.layout.system_rows` (`system/train_*`, each at
its sample's time) — what the train stage itself now logs (the recorded run predates that, so its series are
added here, from its own samples; a telemetry.json without `samples_t0_unix` is placed at the run's start). The store is
not committed: bench/results/train_350m_h200_mlflow_run.json holds the recorded run's tags, params and latest
metrics.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m bench import-telemetry TELEMETRY.tgz OUT_DIR", file=sys.stderr)
        return 2
    tgz, out = args
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="gputel-"))
    with tarfile.open(tgz) as t:
        t.extractall(tmp, filter="data")
    uri = f"sqlite:///{out / 'mlflow.db'}"
    subprocess.run([sys.executable, "-m", "packtrain.cli", "mlflow", "replay", "--buffer", str(tmp / "mlbuf"),
                    "--tracking-uri", uri], check=True, cwd=out)
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    from packtrain.tracking.layout import system_rows

    c = MlflowClient(uri)
    run = c.search_runs([e.experiment_id for e in c.search_experiments()],
                        filter_string="attributes.run_name = 'train'")[0]
    telemetry = json.loads((tmp / "train" / "telemetry.json").read_text())
    t0 = telemetry.get("samples_t0_unix") or run.info.start_time / 1000
    rows = [Metric(k, v, ts, step) for k, v, ts, step in system_rows(telemetry["samples"], t0)]
    for i in range(0, len(rows), 900):
        c.log_batch(run.info.run_id, metrics=rows[i:i + 900])
    print(json.dumps({"run_id": run.info.run_id, "series_points": len(rows), "store": uri}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
