"""The images and the container runner for real (podman, no mocks): `make test-containers`, which `.ci/run` runs
after `make test`; skipped unless PACKTRAIN_CONTAINER_TESTS=1 (it needs podman as root and builds an image).

1. `docker/build-images.sh cpu` builds the CPU image (cached layers reused), labelled with the checkout's sha.
2. One component (ingest) runs in that image with the compiled IR's exact command and args
   (pipelines/packtrain_pipeline.yaml), its executor input written as kfp writes it; its outputs land in the
   mounted directory.
3. `packtrain run --runner docker` runs the whole tiny pipeline with every task in its container: exit 0, every
   stage done, the model registered.
4. A component made to fail (validate with an impossible min_rows) fails the run with its exit code (4) and its
   own message — kfp's DockerRunner alone reported it SUCCESS.
5. Bad input, each a clear error naming it and the fix, non-zero exit, no MLflow run: an image that is not in the
   local store; a mount the image's user cannot write (the entrypoint's check).
Times (2 cores): docs/install.md, Images.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml
from pipeline_helpers import REPO, as_args, run_main, tiny_corpus, tiny_settings

import packtrain

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PACKTRAIN_CONTAINER_TESTS") != "1",
                       reason="the container tests: make test-containers (PACKTRAIN_CONTAINER_TESTS=1, podman)"),
]

CONF = REPO / "docker" / "podman" / "containers.conf"


def _podman(*args: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONF))}
    r = subprocess.run(["podman", *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check:
        assert r.returncode == 0, f"podman {' '.join(args)}: {r.stdout[-2000:]}{r.stderr[-3000:]}"
    return r


def _registry() -> dict[str, str]:
    rows = [ln.split() for ln in (REPO / "docker/registry.txt").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]
    return {dockerfile: image for image, dockerfile in rows}


CPU_IMAGE = _registry()["docker/Dockerfile.cpu"]


@pytest.fixture(scope="module")
def cpu_image():
    """The CPU image built from this checkout; returns (image, the sha it was built at)."""
    assert shutil.which("podman"), "podman is not installed (make test-containers installs it as root)"
    sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                         text=True).stdout.strip()
    r = subprocess.run(["bash", "docker/build-images.sh", "cpu"], cwd=REPO, capture_output=True, text=True,
                       timeout=1800, env={**os.environ, "GIT_SHA": sha})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return CPU_IMAGE, sha


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("containers")
    tiny_corpus(root / "wd" / "corpus")   # inside the workdir: the one directory the containers share
    return root


def test_the_image_is_labelled_with_the_checkouts_sha(cpu_image):
    cpu_image, sha = cpu_image
    labels = json.loads(_podman("image", "inspect", "--format", "{{json .Labels}}", cpu_image).stdout)
    assert labels["org.opencontainers.image.revision"] == sha
    env = _podman("image", "inspect", "--format", "{{json .Config.Env}}", cpu_image).stdout
    assert f"PACKTRAIN_CODE_VERSION={packtrain.__version__}+g{sha}" in env
    assert labels["io.packtrain.image"] == cpu_image
    user = _podman("image", "inspect", "--format", "{{.Config.User}}", cpu_image).stdout.strip()
    assert user == "1000:1000"


def test_one_component_runs_with_the_compiled_irs_command(cpu_image, root):
    """ingest, as a pod runs it: the IR's command + args, `{{$}}` replaced by the executor input."""
    cpu_image, _ = cpu_image
    from packtrain.config import load_run_config
    from packtrain.pipeline.kfp_ops import config_json

    ir = next(yaml.safe_load_all((REPO / "pipelines/packtrain_pipeline.yaml").read_text()))
    spec = ir["deploymentSpec"]["executors"]["exec-ingest"]["container"]
    assert spec["image"] == cpu_image
    wd = root / "one"
    out = wd / "kfp" / "one-run" / "ingest"
    out.mkdir(parents=True)
    tiny_corpus(wd / "corpus")
    cfg = load_run_config("tiny-cpu", tiny_settings(wd, wd / "corpus"))
    outputs = ir["components"]["comp-ingest"]["outputDefinitions"]
    executor_input = {
        "inputs": {"parameterValues": {"config": config_json(cfg), "code_version": "container-test",
                                       "data_version": "", "kfp_run_id": "one-run"}},
        "outputs": {
            "artifacts": {name: {"artifacts": [{"name": name, "type": a["artifactType"], "uri": str(out / name),
                                                "metadata": {}}]}
                          for name, a in outputs["artifacts"].items()},
            "parameters": {"Output": {"outputFile": str(out / "Output")}},
            "outputFile": str(out / "executor_output.json")}}
    args = [json.dumps(executor_input) if a == "{{$}}" else a for a in spec["args"]]
    r = _podman("run", "--rm", "--user", f"{os.getuid()}:{os.getgid()}", "-v", f"{wd}:{wd}", "-w", str(wd),
                "-e", f"MLFLOW_TRACKING_URI=sqlite:///{wd}/mlflow.db", cpu_image, *spec["command"], *args)
    written = sorted(p.name for p in out.iterdir())
    assert "executor_output.json" in written, (written, r.stdout[-2000:], r.stderr[-2000:])
    stats = json.loads(json.loads((out / "executor_output.json").read_text())["parameterValues"]["Output"])
    assert stats["documents"] == 60 and stats["code_version"] == "container-test", stats
    assert (out / "documents").is_dir() and any((out / "documents").iterdir())


def test_the_whole_pipeline_runs_in_containers(cpu_image, root):
    wd = root / "wd"
    r = run_main(["run", "--runner", "docker", *as_args(tiny_settings(wd, wd / "corpus")), "--json",
                  str(root / "run.json")], cwd=root)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    record = json.loads((root / "run.json").read_text())
    assert record["runner"] == "docker"
    assert list(record["stages"]) == ["ingest", "validate", "tokenize", "pack", "train", "evaluate", "register"]
    assert record["stages"]["train"]["steps"] == 2
    assert record["stages"]["register"].get("version") is not None, record["stages"]["register"]


def test_a_failing_component_fails_the_run_with_its_code_and_message(cpu_image, root):
    """validate in its container fails (min_rows far above the corpus): exit 4 and validate's own message,
    where kfp's DockerRunner reported SUCCESS; nothing after validate ran."""
    wd = root / "wd"
    settings = [*tiny_settings(wd, wd / "corpus"), "validate.min_rows=10000000"]
    before = set((wd / "kfp").glob("packtrain-*"))
    r = run_main(["run", "--runner", "docker", *as_args(settings)], cwd=root)
    assert r.returncode == 4, r.stdout[-3000:] + r.stderr[-3000:]
    assert "stage validate failed" in r.stderr and "row_count (observed 60)" in r.stderr, r.stderr[-3000:]
    new = set((wd / "kfp").glob("packtrain-*")) - before
    assert new and not any((run / "tokenize").exists() for run in new)


def test_an_image_not_in_the_local_store_is_refused(cpu_image, root):
    wd = root / "missing"
    settings = [*tiny_settings(wd, root / "wd" / "corpus"), "pipeline.cpu_image=localhost/packtrain-cpu:absent"]
    r = run_main(["run", "--runner", "docker", *as_args(settings)], cwd=root)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "localhost/packtrain-cpu:absent not in the local image store" in r.stderr and "make images" in r.stderr
    assert not (wd / "mlflow.db").exists() and not (wd / "kfp").exists()


def test_a_mount_the_images_user_cannot_write_is_a_clear_error(cpu_image, root):
    cpu_image, _ = cpu_image
    mount = root / "root-owned"
    mount.mkdir(mode=0o755)
    os.chown(mount, 0, 0) if os.getuid() == 0 else None
    r = _podman("run", "--rm", "-v", f"{mount}:/workspace", cpu_image, "packtrain", "--help", check=False)
    assert r.returncode == 73, r.stdout + r.stderr
    assert "/workspace (owner 0:0, mode 755) is not writable by uid 1000" in r.stderr
    assert "--user 0:0" in r.stderr and "chown 1000:1000" in r.stderr
    assert list(mount.iterdir()) == []
