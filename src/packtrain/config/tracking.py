"""Configs of telemetry and MLflow tracking."""

from __future__ import annotations

from pydantic import Field

from packtrain.config.base import StrictModel


class TelemetryConfig(StrictModel):
    """GPU/CPU sampling, MFU peak and the seed's monitoring thresholds."""

    interval_s: float = Field(1.0, gt=0)
    peak_tflops: float | None = Field(None, gt=0)
    """Override the device's peak bf16 dense TFLOP/s (e.g. a measured 790 on the H200)."""
    warmup_steps: int = Field(2, ge=0)
    """Steps excluded from steady-state summaries."""
    min_utilization: float = Field(0.90, ge=0, le=1)
    max_fragmentation: float = Field(0.10, ge=0, le=1)
    max_padding: float = Field(0.05, ge=0, le=1)
    memory_snapshot: bool = False
    """Record a CUDA memory snapshot of one step (viewable at pytorch.org/memory_viz)."""


class TrackingConfig(StrictModel):
    """Where runs go. MLFLOW_TRACKING_URI, when set, wins over `tracking_uri`."""

    enabled: bool = True
    tracking_uri: str | None = None
    """None → sqlite:///<workdir>/mlflow.db."""
    experiment: str = "packtrain"
    system_metrics: bool = True
    """Also run MLflow's own system-metrics monitor (system/cpu_utilization_percentage, system/gpu_*, ...)."""
    system_metrics_interval_s: float = Field(5.0, gt=0)
    """Sampling interval of MLflow's system metrics (MLflow's default is 10 s)."""
    flush_interval_s: float = Field(2.0, ge=0)
    """Per-step metrics (StageRun.log_step) are sent in one batch at most this often; 0 → every step."""
    retry_after_s: float = Field(5.0, ge=0)
    """After the store is found unreachable, calls go straight to the buffer for this long before retrying."""
    buffer_dir: str | None = None
    """Where metrics are buffered while the server is unreachable; None → <workdir>/mlflow-buffer."""
