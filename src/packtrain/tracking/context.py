"""Where a run happens: rank, git sha, host, GPU, orchestrator ids — the tags every run carries."""

from __future__ import annotations

import functools
import os
import socket

from packtrain.versioning import git_sha  # the one git-HEAD lookup

PARENT_ENV = "PACKTRAIN_PARENT_RUN_ID"
"""The MLflow run id of the pipeline's parent run: set by `packtrain run`/Airflow (packtrain.tracking.run_lifecycle.
start_pipeline_run) or by the first KFP component (packtrain.pipeline.runtime); every stage run nests under it."""

# Orchestrator run ids: KFP components get KFP_RUN_ID from the pipeline room's components; Airflow exports
# AIRFLOW_CTX_* into every task's environment.
ORCHESTRATOR_ENV = {
    "kfp.run_id": "KFP_RUN_ID",
    "kfp.pod_name": "KFP_POD_NAME",
    "airflow.run_id": "AIRFLOW_CTX_DAG_RUN_ID",
    "airflow.dag_id": "AIRFLOW_CTX_DAG_ID",
    "airflow.task_id": "AIRFLOW_CTX_TASK_ID",
}


def process_rank() -> int:
    """Global rank from RANK (torchrun, DeepSpeed), else LOCAL_RANK, else 0."""
    for var in ("RANK", "LOCAL_RANK"):
        v = os.environ.get(var)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                return 0
    return 0


def is_rank_zero() -> bool:
    """Only rank 0 talks to MLflow; other ranks get no-op runs."""
    return process_rank() == 0


@functools.lru_cache(maxsize=1)
def gpu_tag() -> str:
    """'NVIDIA H200' or 'NVIDIA H200 x8' for the visible GPUs (NVML, no torch import); 'cpu' without."""
    from packtrain.telemetry.sampler import gpu_names

    names = gpu_names()
    if not names:
        return "cpu"
    first = names[0]
    return first if len(names) == 1 else f"{first} x{len(names)}" if len(set(names)) == 1 else ", ".join(names)


def base_tags(kind: str, recipe: str, stage: str | None = None) -> dict[str, str]:
    """Tags of every run: kind (pipeline|stage), stage, recipe, git sha, host, GPU, rank/world, orchestrator."""
    from packtrain import __version__

    tags = {
        "packtrain.kind": kind,
        "packtrain.stage": stage,
        "packtrain.recipe": recipe,
        "packtrain.version": __version__,
        "mlflow.source.git.commit": git_sha(),
        "host": socket.gethostname(),
        "packtrain.gpu": gpu_tag(),
        "packtrain.world_size": os.environ.get("WORLD_SIZE"),
    }
    for tag, var in ORCHESTRATOR_ENV.items():
        tags[tag] = os.environ.get(var)
    return {k: str(v) for k, v in tags.items() if v not in (None, "")}
