"""Configs of telemetry and MLflow tracking."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from packtrain.config.base import (
    Fraction,
    NonNegativeFloat,
    NonNegativeInt,
    PathStr,
    PositiveFloat,
    PositiveInt,
    StrictModel,
    Text,
)

GuardAction = Literal["warn", "checkpoint_and_stop", "fallback"]
"""warn: an event (console, MLflow, train_result.json) and training goes on; checkpoint_and_stop: save a checkpoint
and stop with exit 6 (`--resume` continues from it); fallback: save a checkpoint and continue with the signal's
named change (docs/guard.md), at most telemetry.guard.max_fallbacks times a run."""


class GuardActions(StrictModel):
    """What the utilization guard does on each signal (packtrain.telemetry.guard; docs/guard.md)."""

    throughput: GuardAction = "warn"
    """tokens/s below (1 − drop_fraction) × the learned steady state for `consecutive` intervals. Its fallback is
    the change for the measured cause (recompile → compile_off; alloc_retries/fragmentation → release_cache);
    a cause without one (data_wait, throttle, compute) is warned."""
    data_wait: Literal["warn", "checkpoint_and_stop"] = "warn"
    """The loop waited for input longer than max_data_wait of the step time for `consecutive` intervals (no
    fallback: the loader is not the loop's to change)."""
    recompile: GuardAction = "warn"
    """torch.compile recompiled after the warm-up (a guard failed: new shape, dtype, grad mode). Fallback:
    compile_off (torch.compiler.set_stance("force_eager") for the rest of the run)."""
    alloc_retries: GuardAction = "warn"
    """The CUDA caching allocator retried a cudaMalloc after freeing its cache, or counted an OOM. Fallback:
    release_cache (torch.cuda.empty_cache, peak counters reset, re-measured over the next interval)."""
    fragmentation: GuardAction = "warn"
    """Fragmentation at the peak (1 − peak allocated / peak reserved) above telemetry.max_fragmentation.
    Fallback: release_cache."""
    hang: Literal["warn", "checkpoint_and_stop"] = "warn"
    """One step ran longer than hang_s (watchdog thread). checkpoint_and_stop: when the step returns, checkpoint
    and exit 6; a step still stuck after 2 × hang_s ends the process with exit 6 (the last checkpoint stays)."""
    straggler: Literal["warn", "checkpoint_and_stop"] = "warn"
    """Several ranks: one rank waits for its input more than drop_fraction of the step time longer than the
    others' median, or its GPU's SM clock lags the others' by drop_fraction (named by rank)."""


class GuardConfig(StrictModel):
    """The utilization guard: watches each interval of a run for throughput drops and their causes (docs/guard.md).
    Costs one comparison per step and a few medians per interval (< 0.1% of the step time measured)."""

    enabled: bool = True
    interval_steps: PositiveInt = 10
    """Optimizer steps per interval: signals are checked (and, over several ranks, gathered) once an interval."""
    window: PositiveInt = 3
    """Intervals after telemetry.warmup_steps whose medians become the steady state (tokens/s, step time, data
    wait, SM clock); relearned after a fallback changes the run."""
    drop_fraction: Fraction = 0.3
    """A throughput drop: the interval's median tokens/s below (1 − drop_fraction) × the steady state."""
    consecutive: PositiveInt = 2
    """Intervals in a row a drop (or data wait) must last to become an event."""
    max_data_wait: Fraction = 0.2
    """The data_wait signal: share of the step time spent waiting for the next micro-batches."""
    hang_s: NonNegativeFloat = 300.0
    """A step (its input wait included) running longer than this is a hang; 0 turns the watchdog off. It is armed
    after telemetry.warmup_steps (compilation of the first steps is not a hang)."""
    actions: GuardActions = GuardActions()
    max_fallbacks: NonNegativeInt = 2
    """Fallbacks a run may apply; after that a fallback action only warns (saying so)."""


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
    guard: GuardConfig = GuardConfig()
    """The utilization guard during training (signals, thresholds, actions: docs/guard.md)."""


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
