"""MLflow's own system metrics monitor for a stage run: cpu/memory/disk/network/GPU as `system/...` series
every `tracking.system_metrics_interval_s`, beside the train loop's own samples (`system/train_*`,
packtrain.tracking.layout). Never fails a stage: a monitor that cannot start is a warning."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


def start_system_metrics(run_id: str, uri: str, interval_s: float):
    """A started SystemMetricsMonitor logging into run `run_id`, or None (psutil missing, ...)."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        # its INFO lines ("Started monitoring system metrics." x4 per run) drown the stage's own output
        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
        mon = SystemMetricsMonitor(run_id, sampling_interval=interval_s, samples_before_logging=1,
                                   tracking_uri=uri)
        mon.start()
        return mon
    except Exception as e:  # psutil missing, ...: never fail a stage over it
        from packtrain.secrets import redact_text

        log.warning("MLflow system metrics not started: %s", redact_text(str(e)))
        return None


def stop_system_metrics(mon, timeout_s: float = 5.0) -> None:
    """finish() joins the monitor thread, which may be inside a slow HTTP call: bound it."""
    if mon is None:
        return
    t = threading.Thread(target=mon.finish, name="packtrain-sysmetrics-stop", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        log.warning("MLflow system metrics monitor did not stop within %.0f s; left to exit with the process",
                    timeout_s)
