#!/usr/bin/env python3
"""Build a wheelhouse: every wheel packtrain needs that a base image lacks, for a host with no package registry.

    python tools/wheelhouse.py --exclude tools/images/cuda-h200.txt --out .whl-h200 [--only-runtime]
    # there, with no network:
    python3 -m pip install --no-index --no-deps --upgrade --target /opt/packtrain-site .whl-h200/*.whl
    export PYTHONPATH=/opt/packtrain-site PATH=/opt/packtrain-site/bin:$PATH

Each pin of constraints.txt minus the image's packages (exact PEP 503 names: `requests` keeps `requests-oauthlib`),
never torch, plus packtrain's own wheel; one version of each. One `pip download --no-deps` for the target's tags
(a wheel, else the sdist), one `pip wheel --no-build-isolation` over the sdists; every file's tags and every
requirement of what ships checked; `--without GROUP` keeps what packtrain still reaches once the group is cut.
Built in a temporary folder beside `--out`, which appears only when all of it worked, with wheelhouse.json. Exit 1
naming the package that could not be fetched or built. docs/install.md has the details and the sizes.

This file drives pip and writes the wheelhouse; which wheels ship (the pins, the image's list, the target's tags,
the walk over Requires-Dist, the `--without` groups) is decided offline in tools/wheelhouse_select.py beside it.

A build tool, not part of the library: pip is driven as a command, and packtrain never imports this file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename
from wheelhouse_select import (
    GROUPS,
    NEVER,
    PLATFORMS,
    Target,
    Wheel,
    WheelhouseError,
    normalize,
    packtrain_roots,
    read_all_pins,
    read_image_packages,
    select,
)

REPO = Path(__file__).resolve().parents[1]
GPU_CONSTRAINTS = REPO / "constraints-gpu.txt"
"""The gpu extra's pins; read beside --constraints unless --no-gpu-pins (they are never installed here)."""
RUNTIME_DROPS = ("dev", "lm-eval", "kfp", "mlflow-server")
"""`--only-runtime`: what `packtrain run` on a GPU host does without (deepspeed and fp8 stay: train engines)."""
ROOMS = ("pyproject.toml", "README.md", "src", "recipes", "components", "pipelines")
"""What packtrain's wheel is built from (the same list as docker/ and tests/pipelines/test_wheel_ir.py)."""


def _pip(args: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def _progress(msg: str, t0: float) -> None:
    print(f"[{time.perf_counter() - t0:5.0f} s] {msg}", file=sys.stderr, flush=True)


def fetch(pins: Mapping[str, str], dest: Path, target: Target) -> list[Path]:
    """Download every pin into `dest` in one pip call: its wheel for the target where the index has one, else its
    sdist (`--no-deps` lifts pip's `--only-binary` rule for foreign targets; wheels of the pinned version rank
    first). Returns the sdists. An sdist's metadata is read with this interpreter (`--no-build-isolation`: its
    setuptools, and its torch, which deepspeed's setup.py imports). On a failure, one call per missing pin names it."""
    args = ["download", "-q", "--no-deps", "--no-build-isolation", "--progress-bar", "off", *target.pip_args(),
            "-d", str(dest)]
    reqs = dest.parent / "requirements.txt"
    reqs.write_text("".join(f"{n}=={v}\n" for n, v in pins.items()), encoding="utf-8")
    if (p := _pip([*args, "-r", str(reqs)])).returncode != 0:
        for n, v in pins.items():
            if not _files_of(dest, n) and (q := _pip([*args, f"{n}=={v}"])).returncode != 0:
                raise WheelhouseError(f"{n}=={v}: cannot be fetched for Python {target.python[0]}."
                                      f"{target.python[1]} {target.platforms[0]}...:\n{q.stderr[-3000:]}")
        raise WheelhouseError(f"pip download failed:\n{p.stderr[-3000:]}")
    return sorted(f for f in dest.iterdir() if f.suffix != ".whl")


def _files_of(folder: Path, name: str) -> list[Path]:
    """The wheels and sdists of `name` in `folder` (sdist names: name-version.tar.gz, any separator and case)."""
    def dist_name(f: Path) -> str:
        if f.suffix == ".whl":
            return str(parse_wheel_filename(f.name)[0])
        return re.sub(r"-[^-]+(\.tar\.gz|\.zip)$", "", f.name)
    return [f for f in folder.iterdir() if f.is_file() and normalize(dist_name(f)) == name]


def build_sdists(sdists: list[Path], dest: Path) -> None:
    """`pip wheel` each downloaded sdist into `dest` (one call; on failure one each, to name the package)."""
    if not sdists:
        return
    base = ["wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dest)]
    if _pip([*base, *map(str, sdists)]).returncode == 0:
        return
    for s in sdists:
        if (p := _pip([*base, str(s)])).returncode != 0:
            raise WheelhouseError(f"{s.name}: the target has no wheel of it, and its sdist does not build here:\n"
                                  f"{p.stderr[-3000:]}")


def build_own_wheel(dest: Path, scratch: Path) -> Path:
    """packtrain's wheel from a copy of its rooms (pip builds in-tree: a copy keeps build/ out of the checkout)."""
    src = scratch / "packtrain-src"
    for room in ROOMS:
        if (REPO / room).is_dir():
            shutil.copytree(REPO / room, src / room, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / room, src / room)
    p = _pip(["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest), str(src)])
    if p.returncode != 0 or not (found := [f for f in _files_of(dest, "packtrain") if f.suffix == ".whl"]):
        raise WheelhouseError(f"packtrain: its own wheel does not build:\n{p.stderr[-3000:]}")
    return found[0]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"




def build(constraints: Path | list[Path], image_files: list[Path], out: Path, target: Target,
          without: tuple[str, ...]) -> dict[str, Any]:
    """The whole build; returns the manifest written to out/wheelhouse.json. `constraints`: one pins file or
    several (merged, read_all_pins)."""
    files = [constraints] if isinstance(constraints, Path) else list(constraints)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise WheelhouseError(f"--out {out}: exists and is not an empty folder (choose a new one; nothing is "
                              "overwritten)")
    for f in (*files, *image_files):
        if not f.is_file():
            raise WheelhouseError(f"{f}: no such file (--constraints / --exclude)")
    pins = read_all_pins(files)
    image: dict[str, str | None] = {}
    for f in image_files:
        image.update(read_image_packages(f))
    wanted = {n: v for n, v in pins.items() if n not in image and n not in NEVER}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{out.name}.tmp-", dir=out.parent) as tmp:
        scratch = Path(tmp)
        fetched = scratch / "wheels"
        fetched.mkdir()
        t0 = time.perf_counter()
        _progress(f"pip download: {len(wanted)} of {len(pins)} pins (the rest are in the image, or torch)", t0)
        sdists = fetch(wanted, fetched, target)
        _progress(f"pip wheel from sdists: {', '.join(s.name for s in sdists) or 'none'}", t0)
        build_sdists(sdists, fetched)
        _progress("packtrain's own wheel", t0)
        own = Wheel.read(build_own_wheel(fetched, scratch))
        _progress("checking tags, versions and requirements", t0)
        wheels: dict[str, Wheel] = {}
        for path in sorted(fetched.glob("*.whl")):
            w = Wheel.read(path)
            if not target.tags & parse_wheel_filename(path.name)[3]:
                built = any(f.suffix != ".whl" for f in _files_of(fetched, w.name))
                raise WheelhouseError(f"{w.name} {w.version}: {path.name} does not install on cp"
                                      f"{target.python[0]}{target.python[1]} {target.platforms[0]}..."
                                      + (" (the index has no wheel for it; this one was built here from its sdist)"
                                         if built else ""))
            if w.name in wheels:
                raise WheelhouseError(f"{w.name}: two versions ({wheels[w.name].path.name}, {path.name})")
            wheels[w.name] = w
        if missing := sorted(set(wanted) - set(wheels)):
            raise WheelhouseError(f"{', '.join(missing)}: pinned but no wheel came back")
        env = target.markers
        roots = packtrain_roots(own, without, env)   # without a cut: every pin is a root as well
        sel = select(roots if without else [*roots, *(Requirement(n) for n in wanted)], wheels, image, env)
        if sel.unmet:
            raise WheelhouseError("needed but neither pinned in the constraints nor in the image: " + ", ".join(
                f"{n} (required by {who})" for n, who in sorted(sel.unmet.items())))
        keep = sorted({*sel.keep, "packtrain"})
        sizes = {n: w.path.stat().st_size for n, w in wheels.items()}
        staged = scratch / "out"
        staged.mkdir()
        rows: list[dict[str, Any]] = []
        for n in keep:
            f = Path(shutil.move(wheels[n].path, staged / wheels[n].path.name))
            rows.append({"name": n, "version": wheels[n].version, "file": f.name, "bytes": f.stat().st_size,
                         "sha256": _sha256(f)})
        manifest = {
            "python": f"{target.python[0]}.{target.python[1]}", "platforms": list(target.platforms),
            "constraints": [str(f) for f in files], "exclude": [str(f) for f in image_files], "without": list(without),
            "wheels_count": len(rows), "total_bytes": sum(r["bytes"] for r in rows),
            "all_groups": {"wheels_count": len(wheels), "total_bytes": sum(sizes.values())},
            "dropped": sorted(set(wheels) - set(keep)), "conflicts": sorted(set(sel.conflicts)), "wheels": rows,
        }
        (staged / "wheelhouse.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        if out.exists():
            out.rmdir()   # checked empty above
        shutil.move(staged, out)
    return manifest


def report(manifest: dict[str, Any], out: Path) -> str:
    rows = manifest["wheels"]
    lines = [f"wheelhouse {out}: {len(rows)} wheels, {_mb(manifest['total_bytes'])} (Python {manifest['python']}, "
             f"{manifest['platforms'][0]}...)"]
    if manifest["without"]:
        full = manifest["all_groups"]
        lines.append(f"  without {', '.join(manifest['without'])}: {len(manifest['dropped'])} wheels dropped; with "
                     f"every group: {full['wheels_count']} wheels, {_mb(full['total_bytes'])}")
    lines.append("  largest: " + ", ".join(f"{r['name']} {_mb(r['bytes'])}" for r in
                                           sorted(rows, key=lambda r: -r["bytes"])[:10]))
    lines.append("  missing: none (every requirement is in the image or here)")
    for c in manifest["conflicts"]:
        lines.append(f"  warning: {c} (the image's copy is used; carry this package to change that)")
    lines.append(f"  install there: python3 -m pip install --no-index --no-deps --upgrade --target SITE {out}/*.whl"
                 " && export PYTHONPATH=SITE")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default="3.12", help="target interpreter, MAJOR.MINOR (default 3.12)")
    ap.add_argument("--platform", action="append", help="wheel platform tag, repeatable (default: manylinux_2_39 "
                    "... 2_17, manylinux2014/2010/1, x86_64)")
    ap.add_argument("--exclude", action="append", type=Path, default=[], metavar="FILE",
                    help="the image's packages: one name a line, or `pip list`/`pip freeze` output (repeatable)")
    ap.add_argument("--constraints", type=Path, default=REPO / "constraints.txt", help="the pins (default: the "
                    "repository's constraints.txt)")
    ap.add_argument("--no-gpu-pins", action="store_true", help="leave out constraints-gpu.txt (the gpu extra: "
                    "liger-kernel) — for a target without CUDA")
    ap.add_argument("--out", type=Path, required=True, help="new or empty folder for the wheels")
    ap.add_argument("--without", nargs="+", default=[], choices=GROUPS, metavar="GROUP",
                    help="drop a group and what only it needs: "
                    + "; ".join(f"{n}: {g.why}" for n, g in GROUPS.items()))
    ap.add_argument("--only-runtime", action="store_true", help=f"= --without {' '.join(RUNTIME_DROPS)}")
    a = ap.parse_args(argv)
    m = re.fullmatch(r"(\d+)\.(\d+)", a.python)
    if not m:
        ap.error(f"--python {a.python!r}: expected MAJOR.MINOR, e.g. 3.12")
    target = Target((int(m[1]), int(m[2])), tuple(a.platform or PLATFORMS))
    without = tuple(dict.fromkeys([*a.without, *(RUNTIME_DROPS if a.only_runtime else ())]))
    try:
        gpu = [] if a.no_gpu_pins or not GPU_CONSTRAINTS.is_file() else [GPU_CONSTRAINTS]
        if a.no_gpu_pins and "gpu" not in without:
            without = (*without, "gpu")
        manifest = build([a.constraints, *gpu], a.exclude, a.out, target, without)
    except WheelhouseError as e:
        print(f"wheelhouse: {e}", file=sys.stderr)
        return 1
    print(report(manifest, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
