"""No module of packtrain unpickles anything, except the one opt-in place (model.allow_pickle).

An AST scan of every file under src/packtrain (imports resolved through their aliases, so `import torch as t;
t.load(p)` counts) refuses:
- `torch.load` / `torch.serialization.load` without `weights_only=True`, and `from torch import load`;
- `numpy.load(..., allow_pickle=<anything but False>)`;
- importing pickle, _pickle, cPickle, cloudpickle, dill, joblib, shelve or marshal;
- `pandas.read_pickle` (any `.read_pickle(...)`), and every `mlflow.<flavor>.load_model` (pyfunc, pytorch,
  sklearn, transformers, …) but the one in packtrain.model.logged_model.load_pickled, which refuses a
  pickle unless model.allow_pickle is true.
The scanner itself is checked on a snippet holding each forbidden form once.
"""

from __future__ import annotations

import ast
from pathlib import Path

import packtrain

SRC = Path(packtrain.__file__).resolve().parent   # the package that runs (PYTHONPATH), not a copy of it
FORBIDDEN_MODULES = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "joblib", "shelve", "marshal"}
ALLOWED = {("model/logged_model.py", "load_pickled", "mlflow.pytorch.load_model")}
"""(file under src/packtrain, enclosing function, call): the opt-in unpickling, gated by model.allow_pickle."""


def _aliases(tree: ast.AST) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _kw(call: ast.Call, name: str):
    for k in call.keywords:
        if k.arg == name:
            return k.value.value if isinstance(k.value, ast.Constant) else "<expr>"
    return "<absent>"


def violations(source: str, rel: str) -> list[str]:
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found = []
    funcs: dict[ast.AST, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(fn):
                funcs.setdefault(inner, fn.name) if inner is not fn else None
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{where}: from {node.module} import ...")
            if node.module in ("torch", "torch.serialization") and any(a.name == "load" for a in node.names):
                found.append(f"{where}: from {node.module} import load")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func, aliases) or ""
            if name in ("torch.load", "torch.serialization.load") and _kw(node, "weights_only") is not True:
                found.append(f"{where}: {name} without weights_only=True")
            elif name in ("numpy.load", "np.load") and _kw(node, "allow_pickle") not in (False, "<absent>"):
                found.append(f"{where}: {name} with allow_pickle={_kw(node, 'allow_pickle')}")
            elif name.endswith(".read_pickle"):
                found.append(f"{where}: {name}")
            elif name.startswith("mlflow.") and name.endswith(".load_model") \
                    and (rel, funcs.get(node), name) not in ALLOWED:
                found.append(f"{where}: {name} (only packtrain.model.logged_model.load_pickled may, gated by "
                             f"model.allow_pickle)")
    return found


def test_no_module_unpickles_outside_the_opt_in():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 100   # the scan sees the whole package
    found = [v for f in files for v in violations(f.read_text(encoding="utf-8"), str(f.relative_to(SRC)))]
    assert found == [], "\n".join(found)
    # the one allowed call is really there (a rename would make the allowance vacuous)
    gated = (SRC / "model" / "logged_model.py").read_text(encoding="utf-8")
    assert [v.split(": ", 1)[1] for v in violations(gated, "elsewhere.py")] == [
        "mlflow.pytorch.load_model (only packtrain.model.logged_model.load_pickled may, gated by model.allow_pickle)"]


def test_the_scan_catches_every_forbidden_form():
    snippet = '''
import pickle
import torch as t
import numpy as np
from joblib import load as jl
from torch import load


def f(p):
    t.load(p)
    t.load(p, weights_only=False)
    t.load(p, weights_only=True)
    np.load(p, allow_pickle=True)
    np.load(p)
    import pandas as pd
    pd.read_pickle(p)
    import mlflow
    mlflow.pytorch.load_model(p)
    mlflow.pyfunc.load_model(p)
'''
    lines = [v.split(": ", 1)[1] for v in violations(snippet, "x.py")]
    assert sorted(lines) == sorted([
        "import pickle", "from joblib import ...", "from torch import load",
        "torch.load without weights_only=True", "torch.load without weights_only=True",
        "numpy.load with allow_pickle=True", "pandas.read_pickle",
        "mlflow.pytorch.load_model (only packtrain.model.logged_model.load_pickled may, gated by model.allow_pickle)",
        "mlflow.pyfunc.load_model (only packtrain.model.logged_model.load_pickled may, gated by model.allow_pickle)",
    ])
