"""The import graph of src/packtrain and of bench/: imports go one way (no cycles) and no module only re-exports.

Every module under src/packtrain is parsed with `ast` (nothing is imported, so this takes well under a second).
Every `import` / `from ... import` counts as an edge, wherever it stands: at module level, inside a function
(the usual way to hide a cycle), under `if TYPE_CHECKING:` (a type named in a signature is a dependency of
concept even when nothing runs it: gate.report naming gate.compare's Comparison puts report above compare).
Relative imports are resolved against the importing module's package; `from packtrain.gate import compare` is
an edge to the submodule `packtrain.gate.compare` when no name `compare` is bound in the package `__init__`.

How package `__init__` files are treated
----------------------------------------
Python runs `packtrain/gate/__init__.py` before any `packtrain.gate.<sub>`, and a public `__init__` imports
its submodules to re-export their names. Taken literally that makes every submodule that imports a sibling
through the package (`from packtrain.gate import Rule`) part of one big cycle with the `__init__`, which is
noise, not design. So:

  * importing a submodule does not add an edge to its parent packages (the implicit `__init__` run is not an
    edge of the importing module);
  * `from packtrain.gate import Rule` is attributed to the module that defines `Rule`: the `__init__`'s own
    module-level `from X import Rule` is followed (through nested `__init__`s too);
  * a name the `__init__` defines itself (a function, a constant) is an edge to the `__init__`, whose own
    imports (module- or function-level) are then edges out of it, so a real cycle through a package's
    own code is still found.

Only `__init__` files are followed this way: `from packtrain.a import X` where `packtrain.a` is a plain module
that got `X` elsewhere stays an edge to `packtrain.a` (that module is a dependency) and, if it is nothing but
imports, the shim check below reports it.

No import by string
-------------------
An import the graph cannot see is one it cannot check: `importlib.import_module(name)`, `__import__(name)`, a
module `__getattr__` that resolves names lazily, a "pkg.mod:func" string resolved at run time. None of them is
allowed in src/packtrain (`test_no_import_by_string`); import the name, inside a function where start-up time
matters (`packtrain --help`). Asking whether an optional package is installed is not an import:
`importlib.util.find_spec` and `importlib.metadata` stay allowed.

The ratchets
------------
`KNOWN_CYCLES`, `KNOWN_SHIMS` and `KNOWN_REEXPORTS` (names a plain module imports only to hand them on) name
what is left to fix (all empty now). They may only shrink: the tests fail on an entry not listed,
and also on a listed one that is gone (remove it from the set), so the sets cannot go stale. A cycle is listed
as its whole strongly connected component: breaking one edge of a three-module cycle changes the entry.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
ROOT_PACKAGE = "packtrain"
BENCH_PACKAGE = "bench"
"""The benchmark is a package at the repository root (`python -m bench`); its graph is checked for cycles too
(its imports of packtrain are edges out of it, not part of it: packtrain never imports bench)."""

# Import cycles still present (strongly connected components, module names relative to `packtrain.`).
# This set may only shrink: fix a cycle, then delete its entry (the test fails while a fixed cycle stays here).
KNOWN_CYCLES: set[frozenset[str]] = set()

# Modules (not package __init__ files) whose body is only imports / `__all__`: importers should import from the
# real module. May only shrink, like KNOWN_CYCLES.
KNOWN_SHIMS: set[str] = set()

# Names a plain module imports from another packtrain module only to hand them on (it does not use them; another
# module imports them from it, or its __all__ lists them): the partial shims. (module, name); may only shrink.
KNOWN_REEXPORTS: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{_short(self.src)} -> {_short(self.dst)}  ({self.file}:{self.line})"


def _short(module: str) -> str:
    return module.removeprefix(ROOT_PACKAGE + ".")


def discover_modules(src: Path = SRC, package: str = ROOT_PACKAGE) -> dict[str, Path]:
    """{'packtrain.gate.rules': Path(.../gate/rules.py), 'packtrain.gate': Path(.../gate/__init__.py), ...}"""
    modules = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


class ImportGraph:
    def __init__(self, src: Path = SRC, package: str = ROOT_PACKAGE):
        self.src = src
        self.modules = discover_modules(src, package)
        self.trees = {name: ast.parse(path.read_text(), str(path)) for name, path in self.modules.items()}
        self._bindings = {name: self._module_bindings(name) for name in self.modules if self._is_package(name)}
        self.edges = [edge for name in self.modules for edge in self._edges_of(name)]

    def _is_package(self, module: str) -> bool:
        return self.modules[module].name == "__init__.py"

    def _base(self, module: str, node: ast.ImportFrom) -> str:
        """The absolute module a `from ... import` reads from (relative levels resolved)."""
        if not node.level:
            return node.module or ""
        package = module if self._is_package(module) else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{node.module}" if node.module else package

    def _module_bindings(self, package: str) -> dict[str, tuple[str, str | None]]:
        """Names an `__init__` binds at module level → (module it reads from, name there or None = itself)."""
        bindings: dict[str, tuple[str, str | None]] = {}
        for node in self.trees[package].body:
            if isinstance(node, ast.ImportFrom):
                base = self._base(package, node)
                for alias in node.names:
                    bindings[alias.asname or alias.name] = (base, alias.name)
        return bindings

    def origin(self, base: str, name: str, seen: frozenset[str] = frozenset()) -> str | None:
        """The packtrain module `from base import name` really depends on, or None when base is not ours."""
        if base not in self.modules or base in seen:
            return None if base not in self.modules else base
        if self._is_package(base):
            bound = self._bindings[base].get(name)
            if bound is not None:
                target, attr = bound
                if target in self.modules:
                    return self.origin(target, attr, seen | {base}) if attr else target
                return base
            if f"{base}.{name}" in self.modules:
                return f"{base}.{name}"
        return base

    def _edges_of(self, module: str) -> list[Edge]:
        file = str(self.modules[module].relative_to(REPO if self.src == REPO else self.src.parent))
        edges = []
        for node in ast.walk(self.trees[module]):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = alias.name
                    while target and target not in self.modules:
                        target = target.rpartition(".")[0]
                    if target:
                        edges.append(Edge(module, target, file, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = self._base(module, node)
                for alias in node.names:
                    target = self.origin(base, alias.name)
                    if target is not None:
                        edges.append(Edge(module, target, file, node.lineno))
        return [e for e in edges if e.dst != module]

    def cycles(self) -> list[tuple[frozenset[str], list[Edge]]]:
        """Strongly connected components of more than one module, each with the edges inside it."""
        succ: dict[str, set[str]] = {m: set() for m in self.modules}
        for edge in self.edges:
            succ[edge.src].add(edge.dst)
        found = []
        for component in _strongly_connected(succ):
            if len(component) > 1:
                inside = sorted({e for e in self.edges if e.src in component and e.dst in component},
                                key=lambda e: (e.src, e.dst, e.line))
                found.append((frozenset(_short(m) for m in component), inside))
        return sorted(found, key=lambda c: sorted(c[0]))

    def reexports(self) -> list[tuple[str, str]]:
        """(module, name) of plain modules that import `name` from a packtrain module only to re-export it."""
        wanted: set[tuple[str, str]] = set()   # (module, name) some module imports by `from module import name`
        for name, tree in self.trees.items():
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    wanted.update((self._base(name, node), alias.name) for alias in node.names)
        found = []
        for name, tree in self.trees.items():
            if self._is_package(name):
                continue
            used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            listed = _all_names(tree)
            for node in tree.body:
                if not isinstance(node, ast.ImportFrom) or self._base(name, node) not in self.modules:
                    continue
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if bound not in used and (bound in listed or (name, bound) in wanted):
                        found.append((_short(name), bound))
        return sorted(found)

    def shims(self) -> list[str]:
        """Plain modules whose body (docstring aside) is only imports and `__all__`."""
        found = []
        for name, tree in self.trees.items():
            if self._is_package(name):
                continue
            body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
            if body and all(_is_reexport(n) for n in body) and any(
                isinstance(n, ast.Import | ast.ImportFrom) and not _is_future(n) for n in body
            ):
                found.append(_short(name))
        return sorted(found)


def _all_names(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
    return set()


def _is_future(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"


def _is_reexport(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import | ast.ImportFrom):
        return True
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, ast.AnnAssign | ast.AugAssign) else []
    return bool(targets) and all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)


def _strongly_connected(succ: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on long import chains)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(succ):
        if root in index:
            continue
        work = [(root, iter(sorted(succ[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(succ[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components


def _describe(cycles: list[tuple[frozenset[str], list[Edge]]]) -> str:
    return "\n".join(
        f"  {{{', '.join(sorted(members))}}}:\n" + "\n".join(f"      {edge}" for edge in edges)
        for members, edges in cycles
    )


def test_no_import_cycles_beyond_the_known_ones():
    cycles = ImportGraph().cycles()
    new = [c for c in cycles if c[0] not in KNOWN_CYCLES]
    assert not new, (
        "import cycles (function-level imports count too); move the shared piece to the lower module:\n"
        + _describe(new)
    )
    gone = KNOWN_CYCLES - {members for members, _ in cycles}
    assert not gone, f"no longer cycles, remove them from KNOWN_CYCLES (it may only shrink): {sorted(map(sorted, gone))}"


def test_no_import_cycles_in_bench():
    cycles = ImportGraph(REPO, BENCH_PACKAGE).cycles()
    assert not cycles, (
        "import cycles in bench/ (function-level imports count too); move the shared piece to a lower module "
        "(as bench/lora_flops.py holds what bench/suites/lora.py and bench/lora_variants.py share):\n"
        + _describe(cycles)
    )


def test_no_reexport_shims_beyond_the_known_ones():
    shims = set(ImportGraph().shims())
    assert not shims - KNOWN_SHIMS, (
        f"modules that only re-export (import from the real module instead): {sorted(shims - KNOWN_SHIMS)}"
    )
    assert not KNOWN_SHIMS - shims, (
        f"no longer shims, remove them from KNOWN_SHIMS (it may only shrink): {sorted(KNOWN_SHIMS - shims)}"
    )


def test_no_names_reexported_through_plain_modules_beyond_the_known_ones():
    found = set(ImportGraph().reexports())
    assert not found - KNOWN_REEXPORTS, (
        "names imported only to be handed on (import them from the module that defines them): "
        + ", ".join(f"{m}.{n}" for m, n in sorted(found - KNOWN_REEXPORTS))
    )
    assert not KNOWN_REEXPORTS - found, (
        f"no longer re-exported, remove them from KNOWN_REEXPORTS (it may only shrink): {sorted(KNOWN_REEXPORTS - found)}"
    )


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / ROOT_PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_graph_finds_function_level_and_relative_cycles_and_skips_init_reexports(tmp_path):
    src = _write(tmp_path, {
        "__init__.py": "",
        "room/__init__.py": "from packtrain.room.low import Thing\nfrom .high import make\n",
        "room/low.py": "class Thing: ...\n\ndef use():\n    from .high import make\n    return make\n",
        "room/high.py": "from packtrain.room import Thing\n\ndef make():\n    return Thing()\n",
        "other/__init__.py": "",
        "other/a.py": "from packtrain.room import make\n\nMADE = make()\n",  # through the __init__: room.high
        "other/shim.py": '"""Old name."""\nfrom __future__ import annotations\nfrom packtrain.room.low import Thing\n'
                         '__all__ = ["Thing"]\n',
    })
    graph = ImportGraph(src)
    assert {(e.src, e.dst) for e in graph.edges} == {
        ("packtrain.room", "packtrain.room.low"), ("packtrain.room", "packtrain.room.high"),
        ("packtrain.room.low", "packtrain.room.high"), ("packtrain.room.high", "packtrain.room.low"),
        ("packtrain.other.a", "packtrain.room.high"), ("packtrain.other.shim", "packtrain.room.low"),
    }
    [(members, edges)] = graph.cycles()
    assert members == {"room.low", "room.high"}
    where = f"{tmp_path.name}/packtrain/room"   # paths relative to the parent of src (the repo root for real)
    assert [str(e) for e in edges] == [f"room.high -> room.low  ({where}/high.py:1)",
                                       f"room.low -> room.high  ({where}/low.py:4)"]
    assert graph.shims() == ["other.shim"]


def test_graph_keeps_names_defined_in_init(tmp_path):
    src = _write(tmp_path, {
        "__init__.py": "",
        "room/__init__.py": "from packtrain.room.impl import run\n\ndef helper():\n    from packtrain.user import go\n",
        "room/impl.py": "def run(): ...\n",
        "user.py": "from packtrain.room import run, helper\n\ndef go(): ...\n",
    })
    graph = ImportGraph(src)
    assert {(e.src, e.dst) for e in graph.edges} == {
        ("packtrain.user", "packtrain.room.impl"), ("packtrain.user", "packtrain.room"),
        ("packtrain.room", "packtrain.room.impl"), ("packtrain.room", "packtrain.user"),
    }
    assert [members for members, _ in graph.cycles()] == [{"room", "user"}]
    assert graph.shims() == []


# ---- no import by string ---------------------------------------------------------------------------------------

ALLOWED_IMPORTLIB = ("importlib.util", "importlib.metadata")
"""What of importlib src/ may use: whether an optional package is installed (find_spec) and its version."""
_DOTTED_CALLABLE = re.compile(r"^packtrain(\.\w+)+:\w+$")   # "packtrain.registry.apply:apply_registration"


def imports_by_string(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) of every import the graph cannot see: importlib beyond util/metadata, `__import__`, a module
    `__getattr__` (a lazy export resolves names by string), a "packtrain.mod:func" string."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if a.name == "importlib" or (a.name.startswith("importlib.")
                                                   and not a.name.startswith(ALLOWED_IMPORTLIB))]
        elif isinstance(node, ast.ImportFrom) and node.module == "importlib":
            found += [(node.lineno, f"from importlib import {a.name}") for a in node.names
                      if f"importlib.{a.name}" not in ALLOWED_IMPORTLIB]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("importlib."):
            if not node.module.startswith(ALLOWED_IMPORTLIB):
                found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            found.append((node.lineno, "__import__(...)"))
        elif isinstance(node, ast.Attribute) and node.attr == "import_module":
            found.append((node.lineno, "import_module"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED_CALLABLE.match(node.value):
            found.append((node.lineno, repr(node.value)))
    found += [(node.lineno, "module __getattr__") for node in tree.body
              if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"]
    return sorted(found)


def test_no_import_by_string():
    graph = ImportGraph()
    found = [f"{graph.modules[m].relative_to(SRC.parent)}:{line}: {what}"
             for m, tree in graph.trees.items() for line, what in imports_by_string(tree)]
    assert not found, "imports by string (import the name; inside a function where start-up time matters):\n  " + \
        "\n  ".join(found)


@pytest.mark.parametrize(("source", "found"), [
    ("import importlib\nm = importlib.import_module('packtrain.x')\n", ["import importlib", "import_module"]),
    ("from importlib import import_module\n", ["from importlib import import_module"]),
    ("m = __import__('packtrain.x')\n", ["__import__(...)"]),
    ("def __getattr__(name):\n    return name\n", ["module __getattr__"]),
    ("HANDLERS = {'register_model': 'packtrain.registry.apply:apply_registration'}\n",
     ["'packtrain.registry.apply:apply_registration'"]),
    ("import importlib.util\nimport importlib.metadata as md\nfrom importlib import metadata\n"
     "from importlib.metadata import version\nok = importlib.util.find_spec('torchao')\n", []),
    ("class Lazy:\n    def __getattr__(self, name):\n        return name\n", []),   # an object's, not the module's
])
def test_imports_by_string_are_found(source, found):
    assert [what for _, what in imports_by_string(ast.parse(source))] == found
