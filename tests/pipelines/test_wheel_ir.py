"""The pipeline as a cluster runs it, from the built wheel alone: build the wheel from the rooms the images copy,
install it into a fresh venv with no source tree beside it, compile the KFP IR from the installed package, then
execute every component of that IR with exactly the command and arguments its container spec states — the
executor input (`{{$}}`) filled with artifact paths in a temp dir, the fresh venv's python first on PATH, the cwd
outside the repository — chaining each task's output artifacts into the next in DAG order, as the KFP launcher
does between pods. The train task runs with train.gpus=2: its stage launches two gloo ranks (packtrain.train.launch)
inside the "pod", as it would on a 2-GPU node.

Third-party packages come from .venv through a .pth file holding its site-packages path as a plain line (such a
line only extends sys.path: .venv's editable-install finder .pth is not executed), so `import packtrain`
resolves to the wheel, which the test asserts. MLflow is sqlite in tmp (the cluster's secret would name a server),
an empty store copied in first (conftest seed_mlflow_store: its creation is not the subject here, and its ~70
schema migrations were ~4 CPU-s of the first component).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from graphlib import TopologicalSorter
from pathlib import Path

import pytest
import yaml
from pipeline_helpers import REPO, tiny_corpus, tiny_settings

pytestmark = pytest.mark.slow

ROOMS = ("pyproject.toml", "README.md", "src", "recipes", "components", "pipelines")
"""What docker/Dockerfile*'s wheel stage copies (tests/pipelines/test_docker.py checks the same list)."""
RUN_ID = "wheel-ir-0001"

COMPILE = r'''
import json, sys
import packtrain, packtrain.components, packtrain.pipelines
from packtrain.config import load_run_config, recipe_dir
from packtrain.pipeline.kfp_ops import compile_pipeline, pipeline_arguments
cfg = load_run_config("tiny-cpu", json.loads(sys.argv[1]))
compile_pipeline("ir.yaml", cfg)
compile_pipeline("ir-default.yaml", load_run_config("tiny-cpu"), packtrain.__version__)   # as committed
json.dump({"args": pipeline_arguments(cfg), "packtrain": packtrain.__file__, "recipes": str(recipe_dir()),
           "components": packtrain.components.__file__, "sys_path": sys.path}, open("compiled.json", "w"))
'''


def _build_wheel(tmp: Path) -> Path:
    src = tmp / "src-copy"
    src.mkdir()
    for room in ROOMS:
        if (REPO / room).is_dir():
            shutil.copytree(REPO / room, src / room,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
        else:
            shutil.copy2(REPO / room, src / room)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--wheel-dir", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = (tmp / "dist").glob("packtrain-*.whl")
    return whl


def _fresh_venv(tmp: Path, whl: Path) -> tuple[Path, Path]:
    """(python, site-packages) of a new venv holding only the wheel, then .venv's third-party packages."""
    venv = tmp / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # the wheel first, while the venv sees nothing else: pip must not find (and replace) .venv's editable packtrain
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                        "--no-index", str(whl)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "zz_third_party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py, site


def _pod_env(venv_bin: Path, mlflow_uri: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PACKTRAIN_", "MLFLOW_", "KFP_", "PYTHON", "VIRTUAL_ENV"))}
    return {**env, "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(venv_bin.parent),
            "MLFLOW_TRACKING_URI": mlflow_uri,          # what the secret mlflow-credentials provides in a pod
            "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _artifact(name: str, schema: dict, uri: str, metadata: dict | None = None) -> dict:
    return {"artifacts": [{"name": name, "type": schema, "uri": uri, "metadata": metadata or {}}]}


def _executor_input(comp: dict, task: dict, pipeline_args: dict, produced: dict, root: Path) -> dict:
    """The ExecutorInput a KFP launcher would hand this task (`{{$}}`), with local paths for artifact URIs."""
    params = {}
    for name, v in task["inputs"].get("parameters", {}).items():
        if "componentInputParameter" in v:
            params[name] = pipeline_args[v["componentInputParameter"]]
        else:
            constant = v["runtimeValue"]["constant"]
            params[name] = RUN_ID if constant == "{{$.pipeline_job_uuid}}" else constant
    for name, d in comp.get("inputDefinitions", {}).get("parameters", {}).items():
        if name not in params and "defaultValue" in d:
            params[name] = d["defaultValue"]
    arts = {}
    for name, v in task["inputs"].get("artifacts", {}).items():
        src = v["taskOutputArtifact"]
        arts[name] = produced[(src["producerTask"], src["outputArtifactKey"])]
    outs = comp["outputDefinitions"]
    return {
        "inputs": {"parameterValues": params, "artifacts": arts},
        "outputs": {
            "parameters": {p: {"outputFile": str(root / p)} for p in outs.get("parameters", {})},
            "artifacts": {a: _artifact(a, d["artifactType"], str(root / a)) for a, d in outs["artifacts"].items()},
            "outputFile": str(root / "executor_output.json"),
        },
    }


def test_every_ir_component_runs_from_the_installed_wheel(tmp_path, seed_mlflow_store):
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    whl = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(whl).namelist())
    packages = {p.parent.relative_to(REPO / "src").as_posix() for p in (REPO / "src" / "packtrain").rglob("__init__.py")}
    assert {f"{p}/__init__.py" for p in packages} <= names, "pyproject's packages list misses a package"
    assert {f"packtrain/recipes/{p.name}" for p in (REPO / "recipes").glob("*.yaml")} <= names
    assert {"packtrain/components/train.py", "packtrain/pipelines/kfp_pipeline.py",
            "packtrain/pipelines/packtrain_pipeline.yaml"} <= names

    py, site = _fresh_venv(tmp_path, whl)
    pod = tmp_path / "pod"      # the cwd of every step: nothing of the checkout beside it
    pod.mkdir()
    corpus = tiny_corpus(tmp_path / "corpus", n_docs=40)
    settings = tiny_settings(tmp_path / "wd", corpus) + ["train.gpus=2", "train.threads=1"]
    env = _pod_env(py.parent, f"sqlite:///{seed_mlflow_store(tmp_path / 'mlflow.db')}")
    r = subprocess.run([str(py), "-c", COMPILE, json.dumps(settings)], cwd=pod, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((pod / "compiled.json").read_text())
    for key in ("packtrain", "components", "recipes"):   # the wheel, not the checkout
        assert Path(info[key]).is_relative_to(site), (key, info[key])
    checkout = [REPO, REPO / "src", REPO / "components", REPO / "pipelines"]
    assert not [p for p in info["sys_path"] if (pod / p).resolve() in checkout]   # '' is the cwd: pod
    assert (pod / "ir-default.yaml").read_text() == (REPO / "pipelines" / "packtrain_pipeline.yaml").read_text()

    spec = next(yaml.safe_load_all((pod / "ir.yaml").read_text()))   # then the platform (kubernetes) doc
    tasks = spec["root"]["dag"]["tasks"]
    order = list(TopologicalSorter({t: set(v.get("dependentTasks", [])) for t, v in tasks.items()}).static_order())
    produced: dict[tuple[str, str], dict] = {}
    outputs: dict[str, dict] = {}
    for name in order:
        task = tasks[name]
        comp = spec["components"][task["componentRef"]["name"]]
        container = spec["deploymentSpec"]["executors"][comp["executorLabel"]]["container"]
        root = tmp_path / "artifacts" / name
        root.mkdir(parents=True)
        exe = _executor_input(comp, task, info["args"], produced, root)
        json_format.ParseDict(exe, pipeline_spec_pb2.ExecutorInput())   # a well-formed ExecutorInput
        argv = [*container["command"], *[json.dumps(exe) if a == "{{$}}" else a for a in container["args"]]]
        assert not [a for a in argv if "{{$" in a], f"{name}: an unfilled placeholder"
        r = subprocess.run(argv, cwd=pod, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
        out = json.loads((root / "executor_output.json").read_text())
        for art, d in comp["outputDefinitions"]["artifacts"].items():
            meta = out.get("artifacts", {}).get(art, {}).get("artifacts", [{}])[0].get("metadata", {})
            produced[(name, art)] = _artifact(art, d["artifactType"], str(root / art), meta)
        outputs[name] = json.loads(out["parameterValues"]["Output"])

    assert set(outputs) == set(tasks)
    assert outputs["validate"]["success"] is True
    train = outputs["train"]
    assert train["setup"]["world_size"] == 2 and train["steps"] == 2   # two gloo ranks inside the train "pod"
    assert [r["rank"] for r in train["memory"]["per_rank"]] == [0, 1]
    assert (tmp_path / "artifacts" / "train" / "model" / "model" / "config.json").is_file()
    assert outputs["evaluate"]["perplexity"] > 1
    assert outputs["register"]["version"] == "1"

    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("packtrain").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("packtrain.pipeline_run") == RUN_ID]
    stage_runs = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in stage_runs) == sorted(tasks)   # one train run, from rank 0 only
