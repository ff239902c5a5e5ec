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
    buffer_dir: str | None = None
    """Where metrics are buffered while the server is unreachable; None → <workdir>/mlflow-buffer."""
