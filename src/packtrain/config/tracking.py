"""Configs of telemetry and MLflow tracking."""

from __future__ import annotations

from pydantic import field_validator

from packtrain.config.base import (
    Fraction,
    NonNegativeFloat,
    NonNegativeInt,
    PathStr,
    PositiveFloat,
    StrictModel,
    Text,
)


class TelemetryConfig(StrictModel):
    """GPU/CPU sampling, MFU peak and the seed's monitoring thresholds."""

    interval_s: PositiveFloat = 1.0
    peak_tflops: PositiveFloat | None = None
    """Override the device's peak bf16 dense TFLOP/s (e.g. a measured 790 on the H200)."""
    warmup_steps: NonNegativeInt = 2
    """Steps excluded from steady-state summaries."""
    min_utilization: Fraction = 0.90
    max_fragmentation: Fraction = 0.10
    max_padding: Fraction = 0.05
    memory_snapshot: bool = False
    """Record a CUDA memory snapshot of one step (viewable at pytorch.org/memory_viz)."""


class TrackingConfig(StrictModel):
    """Where runs go. MLFLOW_TRACKING_URI, when set, wins over `tracking_uri`."""

    enabled: bool = True
    tracking_uri: Text | None = None
    """None → sqlite:///<workdir>/mlflow.db. Never with credentials in it (`https://user:pw@host`): the config
    is written to disk (KFP parameters, stage cache, MLflow params); credentials come from
    MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN), or the whole URI from the
    MLFLOW_TRACKING_URI environment variable, which packtrain never writes down unredacted."""
    experiment: Text = "packtrain"
    system_metrics: bool = True
    """Also run MLflow's own system-metrics monitor (system/cpu_utilization_percentage, system/gpu_*, ...)."""
    system_metrics_interval_s: PositiveFloat = 5.0
    """Sampling interval of MLflow's system metrics (MLflow's default is 10 s)."""
    flush_interval_s: NonNegativeFloat = 2.0
    """Per-step metrics (StageRun.log_step) are sent in one batch at most this often; 0 → every step."""
    retry_after_s: NonNegativeFloat = 5.0
    """After the store is found unreachable, calls go straight to the buffer for this long before retrying."""
    @field_validator("tracking_uri")
    @classmethod
    def _no_credentials(cls, v: str | None) -> str | None:
        from packtrain.secrets import has_userinfo, redact_uri

        if v and has_userinfo(v):
            raise ValueError(f"{redact_uri(v)} carries credentials, and the run config is written to disk: set "
                             "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) "
                             "instead, or pass the URI in the MLFLOW_TRACKING_URI environment variable")
        return v

    buffer_dir: PathStr | None = None
    """Where metrics are buffered while the server is unreachable; None → <workdir>/mlflow-buffer."""
