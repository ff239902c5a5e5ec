"""Multi-node training specs: a PyTorchJob (kubeflow.org/v1) or a Kubeflow Trainer v2 TrainJob running
`packtrain train` under torchrun on M nodes × N GPUs.

The KFP train component covers N GPUs on ONE node (`train.gpus`: the stage launches N ranks itself,
packtrain.train.launch); beyond one node the train stage runs
as a job of its own, reading the packs from a shared PVC (`pipeline.data_pvc`, mounted at /workspace) that
the data stages wrote (KFP run with that PVC, or `dvc repro pack` on it):

    ConfigMap  packtrain-<name>-config   run.yaml = the RunConfig, workdir=/workspace/<name>
    PyTorchJob packtrain-<name>-train    Master ×1 + Worker ×(M-1), each: N × nvidia.com/gpu,
                                         /dev/shm emptyDir (Memory), MLflow secret as env (optional),
      command: torchrun --nnodes=M --nproc-per-node=N --no-python packtrain train --recipe /etc/packtrain/run.yaml
    or TrainJob (trainer.kubeflow.org/v1alpha1, runtime torch-distributed): numNodes=M, numProcPerNode=N,
                                         volumes through runtimePatches (Trainer API 2.3).

The operators inject PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT (and PET_NNODES/PET_NPROC_PER_NODE),
which torchrun reads from the environment; world size = M × N ranks. The outer torchrun sets RANK, so the
train stage does not launch again; run.yaml carries train.gpus = N (what the memory planner plans per node).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packtrain.errors import ConfigError

MOUNT_CONFIG = "/etc/packtrain"
MOUNT_DATA = "/workspace"


@dataclass(frozen=True)
class JobSpec:
    """What the multi-node job needs; built from the RunConfig + CLI flags."""

    name: str
    image: str
    nodes: int
    gpus_per_node: int
    gpu_type: str = "nvidia.com/gpu"
    cpu: str = "8"
    memory: str = "64Gi"
    shm_size: str = "16Gi"
    data_pvc: str = "packtrain-data"
    mlflow_secret: str = "mlflow-credentials"
    namespace: str = "kubeflow"

    def __post_init__(self):
        if self.nodes < 1:
            raise ConfigError(f"--nodes {self.nodes}: must be ≥ 1")
        if self.gpus_per_node < 1:
            raise ConfigError(f"--gpus-per-node {self.gpus_per_node}: must be ≥ 1")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", self.name) or len(self.name) > 50:
            raise ConfigError(f"job name {self.name!r}: must be a DNS-1123 label (lowercase letters, digits, '-'; "
                              "≤ 50 chars)")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def k8s_name(text: str) -> str:
    """'tiny-cpu' → 'tiny-cpu'; '350M_H200' → '350m-h200' (DNS-1123)."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40] or "run"


def train_command(spec: JobSpec) -> list[str]:
    return ["torchrun", f"--nnodes={spec.nodes}", f"--nproc-per-node={spec.gpus_per_node}", "--no-python",
            "packtrain", "train", "--recipe", f"{MOUNT_CONFIG}/run.yaml"]


def _pod_spec(spec: JobSpec) -> dict:
    container = {
        "name": "pytorch",  # the PyTorchJob operator requires this container name
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": train_command(spec),
        "env": [{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}],
        "envFrom": [{"secretRef": {"name": spec.mlflow_secret, "optional": True}}],
        "resources": _resources(spec),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "config", "mountPath": MOUNT_CONFIG, "readOnly": True},
                         {"name": "data", "mountPath": MOUNT_DATA}],
    }
    return {
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
                    {"name": "config", "configMap": {"name": f"{spec.name}-config"}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": spec.data_pvc}}],
    }


def _resources(spec: JobSpec) -> dict:
    return {"requests": {"cpu": spec.cpu, "memory": spec.memory, spec.gpu_type: spec.gpus_per_node},
            "limits": {spec.gpu_type: spec.gpus_per_node}}


def config_map(spec: JobSpec, run_yaml: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{spec.name}-config", "namespace": spec.namespace,
                         "labels": {"app.kubernetes.io/part-of": "packtrain"}},
            "data": {"run.yaml": run_yaml}}


def pytorchjob(spec: JobSpec) -> dict:
    """A kubeflow.org/v1 PyTorchJob: Master ×1 + Worker ×(nodes-1), nprocPerNode = GPUs per node."""
    def replica(n: int) -> dict:
        return {"replicas": n, "restartPolicy": "OnFailure",
                "template": {"metadata": {"labels": {"app": spec.name}}, "spec": _pod_spec(spec)}}

    replicas = {"Master": replica(1)}
    if spec.nodes > 1:
        replicas["Worker"] = replica(spec.nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": f"{spec.name}-train", "namespace": spec.namespace,
                     "labels": {"app.kubernetes.io/part-of": "packtrain"}},
        "spec": {"nprocPerNode": str(spec.gpus_per_node),
                 "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 3},
                 "pytorchReplicaSpecs": replicas},
    }


MLFLOW_SECRET_KEYS = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                      "MLFLOW_TRACKING_TOKEN", "MLFLOW_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                      "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION")
"""The keys a TrainJob reads from the MLflow secret, each optional (a TrainJob's trainer takes `env` only, no
`envFrom`; the PyTorchJob mounts the whole secret with envFrom)."""


def trainjob(spec: JobSpec, runtime: str = "torch-distributed") -> dict:
    """A Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1, API 2.3) on the `torch-distributed`
    ClusterTrainingRuntime. Volumes and mounts reach the runtime's `node` replicated job through a
    `runtimePatches` entry (manager "packtrain"): the API has no podTemplateOverrides since Trainer 2.1, and a
    ContainerPatch has no envFrom, so the MLflow secret's keys come in as optional secretKeyRef env vars.
    tests/pipelines/test_job_schema.py validates the result against kubeflow-trainer-api's models."""
    pod = _pod_spec(spec)
    c = pod["containers"][0]
    secret_env = [{"name": key, "valueFrom": {"secretKeyRef": {"name": spec.mlflow_secret, "key": key,
                                                                 "optional": True}}}
                  for key in MLFLOW_SECRET_KEYS]
    node_pod = {"volumes": pod["volumes"], "containers": [{"name": "node", "volumeMounts": c["volumeMounts"]}]}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": f"{spec.name}-train", "namespace": spec.namespace,
                     "labels": {"app.kubernetes.io/part-of": "packtrain"}},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {"image": spec.image, "command": c["command"], "env": c["env"] + secret_env,
                        "numNodes": spec.nodes, "numProcPerNode": spec.gpus_per_node,
                        "resourcesPerNode": c["resources"]},
            "runtimePatches": [{
                "manager": "packtrain",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                    "name": "node", "template": {"spec": {"template": {"spec": node_pod}}}}]}}},
            }],
        },
    }


def build_job(cfg, nodes: int, gpus_per_node: int, kind: str = "pytorchjob", namespace: str = "kubeflow",
              name: str | None = None) -> list[dict]:
    """[ConfigMap, PyTorchJob|TrainJob] for the RunConfig `cfg` (workdir moved onto the PVC)."""
    import yaml

    if kind not in ("pytorchjob", "trainjob"):
        raise ConfigError(f"--kind {kind!r}: allowed: pytorchjob, trainjob")
    p = cfg.pipeline
    spec = JobSpec(name=name or f"packtrain-{k8s_name(cfg.name)}", image=p.base_image, nodes=nodes,
                   gpus_per_node=gpus_per_node, gpu_type=p.gpu_type, cpu=p.gpu_cpu_request,
                   memory=p.gpu_memory_request, shm_size=p.shm_size, data_pvc=p.data_pvc,
                   mlflow_secret=p.mlflow_secret, namespace=namespace)
    data = cfg.to_dict()
    data["workdir"] = f"{MOUNT_DATA}/{k8s_name(cfg.name)}"
    data["train"]["gpus"] = gpus_per_node   # the ranks per node, as the planner and the run's params see it
    run_yaml = yaml.safe_dump(data, sort_keys=False)
    job = pytorchjob(spec) if kind == "pytorchjob" else trainjob(spec)
    return [config_map(spec, run_yaml), job]


def dump_job(docs: list[dict]) -> str:
    """Multi-document YAML (`kubectl apply -f` takes it as is); multi-line strings as literal blocks."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):  # no &id001 anchors: every replica spelled out
            return True

    def _str(dumper, text):
        style = "|" if "\n" in text else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)

    _Dumper.add_representer(str, _str)
    return "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False) for d in docs)
