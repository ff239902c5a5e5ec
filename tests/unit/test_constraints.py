"""The committed constraints files cover what the Makefile installs with them.

`make setup-airflow` installs constraints-airflow.txt as it is, then packtrain '.[airflow,dev]' under those pins: a
requirement the file misses is resolved freshly there (or, as before, never installed: the Airflow venv once had
no lm-eval, so the default recipe's task suite failed at evaluate after training). Every direct requirement of
packtrain and of the airflow and dev extras must be pinned in it to a version that satisfies it, and so must every
package those need, as far as this venv's metadata knows them (the Airflow stack itself is not installed here).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
SKIP = {"torch", "pip", "setuptools", "wheel"}
"""torch comes from TORCH_SPEC (the CPU wheel); the installers come with the venv (`pip freeze` leaves them out)."""


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line.split("#", 1)[0].strip())
        if m:
            out[canonicalize_name(m[1])] = m[2]
    return out


def _requirements(*extras: str) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs


def _applies(req: Requirement, extra: str = "") -> bool:
    return req.marker is None or req.marker.evaluate({"extra": extra})


def _closure(reqs: list[Requirement]) -> set[str]:
    """The names `reqs` need, transitively through the installed distributions' Requires-Dist (a distribution this
    venv lacks ends its branch); torch's subtree left out."""
    seen: set[str] = set()
    todo = list(reqs)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in SKIP or name in seen:
            continue
        seen.add(name)
        try:
            dist_reqs = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue
        for raw in dist_reqs:
            sub = Requirement(raw)
            if any(_applies(sub, e) for e in ("", *req.extras)):
                todo.append(sub)
    return seen


def test_airflow_constraints_pin_every_requirement_of_the_airflow_install():
    pins = _pins(REPO / "constraints-airflow.txt")
    reqs = [r for r in _requirements("airflow", "dev") if _applies(r) and canonicalize_name(r.name) not in SKIP]
    unpinned = [str(r) for r in reqs if canonicalize_name(r.name) not in pins]
    assert not unpinned, f"constraints-airflow.txt lacks {unpinned}: `make setup-airflow` then `make lock`"
    wrong = [f"{r} (pinned {pins[canonicalize_name(r.name)]})" for r in reqs
             if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not wrong, f"constraints-airflow.txt pins versions packtrain refuses: {wrong}"
    assert {"lm-eval", "accelerate", "datasets", "apache-airflow"} <= set(pins)   # what the task suite imports
    missing = sorted(_closure(reqs) - set(pins))
    assert not missing, f"constraints-airflow.txt lacks packages packtrain's dependencies need: {missing}"


def test_main_constraints_pin_every_requirement_of_the_main_install():
    pins = _pins(REPO / "constraints.txt")
    reqs = [r for r in _requirements("dev", "deepspeed", "fp8") if _applies(r)
            and canonicalize_name(r.name) not in SKIP]
    wrong = [str(r) for r in reqs if canonicalize_name(r.name) not in pins
             or not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not wrong, f"constraints.txt lacks or mis-pins {wrong}: `make lock`"
