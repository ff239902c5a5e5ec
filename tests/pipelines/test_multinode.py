"""`packtrain pipeline pytorchjob`: multi-node PyTorchJob / TrainJob specs, checked field by field."""

from __future__ import annotations

import pytest
import yaml
from pipeline_helpers import run_cli

from packtrain.config import load_run_config


def _emit(tmp_path, *args):
    out = tmp_path / "job.yaml"
    r = run_cli(["pipeline", "pytorchjob", "--recipe", "1b-h200", "--out", str(out), *args], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return list(yaml.safe_load_all(out.read_text()))


def _check_container(c, gpus, image):
    assert c["image"] == image
    cmd = c["command"]
    assert cmd[0] == "torchrun" and f"--nproc-per-node={gpus}" in cmd
    assert cmd[cmd.index("--no-python") + 1:] == ["packtrain", "train", "--recipe", "/etc/packtrain/run.yaml"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert c["resources"]["requests"]["nvidia.com/gpu"] == gpus
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts == {"/dev/shm": "dshm", "/etc/packtrain": "config", "/workspace": "data"}


@pytest.mark.parametrize("nodes, gpus", [(1, 8), (2, 8), (4, 2)])
def test_pytorchjob_shape(tmp_path, nodes, gpus):
    cm, job = _emit(tmp_path, "--nodes", str(nodes), "--gpus-per-node", str(gpus))
    cfg = load_run_config("1b-h200")
    assert cm["kind"] == "ConfigMap" and cm["apiVersion"] == "v1"
    run_cfg = yaml.safe_load(cm["data"]["run.yaml"])
    assert run_cfg["workdir"] == "/workspace/1b-h200" and run_cfg["model"] == cfg.to_dict()["model"]
    assert run_cfg["train"]["gpus"] == gpus   # ranks per node: the outer torchrun's, nothing relaunched inside
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    assert job["metadata"]["name"] == "packtrain-1b-h200-train"
    spec = job["spec"]
    assert spec["nprocPerNode"] == str(gpus)
    reps = spec["pytorchReplicaSpecs"]
    assert reps["Master"]["replicas"] == 1
    assert reps.get("Worker", {"replicas": 0})["replicas"] == nodes - 1
    assert 1 + reps.get("Worker", {"replicas": 0})["replicas"] == nodes
    for role in reps.values():
        pod = role["template"]["spec"]
        assert role["restartPolicy"] == "OnFailure"
        (c,) = pod["containers"]
        assert c["name"] == "pytorch"  # the operator's required container name
        _check_container(c, gpus, cfg.pipeline.base_image)
        assert f"--nnodes={nodes}" in c["command"]
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
        assert vols["config"]["configMap"]["name"] == cm["metadata"]["name"]
        assert vols["data"]["persistentVolumeClaim"]["claimName"] == cfg.pipeline.data_pvc


def test_trainjob_shape(tmp_path):
    cm, job = _emit(tmp_path, "--nodes", "3", "--gpus-per-node", "4", "--kind", "trainjob")
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    t = job["spec"]["trainer"]
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert t["numNodes"] == 3 and t["numProcPerNode"] == 4
    assert t["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 4
    assert "--nnodes=3" in t["command"]
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    pod = node["template"]["spec"]["template"]["spec"]
    assert {v["name"] for v in pod["volumes"]} == {"dshm", "config", "data"}


def test_gpus_per_node_defaults_to_train_gpus(tmp_path):
    cm, job = _emit(tmp_path, "--nodes", "2", "--set", "train.gpus=4")
    assert job["spec"]["nprocPerNode"] == "4"
    assert yaml.safe_load(cm["data"]["run.yaml"])["train"]["gpus"] == 4


def test_stdout_is_the_default(tmp_path):
    r = run_cli(["pipeline", "pytorchjob", "--nodes", "2", "--gpus-per-node", "1"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(r.stdout)]
    assert kinds == ["ConfigMap", "PyTorchJob"]


@pytest.mark.parametrize("args, fragment", [
    (["--nodes", "0"], "--nodes 0: must be ≥ 1"),
    (["--gpus-per-node", "0"], "--gpus-per-node 0: must be ≥ 1"),
])
def test_bad_sizes_are_clear_errors(tmp_path, args, fragment):
    out = tmp_path / "job.yaml"
    r = run_cli(["pipeline", "pytorchjob", "--out", str(out), *args], cwd=tmp_path)
    assert r.returncode == 2 and fragment in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
