"""Every repository path the docs and the code cite exists: a renamed or deleted file leaves no stale pointer.

Cited = a path starting at a top-level folder of the repository (src/, tests/, bench/, docs/, recipes/, ...) with a
file extension, in README.md, docs/*.md and every .py file of src/, bench/, components/, pipelines/ and tools/.
Not citations: what a command writes (the paths of `--out`, `--candidate` and `cp` in an example command), placeholders in
capitals (tools/images/NAME.txt), and the files the worked example in docs/architecture.md invents (EXAMPLE).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(r"(?<![\w/.-])((?:src|tests|bench|docs|recipes|pipelines|components|docker|tools|\.ci)/"
                   r"[\w./-]*[\w-]\.(?:py|md|yaml|yml|json|txt|sh|png|log|npy|toml|cfg))")
WRITTEN = re.compile(r"(?:--out|--candidate|\bcp(?: \S+)?|>)\s*$")
PLACEHOLDER = re.compile(r"/[A-Z][A-Z_]+\.")
EXAMPLE = {"docs/architecture.md": {"components/dedup.py", "src/packtrain/commands/dedup.py",
                                    "src/packtrain/data/dedup.py", "src/packtrain/stages/dedup.py",
                                    "tests/stages/test_dedup.py"}}
"""The worked example "a dedup stage between ingest and validate" names the files a reader would add."""


def _sources() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for top in ("src", "bench", "components", "pipelines", "tools"):
        files += sorted((ROOT / top).rglob("*.py"))
    return files


def stale_citations() -> dict[str, list[str]]:
    """{cited path: [files citing it]} for every cited path that does not exist."""
    stale: dict[str, list[str]] = {}
    for f in _sources():
        rel = f.relative_to(ROOT).as_posix()
        text = f.read_text(encoding="utf-8", errors="replace")
        for m in CITED.finditer(text):
            path = m.group(1)
            line_start = text.rfind("\n", 0, m.start()) + 1
            if (WRITTEN.search(text[line_start:m.start()]) or PLACEHOLDER.search(path)
                    or path in EXAMPLE.get(rel, ()) or (ROOT / path).exists()):
                continue
            stale.setdefault(path, []).append(rel)
    return stale


def test_every_cited_repository_path_exists():
    stale = stale_citations()
    assert not stale, "stale paths (cited, missing): " + "; ".join(f"{p} in {', '.join(sorted(set(w)))}"
                                                                   for p, w in sorted(stale.items()))


def test_the_check_sees_a_stale_path(tmp_path):
    assert CITED.search("see bench/gate_noise.py for").group(1) == "bench/gate_noise.py"
    assert WRITTEN.search("python -m bench x --out ") and not WRITTEN.search("see ")
    assert PLACEHOLDER.search("tools/images/NAME.txt") and not PLACEHOLDER.search("tools/images/cuda-h200.txt")
