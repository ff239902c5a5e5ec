"""Configs of the pipeline adapters (KFP, Airflow), the gate and the planner."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator

from packtrain.config.base import (
    Float,
    Fraction,
    Int,
    K8sName,
    K8sQuantity,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    StrictModel,
    Text,
    Word,
)
from packtrain.config.messages import Allowed


class PipelineConfig(StrictModel):
    """How the stages are chained on a cluster (KFP), locally (`packtrain run`) and by Airflow."""

    moved_fields: ClassVar[dict[str, str]] = {"gpus": "train.gpus"}

    base_image: Word = "ghcr.io/packtrain/packtrain:0.1.0"
    """CUDA image (docker/Dockerfile) the GPU stages (train, evaluate) run in on a cluster."""
    cpu_image: Word = "ghcr.io/packtrain/packtrain-cpu:0.1.0"
    """CPU image (docker/Dockerfile.cpu) the other stages run in on a cluster."""
    base_image_digest: Annotated[str, Allowed("sha256: and 64 hex digits")] | None = Field(
        None, pattern=r"^sha256:[0-9a-f]{64}$")
    """The GPU image's digest when known (`docker buildx imagetools inspect`): the compiled pipeline then names
    the image by digest (`ghcr.io/packtrain/packtrain@sha256:…`), so a moved tag cannot change what runs."""
    cpu_image_digest: Annotated[str, Allowed("sha256: and 64 hex digits")] | None = Field(
        None, pattern=r"^sha256:[0-9a-f]{64}$")
    """The CPU image's digest when known (as base_image_digest)."""
    gpu_type: Word = "nvidia.com/gpu"
    """Kubernetes accelerator resource name requested by train (train.gpus of them) and evaluate (one); none
    when train.device is cpu."""
    mlflow_secret: K8sName = "mlflow-credentials"
    """Kubernetes secret with MLFLOW_TRACKING_URI (+ _USERNAME/_PASSWORD) mounted as env into every stage."""
    shm_size: K8sQuantity = "16Gi"
    """Size of the in-memory emptyDir mounted at /dev/shm for train/evaluate (PyTorch workers, NCCL)."""
    retries: NonNegativeInt = 2
    """Retries of the transient stages (ingest, train, evaluate, register) on a cluster."""
    schedule: Text = "0 0 3 * * 1"
    """6-field cron (seconds first) for the recurring KFP run / weekly retrain."""
    mode: Literal["local", "cluster"] = "local"
    """Airflow: run the DAG on the worker (`packtrain run`'s in-process runner), or submit it to `kfp_host` and
    wait."""
    kfp_host: Word | None = None
    """KFP API endpoint (e.g. http://ml-pipeline-ui.kubeflow:80) for `submit` and Airflow's cluster mode."""
    cpu_request: K8sQuantity = "2"
    """CPU request of the CPU stages (Kubernetes quantity)."""
    memory_request: K8sQuantity = "8Gi"
    """Memory request of the CPU stages."""
    gpu_cpu_request: K8sQuantity = "8"
    """CPU request of train/evaluate (data loading, tokenizer, telemetry sampler)."""
    gpu_memory_request: K8sQuantity = "64Gi"
    """Memory request of train/evaluate (host copy of the model, pinned batches, ZeRO offload)."""
    stage_cache: bool = True
    """`packtrain run`: reuse a stage's outputs from <workdir>/cache when its inputs (md5), its config
    section and the code are unchanged (both runners; kfp.local has no cache keyed on data)."""
    run_timeout_s: Int = Field(6 * 3600, ge=60)
    """Airflow's cluster mode: how long to wait for the KFP run to finish."""
    nodes: PositiveInt = 1
    """`packtrain pipeline pytorchjob`: nodes of the multi-node training job."""
    data_pvc: K8sName = "packtrain-data"
    """PersistentVolumeClaim holding the workdir (packs, tokens, outputs) for the multi-node job."""

    def image(self, gpu: bool) -> str:
        """The image a task runs: by digest when it is known, else by tag.

        >>> PipelineConfig(cpu_image_digest="sha256:" + "a" * 64).image(False)[:45]
        'ghcr.io/packtrain/packtrain-cpu@sha256:aaaaaaa'
        """
        name, digest = (self.base_image, self.base_image_digest) if gpu else (self.cpu_image, self.cpu_image_digest)
        if not digest:
            return name
        repo = name.split("@", 1)[0]
        if repo.rsplit("/", 1)[-1].count(":"):   # drop the tag: name:tag → name
            repo = repo.rsplit(":", 1)[0]
        return f"{repo}@{digest}"

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        from packtrain.errors import ConfigError
        from packtrain.pipeline.cron import validate_cron

        try:
            validate_cron(value)        # 6 fields, seconds first: a 5-field cron is the classic mistake
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return value


class PlanConfig(StrictModel):
    """The memory planner (`packtrain plan`, `train.rows: auto`): see docs/planner.md. The number of GPUs it
    plans for (ZeRO divides states by it; the global batch is split over it) is train.gpus."""

    moved_fields: ClassVar[dict[str, str]] = {"gpus": "train.gpus", "max_budget": "plan.max_rows"}
    """max_budget: the planner no longer picks a budget ('budget' means tokens per pack only, pack.budget); with
    train.rows=auto it picks rows per micro-batch, at most plan.max_rows."""

    device_memory_gib: PositiveFloat | None = None
    """None → the current device's memory (80 GiB if there is no GPU)."""
    target_fraction: Float = Field(0.85, gt=0, le=1)
    """train.rows=auto keeps the predicted peak (allocated + allocator overhead + context) ≤ this × device memory."""
    allocator_overhead: Fraction = 0.05
    """Caching-allocator slack on top of the allocated peak (reserved − allocated; ~2–5% with expandable segments)."""
    cuda_context_gib: NonNegativeFloat = 0.5
    """Device memory outside PyTorch's allocator: CUDA context, kernels, NCCL (~0.5 GiB on an H100/H200)."""
    vocab_size: Int | None = Field(None, ge=2)
    """Vocabulary when the caller does not pass it (`packtrain plan` uses tokenize.vocab_size)."""
    global_batch_tokens: PositiveInt | None = None
    """Tokens per optimizer step over all GPUs that train.rows=auto keeps: the smallest grad_accum whose rows =
    ⌈G / (pack.budget × train.gpus × grad_accum)⌉ fit; None → train.grad_accum is kept."""
    max_rows: PositiveInt = 64
    """Most rows per micro-batch train.rows=auto considers."""
