"""The emitted multi-node jobs validate against the published Kubeflow API models (kubeflow-training 1.9 for
PyTorchJob kubeflow.org/v1, kubeflow-trainer-api 2.3 for TrainJob trainer.kubeflow.org/v1alpha1) — the jobs of
the scaling suite's runs (bench/suites/scaling.py) (1B, 8 GPUs a node, FSDP2 / ZeRO-3 / DDP) — and the validator itself rejects broken ones."""

from __future__ import annotations

import copy

import pytest
from k8s_schema import openapi_errors, pydantic_errors

from packtrain.config import load_run_config
from packtrain.pipeline.multinode import build_job

SCALING_RUNS = {   # bench/suites/scaling.py's engines, as --set overrides of the 1b-h200 recipe
    "fsdp2": ["train.engine=fsdp2", "train.compile=true"],
    "zero3": ["train.engine=deepspeed", "train.deepspeed.zero_stage=3", "train.compile=false"],
    "ddp": ["train.engine=torch"],
}


def _jobs(engine: str, nodes: int, kind: str) -> tuple[dict, dict]:
    cfg = load_run_config("1b-h200", overrides=SCALING_RUNS[engine])
    cm, job = build_job(cfg, nodes=nodes, gpus_per_node=8, kind=kind)
    return cm, job


@pytest.mark.parametrize("engine", sorted(SCALING_RUNS))
@pytest.mark.parametrize("nodes", [1, 2])
def test_pytorchjob_matches_the_api(engine, nodes):
    cm, job = _jobs(engine, nodes, "pytorchjob")
    assert openapi_errors(cm, "V1ConfigMap") == []
    assert openapi_errors(job, "KubeflowOrgV1PyTorchJob") == []
    assert f"engine: {SCALING_RUNS[engine][0].split('=')[1]}" in cm["data"]["run.yaml"]   # the run it launches


@pytest.mark.parametrize("nodes", [1, 2])
def test_trainjob_matches_the_api(nodes):
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    _, job = _jobs("fsdp2", nodes, "trainjob")
    assert pydantic_errors(job, TrainerV1alpha1TrainJob) == []
    secret_keys = {e["name"] for e in job["spec"]["trainer"]["env"] if "valueFrom" in e}
    assert {"MLFLOW_TRACKING_URI", "AWS_ACCESS_KEY_ID", "MLFLOW_S3_ENDPOINT_URL"} <= secret_keys   # artifacts too


def test_the_validators_reject_broken_jobs():
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    _, job = _jobs("fsdp2", 2, "pytorchjob")
    bad = copy.deepcopy(job)
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "1"           # a string where the API wants int
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicyy"] = "Never"  # a misspelt field
    del bad["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"]
    errors = openapi_errors(bad, "KubeflowOrgV1PyTorchJob")
    assert any(e.startswith("$.spec.pytorchReplicaSpecs.Worker.replicas: expected an integer") for e in errors)
    assert any(e.startswith("$.spec.pytorchReplicaSpecs.Master.restartPolicyy: unknown field") for e in errors)
    assert any(".containers[0].name: required by V1Container" in e for e in errors)

    _, tj = _jobs("fsdp2", 2, "trainjob")
    old = copy.deepcopy(tj)
    old["spec"]["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}]}]   # removed in Trainer 2.1
    old["spec"]["trainer"]["numNodes"] = "2"
    errors = pydantic_errors(old, TrainerV1alpha1TrainJob)
    assert any("numNodes" in e for e in errors)
    old["spec"]["trainer"]["numNodes"] = 2
    assert pydantic_errors(old, TrainerV1alpha1TrainJob) == [
        "$.spec.podTemplateOverrides: not a field of the API (dropped by the model)"]
