"""No two dataclasses in src/packtrain mirror each other's fields (issue 44).

Two classes that declare the same ≥ MAX_SHARED field names say one thing twice: the shared part belongs in a base
both extend (packtrain.evaluate.promotion.SuiteMargin, packtrain.telemetry.guard.Pace) or in one held by the
other. A field both inherit from one class counts once: extending a base is the fix, not a mirror.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "packtrain"
MAX_SHARED = 5
"""This many field names declared apart in two dataclasses is a mirror."""

NOT_MIRRORS = {
    frozenset({"MemoryPlan", "EvalStats"}): "budget, rows, precision, attention, device: the batch shape a training "
    "step is planned for and the one evaluate measured at, two records of different runs of the model",
    frozenset({"MemoryPlan", "EvaluateResult"}): "EvaluateResult is EvalStats plus the lineage (above)",
}
"""Pairs that share names without saying one thing twice, and why."""

Key = tuple[str, str]   # (module path, class name)


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        f = d.func if isinstance(d, ast.Call) else d
        if (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "") == "dataclass":
            return True
    return False


def _own_fields(node: ast.ClassDef) -> list[str]:
    out = []
    for st in node.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and "ClassVar" not in ast.unparse(
                st.annotation):
            out.append(st.target.id)
    return out


def _classes(src: Path) -> dict[Key, ast.ClassDef]:
    out = {}
    for path in sorted(src.rglob("*.py")):
        mod = str(path.relative_to(src.parent))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                out[(mod, node.name)] = node
    return out


def _base_keys(key: Key, node: ast.ClassDef, classes: dict[Key, ast.ClassDef]) -> list[Key]:
    """The classes `node` extends, found by name: in its own module first, else the one class of that name."""
    keys = []
    for b in node.bases:
        name = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
        if (key[0], name) in classes:
            keys.append((key[0], name))
        else:
            same = [k for k in classes if k[1] == name]
            keys += same[:1] if len(same) == 1 else []
    return keys


def _origins(key: Key, classes: dict[Key, ast.ClassDef], seen: frozenset[Key] = frozenset()) -> dict[str, Key]:
    """Field name → the class that declares it first (its most basic declaring ancestor)."""
    node, out = classes[key], {}
    for base in _base_keys(key, node, classes):
        if base not in seen:
            for f, k in _origins(base, classes, seen | {key}).items():
                out.setdefault(f, k)
    for f in _own_fields(node):
        out.setdefault(f, key)
    return out


def mirrors(src: Path = SRC) -> list[str]:
    """One line per pair of dataclasses under `src` that declare ≥ MAX_SHARED of the same field names apart."""
    classes = _classes(src)
    origins = {k: _origins(k, classes) for k, n in classes.items() if _is_dataclass(n)}
    found = []
    for (a, fa), (b, fb) in itertools.combinations(sorted(origins.items()), 2):
        shared = sorted(f for f in fa.keys() & fb.keys() if fa[f] != fb[f])
        if len(shared) >= MAX_SHARED and frozenset({a[1], b[1]}) not in NOT_MIRRORS:
            found.append(f"{a[0]}:{a[1]} and {b[0]}:{b[1]} both declare {', '.join(shared)}")
    return found


def test_no_dataclass_mirrors_another() -> None:
    found = mirrors()
    assert not found, "dataclasses mirroring another's fields (share them through a base class):\n" + "\n".join(found)


def test_the_scan_finds_a_mirror(tmp_path: Path) -> None:
    (tmp_path / "packtrain").mkdir()
    (tmp_path / "packtrain" / "m.py").write_text(
        "from dataclasses import dataclass\n"
        "@dataclass\nclass A:\n    a: int\n    b: int\n    c: int\n    d: int\n    e: int\n"
        "@dataclass\nclass B:\n    a: int\n    b: int\n    c: int\n    d: int\n    e: int\n    f: int\n"
        "@dataclass\nclass C(A):\n    f: int\n", encoding="utf-8")
    found = mirrors(tmp_path / "packtrain")
    assert len(found) == 2 and all("m.py:B" in f for f in found), found   # A–B and C–B; C extends A: fine
