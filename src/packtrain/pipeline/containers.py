"""`packtrain run --runner docker`: the compiled KFP DAG through kfp.local's DockerRunner, every task in the image
the pipeline names for it, over the Docker API — Docker's daemon, or podman's (`podman system service`, started
on a private socket for the run when DOCKER_HOST is unset and podman is installed).

Failures are seen. kfp 2.17's DockerRunner starts containers with `auto_remove=True` and reads a container it can
no longer find as exit code 0, so a fast-failing component passes (kubeflow/pipelines #13332). For the run,
packtrain puts its own function in the one place kfp calls (`kfp.local.docker_task_handler.run_docker_container`):
create, start, stream the logs, wait for the exit code, remove. `kfp_hook()` checks that kfp still calls that
function before anything runs, so a kfp that moved it fails the run naming the kfp version, instead of silently
bringing back SUCCESS-for-failure (tests/unit/test_containers.py checks the installed kfp).

Preflight, before any stage and before the MLflow parent run (nothing half-run is registered):
- a container runtime: DOCKER_HOST, else podman, else /var/run/docker.sock — none: an error naming podman and
  how to install it;
- every image the tasks name (the CPU image; the GPU image only when the recipe trains on a GPU) in the local
  image store — else an error naming the image and `make images`;
- the workdir (mounted at its own path: it holds the pipeline root <workdir>/kfp, the MLflow store, the stage
  cache) writable by the user the containers run as — else an error naming it, its owner and the fix. A local
  ingest.source outside it is mounted read-only at its own path.

Who the containers run as: the invoking user (`--user UID:GID`), so what the stages write is owned as the rest of
the workdir; the images' entrypoint keeps that uid (docker/entrypoint.sh). Under rootless podman the user namespace
is `keep-id`, which maps that uid to itself. The images' own default user (uid 1000) is what a cluster runs;
PACKTRAIN_CONTAINER_USER=UID:GID picks another (it must be able to write the workdir).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtrain.errors import ConfigError, PacktrainError

USER_ENV = "PACKTRAIN_CONTAINER_USER"
"""UID[:GID] the component containers run as (default: this process's uid:gid)."""

PODMAN_CONF = """\
# written by packtrain's container runner for its podman service (CONTAINERS_CONF unset); docker/podman/containers.conf
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
"""The settings `make images` uses (docker/podman/containers.conf, checked equal by a test): runc + cgroupfs work
on hosts with hybrid cgroups, where crun refuses to start containers."""

# what crosses into a component's container from this process's environment (the rest stays here: no credentials)
_PASS_ENV_PREFIXES = ("PACKTRAIN_",)
_PASS_ENV = ("MLFLOW_TRACKING_URI", "TQDM_MININTERVAL", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_KEEP_IMAGE_ENV = ("PACKTRAIN_CODE_VERSION",)   # the image's own: its code, not the checkout's


class ContainerError(PacktrainError):
    """The container runtime, an image or the workdir is not usable for a container run (exit code 2)."""

    exit_code = 2


@dataclass
class Engine:
    """A Docker API endpoint for one run: its URL, the podman service started for it (if any), the user the
    containers run as and the directory they share with this process."""

    url: str
    workdir: Path
    user: str
    userns: str | None = None
    gpu_image: str | None = None
    read_only: list[Path] = field(default_factory=list)
    exit_codes: dict[str, int] = field(default_factory=dict)
    _service: subprocess.Popen | None = None
    _tmp: str | None = None

    def client(self):
        from docker.client import DockerClient

        return DockerClient(base_url=self.url, timeout=600)

    def close(self) -> None:
        if self._service is not None and self._service.poll() is None:
            self._service.send_signal(signal.SIGTERM)
            try:
                self._service.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._service.kill()
                self._service.wait()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


def _start_podman_service(podman: str) -> tuple[str, subprocess.Popen, str]:
    """`podman system service` on a socket in a fresh private directory; waits until it answers (≤ 30 s)."""
    tmp = tempfile.mkdtemp(prefix="packtrain-podman-")
    sock = Path(tmp) / "podman.sock"
    env = dict(os.environ)
    if "CONTAINERS_CONF" not in env:
        conf = Path(tmp) / "containers.conf"
        conf.write_text(PODMAN_CONF)
        env["CONTAINERS_CONF"] = str(conf)
    with open(Path(tmp) / "service.log", "w") as log:   # the service's own output, read on failure
        proc = subprocess.Popen([podman, "system", "service", "--time=0", f"unix://{sock}"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            detail = (Path(tmp) / "service.log").read_text()[-2000:]
            shutil.rmtree(tmp, ignore_errors=True)
            raise ContainerError(f"`podman system service` exited with code {proc.returncode}:\n{detail}")
        if sock.exists():
            return f"unix://{sock}", proc, tmp
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
    raise ContainerError("`podman system service` did not open its socket within 30 s")


def _die_with_parent():
    """A preexec_fn for the service: SIGTERM it when this process dies (even by SIGKILL), so no podman service
    outlives the run (Linux prctl PR_SET_PDEATHSIG; elsewhere None, and Engine.close is the only stop). libc is
    looked up here, in the parent: the child runs only the call (no import after fork)."""
    import ctypes

    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)   # 1: PR_SET_PDEATHSIG


def _endpoint() -> tuple[str, subprocess.Popen | None, str | None]:
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"], None, None
    podman = shutil.which("podman")
    if podman:
        return _start_podman_service(podman)
    if Path("/var/run/docker.sock").exists():
        return "unix:///var/run/docker.sock", None, None
    raise ContainerError(
        "--runner docker: no container runtime: podman is not installed, DOCKER_HOST is unset and there is no "
        "/var/run/docker.sock. Fix: install podman (Debian/Ubuntu: apt-get install podman runc; `make images` "
        "installs it when run as root), or point DOCKER_HOST at a Docker or podman API socket.")


def _container_user() -> str:
    user = os.environ.get(USER_ENV, "").strip()
    if not user:
        return f"{os.getuid()}:{os.getgid()}"
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        raise ConfigError(f"{USER_ENV}={user!r}: must be UID or UID:GID (numbers), e.g. 1000:1000")
    return f"{uid}:{gid or uid}"


def writable_by(path: Path, uid: int, gid: int) -> bool:
    """Whether uid:gid may create files in the directory `path`, by its owner and mode bits (root: always).

    >>> import tempfile; d = Path(tempfile.mkdtemp()); d.chmod(0o755)
    >>> writable_by(d, 0, 0), writable_by(d, d.stat().st_uid, 1), writable_by(d, d.stat().st_uid + 1, 12345)
    (True, True, False)
    """
    if uid == 0:
        return True
    st = path.stat()
    if st.st_uid == uid:
        return bool(st.st_mode & 0o200) and bool(st.st_mode & 0o100)
    if st.st_gid == gid:
        return bool(st.st_mode & 0o020) and bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o002) and bool(st.st_mode & 0o001)


def check_writable(workdir: Path, user: str) -> None:
    """The workdir and its pipeline root (and every directory under it the stages write into) writable by
    `user` — else a ContainerError naming the first one that is not, its owner and the fix."""
    uid, gid = (int(x) for x in user.split(":"))
    dirs = [workdir, *(p for p in (workdir / "kfp", workdir / "cache", workdir / "logs") if p.is_dir())]
    for d in dirs:
        if not writable_by(d, uid, gid):
            st = d.stat()
            raise ContainerError(
                f"--runner docker: {d} (owner {st.st_uid}:{st.st_gid}, mode {st.st_mode & 0o7777:o}) is not "
                f"writable by uid {uid}, the user the component containers run as (they write the pipeline root "
                f"{workdir / 'kfp'} and the MLflow store there). Fix: `chown -R {uid}:{gid} {workdir}`, or run as "
                f"the workdir's owner ({USER_ENV}={st.st_uid}:{st.st_gid}).")


def check_images(client, images: list[str]) -> None:
    """Every image present in the engine's local store (nothing is pulled: a run uses what `make images` built)."""
    import docker.errors

    missing = []
    for image in images:
        try:
            client.images.get(image)
        except (docker.errors.ImageNotFound, docker.errors.NotFound):
            missing.append(image)
        except docker.errors.APIError as e:   # podman answers 500 where Docker says 404
            if "image not known" in str(e) or "no such image" in str(e).lower():
                missing.append(image)
            else:
                raise
    if missing:
        raise ContainerError(
            f"--runner docker: image(s) {', '.join(missing)} not in the local image store. Fix: `make images` "
            f"(builds them with podman), or set pipeline.cpu_image / pipeline.base_image to images you have.")


def pipeline_images(cfg) -> tuple[list[str], str | None]:
    """The images the compiled pipeline's tasks name for this recipe, and the GPU one (None for a CPU recipe:
    train.device cpu never asks for the GPU image)."""
    from packtrain.pipeline.kfp_ops import accelerators

    cpu = cfg.pipeline.image(gpu=False)
    gpu = cfg.pipeline.image(gpu=True) if accelerators(cfg) > 0 else None
    return [cpu, *([gpu] if gpu and gpu != cpu else [])], gpu


def input_paths(cfg, workdir: Path) -> list[Path]:
    """Local inputs outside the workdir the stages read (ingest.source): mounted read-only at their own path."""
    src = getattr(cfg.ingest, "source", None)
    if not src or "://" in str(src):
        return []
    path = Path(str(src)).expanduser().resolve()
    if not path.exists() or path.is_relative_to(workdir):
        return []
    return [path]


@contextlib.contextmanager
def open_engine(cfg, workdir: Path) -> Iterator[Engine]:
    """The preflight of the module doc, then an Engine for the run (its podman service stopped on exit)."""
    kfp_hook()
    user = _container_user()
    check_writable(workdir, user)
    images, gpu = pipeline_images(cfg)
    url, service, tmp = _endpoint()
    engine = Engine(url=url, workdir=workdir, user=user, gpu_image=gpu, read_only=input_paths(cfg, workdir),
                    _service=service, _tmp=tmp)
    try:
        client = engine.client()
        try:
            info = client.info()
            rootless = any("rootless" in str(o) for o in info.get("SecurityOptions") or [])
            if rootless and os.getuid() != 0:
                engine.userns = "keep-id"
            check_images(client, images)
        finally:
            client.close()
        yield engine
    finally:
        engine.close()


def kfp_hook():
    """kfp.local's docker task handler, checked to still call `run_docker_container` by name (the function this
    runner replaces for a run); a ContainerError naming the kfp version otherwise."""
    import kfp
    from kfp.local import docker_task_handler as handler

    run = getattr(getattr(handler, "DockerTaskHandler", None), "run", None)
    if not callable(getattr(handler, "run_docker_container", None)) or run is None \
            or "run_docker_container" not in run.__code__.co_names:
        raise ContainerError(
            f"--runner docker: kfp {kfp.__version__} no longer runs containers through "
            "kfp.local.docker_task_handler.run_docker_container, where packtrain waits for a container's exit code; "
            "use --runner kfp, or kfp 2.17 (constraints.txt)")
    return handler


def _environment(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if (k.startswith(_PASS_ENV_PREFIXES) or k in _PASS_ENV) and k not in _KEEP_IMAGE_ENV}
    return {**env, **(extra or {})}


def run_container(engine: Engine, client, image: str, command: list[str], environment: dict[str, str] | None = None,
                  task: str = "") -> int:
    """One component: create its container (the workdir mounted at its own path, the working directory, the
    run's user), start it, print its output as it comes, wait for its exit code, remove it. Returns the code."""
    import docker.errors
    import docker.types

    kw: dict[str, Any] = {}
    if engine.userns:
        kw["userns_mode"] = engine.userns
    if engine.gpu_image and image == engine.gpu_image:
        kw["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    wd = str(engine.workdir)
    volumes = {wd: {"bind": wd, "mode": "rw"}, **{str(p): {"bind": str(p), "mode": "ro"} for p in engine.read_only}}
    container = client.containers.create(
        image=image, command=command, user=engine.user, working_dir=wd, environment=_environment(environment),
        volumes=volumes, detach=True, **kw)
    try:
        container.start()
        for chunk in container.logs(stream=True, follow=True):
            print(chunk.decode(errors="replace"), end="", flush=True)
        code = int(container.wait()["StatusCode"])
    finally:
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)
    if task:
        engine.exit_codes[task] = code
    return code


@contextlib.contextmanager
def docker_runner(engine: Engine):
    """kfp.local's DockerRunner with this module's `run_container` in kfp's place (module doc) for the block."""
    from kfp import local

    handler = kfp_hook()
    original = handler.run_docker_container

    def run_docker_container(client, image: str, command: list[str], volumes, **run_args) -> int:
        env = run_args.get("environment")
        task = _task_of(command)
        return run_container(engine, client, image, command, dict(env) if env else None, task)

    handler.run_docker_container = run_docker_container
    try:
        yield local.DockerRunner()
    finally:
        handler.run_docker_container = original


def _task_of(command: list[str]) -> str:
    """The component's function name from its command (`--function_to_execute NAME`), for exit-code records."""
    for i, part in enumerate(command[:-1]):
        if part == "--function_to_execute":
            return command[i + 1]
    return ""
