"""What a wheelhouse ships, decided offline: the pins, the image's package list, the target's tags and markers,
and the walk over Requires-Dist from packtrain's roots (minus the `--without` groups) that keeps what it reaches.

    pins = read_all_pins([constraints.txt, constraints-gpu.txt]); image = read_image_packages(image.txt)
    select(packtrain_roots(own, ("kfp",), target.markers), wheels, image, target.markers).keep → {name: extras}

No pip and no network here: tools/wheelhouse.py fetches and builds the wheels, then asks this module which of them
go. A build tool's part, like it: packtrain never imports this file.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name

NEVER = frozenset({"torch"})
"""Never carried: the image's own (CUDA) torch is the one packtrain must run on."""
EXTRAS = ("dev", "deepspeed", "fp8", "gpu")
"""packtrain's extras a wheelhouse carries: the ones `make setup` installs (pinned in constraints.txt) and gpu
(pinned in constraints-gpu.txt: liger-kernel needs triton, which a CPU venv must not get). airflow has its own."""


@dataclass(frozen=True)
class Group:
    """A part of packtrain's requirements that `--without` can cut (an extra's requirements come from the wheel)."""

    why: str
    """what it serves, for --help"""
    cut: tuple[str, ...] = ()
    """core requirements of packtrain it removes"""
    keep: tuple[str, ...] = ()
    """packages that become roots when it goes: the part of the cut packages packtrain still imports"""


GROUPS: dict[str, Group] = {
    "dev": Group("the dev extra: pytest, mypy, ruff, hadolint, the Kubeflow job models"),
    "deepspeed": Group("the deepspeed extra: train.engine=deepspeed"),
    "fp8": Group("the fp8 extra: torchao for train.precision=fp8"),
    "gpu": Group("the gpu extra: liger-kernel for train.loss=fused with train.loss_kernel=liger"),
    "lm-eval": Group("lm-eval and its closure: only .yaml task suites (evaluate.suites) import it", ("lm-eval",)),
    "kfp": Group("kfp: --runner kfp, `pipeline compile|submit`; `packtrain run` runs in-process by default",
                 ("kfp", "kfp-kubernetes")),
    "mlflow-server": Group("the full mlflow wheel (its UI, 12 MB of JavaScript; `mlflow server`) and what only it "
                           "needs; runs still log to sqlite through mlflow-skinny's store", ("mlflow",),
                           ("mlflow-skinny", "sqlalchemy", "alembic")),
}
PLATFORMS = (*(f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)), "manylinux2014_x86_64",
             "manylinux2010_x86_64", "manylinux1_x86_64")
"""pip matches each manylinux_2_N exactly (no "N or older"), so the default names every N from glibc 2.39 (Ubuntu
24.04, the CUDA image) down to 2.17, and the legacy aliases."""


class WheelhouseError(Exception):
    """A package could not be fetched, built or placed; the message names it."""


def normalize(name: str) -> str:
    """PEP 503: `Ruamel.YAML` → `ruamel-yaml`, `typing_extensions` → `typing-extensions`."""
    return canonicalize_name(name)


def read_pins(path: Path) -> dict[str, str]:
    """constraints.txt → {normalized name: version}; every line must be an exact `name==version` pin."""
    pins: dict[str, str] = {}
    for no, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if not m:
            raise WheelhouseError(f"{path}:{no}: {raw.strip()!r} is not an exact pin (allowed: name==version)")
        name = normalize(m[1])
        if name in pins and pins[name] != m[2]:
            raise WheelhouseError(f"{path}:{no}: {name} pinned twice ({pins[name]} and {m[2]}): keep one version")
        pins[name] = m[2]
    return pins


def read_image_packages(path: Path) -> dict[str, str | None]:
    """The image's package list → {normalized name: version or None}. Accepts one name a line, `pip freeze`
    output (`Name==1.0`, `name @ file:///...`) and `pip list` output (a `Package Version` table, `name 1.0` rows);
    `#` starts a comment. E.g. "requests\\nPyYAML==6.0.2\\n" → {"requests": None, "pyyaml": "6.0.2"}."""
    packages: dict[str, str | None] = {}
    for no, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or set(line) <= {"-", " "} or line.split()[:2] == ["Package", "Version"]:
            continue
        if "==" in line:
            name, version = (s.strip() for s in line.split("==", 1))
        elif " @ " in line:
            name, version = line.split(" @ ", 1)[0].strip(), None
        else:
            name, *rest = line.split()
            version = rest[0].strip("()") if rest else None
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name):
            raise WheelhouseError(f"{path}:{no}: {raw.strip()!r} is not a package name (allowed: one name a line, "
                                  "`pip freeze` or `pip list` output)")
        packages[normalize(name)] = version
    return packages


def read_all_pins(paths: Iterable[Path]) -> dict[str, str]:
    """The pins of several files merged; one name pinned to two versions across them is an error naming both."""
    pins: dict[str, str] = {}
    for path in paths:
        for name, version in read_pins(path).items():
            if pins.get(name, version) != version:
                raise WheelhouseError(f"{path}: {name}=={version}, but an earlier constraints file pins "
                                      f"{pins[name]}: keep one version")
            pins[name] = version
    return pins


@dataclass(frozen=True)
class Target:
    """The interpreter and platforms the wheels are for."""

    python: tuple[int, int]
    platforms: tuple[str, ...]

    @property
    def tags(self) -> frozenset[Tag]:
        abi = f"cp{self.python[0]}{self.python[1]}"
        return frozenset([*cpython_tags(self.python, [abi], self.platforms),
                          *compatible_tags(self.python, abi, self.platforms)])

    @property
    def markers(self) -> dict[str, str]:
        """PEP 508 environment of the target (Linux CPython), for the wheels' Requires-Dist markers."""
        version = f"{self.python[0]}.{self.python[1]}"
        arch = self.platforms[0].split("_", 3)[-1] if self.platforms[0].startswith("manylinux_") else "x86_64"
        return {**{k: str(v) for k, v in default_environment().items()}, "python_version": version, "python_full_version": f"{version}.0",
                "implementation_name": "cpython", "platform_python_implementation": "CPython",
                "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "platform_machine": arch}

    def pip_args(self) -> list[str]:
        abi = f"cp{self.python[0]}{self.python[1]}"
        return ["--python-version", f"{self.python[0]}.{self.python[1]}", "--implementation", "cp",
                "--abi", abi, "--abi", "abi3", *(a for p in self.platforms for a in ("--platform", p))]


@dataclass(frozen=True)
class Wheel:
    """One wheel file and what its METADATA says."""

    path: Path
    name: str
    version: str
    requires: tuple[Requirement, ...]

    @classmethod
    def read(cls, path: Path) -> Wheel:
        with zipfile.ZipFile(path) as z:
            meta = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
            headers = HeaderParser().parsestr(z.read(meta).decode("utf-8"))
        return cls(path, normalize(headers["Name"]), headers["Version"],
                   tuple(Requirement(r) for r in headers.get_all("Requires-Dist") or []))

    def needs(self, extras: Iterable[str], env: Mapping[str, str]) -> list[Requirement]:
        """Requirements active on the target when installed with `extras`."""
        envs = [{**env, "extra": e} for e in ("", *extras)]
        return [r for r in self.requires if r.marker is None or any(r.marker.evaluate(e) for e in envs)]


@dataclass
class Selection:
    """What a set of roots reaches: wheels to ship, and requirements nothing provides."""

    keep: dict[str, set[str]] = field(default_factory=dict)
    """name → extras it is needed with"""
    unmet: dict[str, str] = field(default_factory=dict)
    """requirement name → who needs it (neither pinned nor in the image)"""
    conflicts: list[str] = field(default_factory=list)
    """`who needs name<spec>, the image has version`"""


def select(roots: Iterable[Requirement], wheels: Mapping[str, Wheel], image: Mapping[str, str | None],
           env: Mapping[str, str]) -> Selection:
    """Walk Requires-Dist from `roots` through `wheels` (by normalized name); a name the image has stops the walk
    (its version checked when known), torch too. E.g. roots [a], a → [b, requests], image {requests}: keep {a, b}."""
    sel = Selection()
    todo = [(r, "the roots") for r in roots]
    while todo:
        req, who = todo.pop()
        name = normalize(req.name)
        if name in NEVER:
            continue
        if name in image:
            have = image[name]
            if have is not None and not req.specifier.contains(have, prereleases=True):
                sel.conflicts.append(f"{who} needs {name}{req.specifier}, the image has {have}")
            continue
        if name not in wheels:
            sel.unmet.setdefault(name, who)
            continue
        known = sel.keep.get(name)
        if known is not None and set(req.extras) <= known:
            continue
        extras = sel.keep.setdefault(name, set())
        extras.update(req.extras)
        w = wheels[name]
        todo += [(r, f"{w.name} {w.version}") for r in w.needs(extras, env)]
    return sel


def packtrain_roots(own: Wheel, without: Iterable[str], env: Mapping[str, str]) -> list[Requirement]:
    """packtrain's requirements with the extras of EXTRAS, minus the groups in `without` (plus their `keep`s).
    E.g. without ("kfp", "mlflow-server"): no kfp, kfp-kubernetes, mlflow; mlflow-skinny, sqlalchemy, alembic."""
    dropped = [GROUPS[g] for g in without]
    cut = {normalize(n) for g in dropped for n in g.cut}
    kept = own.needs([e for e in EXTRAS if e not in without], env)
    return [r for r in kept if normalize(r.name) not in cut] + [Requirement(n) for g in dropped for n in g.keep]
