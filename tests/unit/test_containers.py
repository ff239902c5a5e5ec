"""`packtrain run --runner docker` without a container runtime (tests/pipelines/test_container_run.py runs the real
thing): the preflight refuses before anything runs — no runtime, a workdir the containers' user cannot write —
with an error naming it and the fix, exit 2, no MLflow run; a CPU recipe names only the CPU image; the installed
kfp still calls the function the runner replaces (where kfp 2.17 reports a failed container as SUCCESS)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from packtrain.config import load_run_config
from packtrain.pipeline import containers

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "pipelines"))
from pipeline_helpers import as_args, run_main, tiny_settings  # noqa: E402


def _settings(tmp_path: Path) -> list[str]:
    return tiny_settings(tmp_path / "wd", tmp_path / "corpus")


def test_the_installed_kfp_still_calls_the_replaced_function():
    handler = containers.kfp_hook()
    assert handler.__name__ == "kfp.local.docker_task_handler"


def test_the_runners_podman_settings_are_make_images_ones():
    def settings(text: str) -> list[str]:
        return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]

    assert settings(containers.PODMAN_CONF) == settings((REPO / "docker/podman/containers.conf").read_text())


def test_a_cpu_recipe_names_only_the_cpu_image():
    cfg = load_run_config("tiny-cpu")
    assert containers.pipeline_images(cfg) == ([cfg.pipeline.cpu_image], None)
    gpu = load_run_config("tiny-cpu", ["train.device=cuda"])
    assert containers.pipeline_images(gpu) == ([gpu.pipeline.cpu_image, gpu.pipeline.base_image],
                                               gpu.pipeline.base_image)


def test_the_compiled_dag_of_a_cpu_recipe_asks_for_no_gpu_image(tmp_path):
    """What the kfp and docker runners run (packtrain.pipeline.kfp_local.local_pipeline): every task in the CPU
    image (it was given the PipelineConfig alone, which asks for one train GPU)."""
    import yaml
    from kfp import compiler

    from packtrain.pipeline.kfp_local import local_pipeline

    cfg = load_run_config("tiny-cpu")
    compiler.Compiler().compile(local_pipeline(cfg), str(tmp_path / "ir.yaml"))
    ir = next(yaml.safe_load_all((tmp_path / "ir.yaml").read_text()))
    images = {e["container"]["image"] for e in ir["deploymentSpec"]["executors"].values()}
    assert images == {cfg.pipeline.cpu_image}


@pytest.mark.skipif(Path("/var/run/docker.sock").exists(), reason="a Docker socket is there")
def test_no_container_runtime_is_refused_before_anything_runs(tmp_path, monkeypatch):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    r = run_main(["run", "--runner", "docker", *as_args(_settings(tmp_path))], cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no container runtime: podman is not installed" in r.stderr and "apt-get install podman" in r.stderr
    assert not (tmp_path / "wd" / "mlflow.db").exists() and not (tmp_path / "wd" / "kfp").exists()


def test_a_workdir_the_containers_user_cannot_write_is_refused(tmp_path, monkeypatch):
    wd = tmp_path / "wd"
    wd.mkdir(mode=0o755)
    wd.chmod(0o755)
    other = os.getuid() + 1000
    monkeypatch.setenv(containers.USER_ENV, f"{other}:{other}")
    r = run_main(["run", "--runner", "docker", *as_args(_settings(tmp_path))], cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{wd} (owner {os.getuid()}:{os.getgid()}, mode 755) is not writable by uid {other}" in r.stderr
    assert f"chown -R {other}:{other} {wd}" in r.stderr
    assert sorted(p.name for p in wd.iterdir()) == [".packtrain.lock"], "no MLflow run, log or pipeline root"


def test_a_malformed_container_user_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(containers.USER_ENV, "packtrain")
    r = run_main(["run", "--runner", "docker", *as_args(_settings(tmp_path))], cwd=tmp_path)
    assert r.returncode == 2 and f"{containers.USER_ENV}='packtrain': must be UID or UID:GID" in r.stderr


def test_a_container_that_dies_without_an_error_record_fails_with_its_exit_code(tmp_path):
    """A component killed in its container (SIGKILL: 137) writes no error record: the run fails with the
    container's exit code and names the component — never SUCCESS."""
    import io

    from packtrain.pipeline.kfp_local import KfpLog, _failure

    engine = containers.Engine(url="unix:///nonexistent", workdir=tmp_path, user="0:0",
                               exit_codes={"ingest": 0, "train": 137})
    stream = KfpLog(io.StringIO(), io.StringIO(), False, 10.0, lambda ev: None)
    err = _failure(RuntimeError("Task 'train' finished with status FAILURE"), tmp_path / "none.json", stream, engine)
    assert err.exit_code == 137 and "component 'train' exited with code 137 in its container" in str(err)
