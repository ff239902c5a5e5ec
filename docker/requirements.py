"""Print packtrain's third-party requirements (pyproject's [project].dependencies plus the named extras), one a line.

The images install these, pinned by constraints.txt, in a layer of their own before the packtrain wheel, so a change
under src/ rebuilds only the wheel's layers. Standard library only (runs in the bare Python base).
    python docker/requirements.py [EXTRA ...] > requirements.txt
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"docker/requirements.py: unknown extra(s) {unknown}; pyproject.toml has {sorted(optional)}")
    return [*project["dependencies"], *(r for e in extras for r in optional[e])]


if __name__ == "__main__":
    here = Path(sys.argv[0]).resolve().parent
    path = Path("pyproject.toml") if Path("pyproject.toml").exists() else here.parent / "pyproject.toml"
    print("\n".join(requirements(path, sys.argv[1:])))
