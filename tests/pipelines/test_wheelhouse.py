"""`python tools/wheelhouse.py` for real, against PyPI: Python 3.12 manylinux, an image that already has every pin
but a handful (antlr4-python3-runtime: only an sdist; pydantic-core: a compiled cp312 wheel; requests-oauthlib and
click-didyoumean beside the image's requests and click), then the documented install line into a `--target`.
Skips when PyPI cannot be reached (the CI and development machines reach it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[2]
KEEP = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "requests-oauthlib", "oauthlib",
        "click-didyoumean", "antlr4-python3-runtime")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=5):
            return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _pypi_reachable(), reason="PyPI (https://pypi.org) is not reachable: the "
                                "wheelhouse test downloads real wheels")


def _pins() -> dict[str, str]:
    pins = {}
    for f in ("constraints.txt", "constraints-gpu.txt"):     # the wheelhouse reads both by default
        for line in (REPO / f).read_text().splitlines():
            if line.split("#", 1)[0].strip():
                name, version = line.split("#", 1)[0].strip().split("==")
                pins[canonicalize_name(name)] = version
    return pins


def _installs_on_cp312_manylinux(tag: Tag) -> bool:
    py_ok = tag.interpreter in ("py3", "cp312") or (tag.abi == "abi3" and tag.interpreter in
                                                     {f"cp3{m}" for m in range(2, 13)})
    return py_ok and (tag.platform == "any" or re.fullmatch(r"manylinux(1|2014|_2_\d+)_x86_64", tag.platform)
                      is not None)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheelhouse")
    pins = _pins()
    assert set(KEEP) <= set(pins) and {"requests", "click"} <= set(pins)
    image = tmp / "image.txt"
    others = [n for n in pins if n not in KEEP]
    # half as `pip freeze` lines, half bare names: both forms of an image list
    image.write_text("\n".join(f"{n}=={pins[n]}" if i % 2 else n for i, n in enumerate(others)) + "\n")
    out = tmp / "wh"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "wheelhouse.py"), "--python", "3.12",
                           *(a for p in PLATFORMS for a in ("--platform", p)), "--exclude", str(image),
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout, pins


def test_wheels_are_cp312_manylinux_one_version_each_and_exactly_the_missing_ones(built):
    out, _, pins = built
    files = sorted(out.glob("*.whl"))
    names = [canonicalize_name(parse_wheel_filename(f.name)[0]) for f in files]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted([*KEEP, "packtrain"])
    for f in files:
        name, version, _, tags = parse_wheel_filename(f.name)
        assert any(_installs_on_cp312_manylinux(t) for t in tags), f.name
        if name != "packtrain":
            assert str(version) == pins[canonicalize_name(name)]
    assert "torch" not in names and "requests" not in names and "click" not in names
    (core,) = [f for f in files if f.name.startswith("pydantic_core-")]
    assert "cp312" in core.name and "manylinux" in core.name   # a compiled wheel for the target, not this Python's


def test_manifest_and_report_agree_with_the_files(built):
    out, stdout, _ = built
    manifest = json.loads((out / "wheelhouse.json").read_text())
    rows = {r["name"]: r for r in manifest["wheels"]}
    assert set(rows) == {*KEEP, "packtrain"}
    for r in rows.values():
        f = out / r["file"]
        assert f.stat().st_size == r["bytes"] and len(r["sha256"]) == 64
    total = sum(r["bytes"] for r in rows.values())
    assert manifest["total_bytes"] == total and manifest["python"] == "3.12"
    assert f"{len(rows)} wheels, {total / 1e6:.1f} MB" in stdout
    assert "largest: " in stdout and "missing: none" in stdout


def test_the_documented_line_installs_them_into_a_target(built, tmp_path):
    out, _, _ = built
    site = tmp_path / "site"
    # the line of docs/install.md; on another Python than the target's, pip is told the target's tags (pydantic-core
    # is a cp312 wheel), and only the pure-Python packages are imported
    here = sys.version_info[:2] == (3, 12)
    tags = [] if here else ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
                            *(a for p in PLATFORMS for a in ("--platform", p))]
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade",
                           "--target", str(site), *tags, *map(str, sorted(out.glob("*.whl")))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = ("import antlr4, oauthlib, requests_oauthlib, packtrain, pydantic_core; import sys; "
             "print(antlr4.__file__, packtrain.__file__, pydantic_core.__file__)") if here else \
            "import antlr4, oauthlib, requests_oauthlib, packtrain; print(antlr4.__file__, packtrain.__file__)"
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(p.startswith(str(site)) for p in proc.stdout.split()), proc.stdout
