"""Configs of the pipeline adapters (KFP, Airflow), the gate and the planner."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from packtrain.config.base import StrictModel


class PipelineConfig(StrictModel):
    base_image: str = "ghcr.io/packtrain/packtrain:0.1.0"
    cpu_image: str = "ghcr.io/packtrain/packtrain-cpu:0.1.0"
    gpu_type: str = "nvidia.com/gpu"
    gpus: int = Field(1, ge=0)
    mlflow_secret: str = "mlflow-credentials"
    shm_size: str = "16Gi"
    retries: int = Field(2, ge=0)
    schedule: str = "0 0 3 * * 1"
    """6-field cron (seconds first) for the recurring KFP run / weekly retrain."""
    mode: Literal["local", "cluster"] = "local"


class PlanConfig(StrictModel):
    device_memory_gib: float | None = Field(None, gt=0)
    """None → the current device's memory (80 GiB if there is no GPU)."""
    target_fraction: float = Field(0.85, gt=0, le=1)
    gpus: int = Field(1, ge=1)
    allocator_overhead: float = Field(0.05, ge=0, le=1)
