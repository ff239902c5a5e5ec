"""Size limits of the library and the benchmark (house style: "modules around 400 lines at most", "the training
loop reads in one screen"): no module of src/packtrain or bench/ over 400 lines, no function or method over 80
lines unless its docstring says why, on a line of its own starting "Long because:".

A function's length runs from its first decorator (or `def`) to its last line, docstring and comments
included; a nested function counts in its parent and on its own. The lists below name what is still over and
owned by a change in flight; an entry that fits again must leave its list (the last test says which).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("src/packtrain", "bench")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
REASON = "Long because:"

LONG_MODULES: frozenset[str] = frozenset()
LONG_FUNCTIONS = frozenset({   # "path:qualified name"
})


def python_files(repo: Path = REPO) -> list[Path]:
    return sorted(p for root in ROOTS for p in (repo / root).rglob("*.py"))


def long_modules(files: list[Path], repo: Path = REPO) -> dict[str, int]:
    """{repo-relative path: lines} of every module over MAX_MODULE_LINES."""
    out = {}
    for p in files:
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES:
            out[p.relative_to(repo).as_posix()] = n
    return out


def long_functions(path: Path, rel: str) -> dict[str, tuple[int, int]]:
    """{"rel:Qual.name": (first line, lines)} of every function or method of `path` over MAX_FUNCTION_LINES
    whose docstring gives no reason (a line starting REASON)."""
    out: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    n = (child.end_lineno or child.lineno) - first + 1
                    doc = ast.get_docstring(child) or ""
                    reasoned = any(line.strip().startswith(REASON) for line in doc.splitlines())
                    if n > MAX_FUNCTION_LINES and not reasoned:
                        out[f"{rel}:{name}"] = (first, n)
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return out


def all_long_functions(files: list[Path], repo: Path = REPO) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for p in files:
        out.update(long_functions(p, p.relative_to(repo).as_posix()))
    return out


def test_no_module_over_the_limit():
    over = {k: v for k, v in long_modules(python_files()).items() if k not in LONG_MODULES}
    assert not over, (f"modules over {MAX_MODULE_LINES} lines (split by concept into well-named modules): "
                      + ", ".join(f"{k} ({v} lines)" for k, v in sorted(over.items())))


def test_no_function_over_the_limit_without_a_reason():
    over = {k: v for k, v in all_long_functions(python_files()).items() if k not in LONG_FUNCTIONS}
    shown = []
    for key, (line, n) in sorted(over.items()):
        path, name = key.split(":")
        shown.append(f"{path}:{line} {name} ({n} lines)")
    assert not over, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps, or say why in "
                      f"the docstring on a line starting {REASON!r}): " + ", ".join(shown))


def test_the_lists_hold_only_what_is_still_over():
    files = python_files()
    fits = sorted((LONG_MODULES - set(long_modules(files))) | (LONG_FUNCTIONS - set(all_long_functions(files))))
    assert not fits, f"within the limits now: remove from this test's lists: {fits}"


def test_scan_counts_decorators_methods_nested_functions_and_reasons(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    (tmp_path / "m.py").write_text(
        f"@staticmethod\ndef long():\n{body}"            # 1 decorator + def + 80 lines = 82
        f"def fits():\n{body[: -len('    x79 = 79')-1]}"     # def + 79 lines = 80
        f'def reasoned():\n    """Says why.\n\n    Long because: one table.\n    """\n{body}'
        "class C:\n    def method(self):\n" + body.replace("    ", "        ")
        + "def outer():\n    def inner():\n" + body.replace("    ", "        "),
        encoding="utf-8")
    found = long_functions(tmp_path / "m.py", "m.py")
    assert found == {"m.py:long": (1, 82), "m.py:C.method": (found["m.py:C.method"][0], 81),
                     "m.py:outer": (found["m.py:outer"][0], 82), "m.py:outer.inner": (found["m.py:outer"][0] + 1, 81)}


@pytest.mark.parametrize("lines,over", [(400, False), (401, True)])
def test_module_limit_is_400_lines(tmp_path, lines, over):
    (tmp_path / "src" / "packtrain").mkdir(parents=True)
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "m.py").write_text("x = 1\n" * lines, encoding="utf-8")
    assert bool(long_modules(python_files(tmp_path), tmp_path)) is over
