"""Every repository path the docs and the code cite exists: a renamed or deleted file leaves no stale pointer.

Cited = a path starting at a top-level folder of the repository (src/, tests/, bench/, docs/, recipes/, ...) with a
file extension, anywhere in: README.md, docs/, bench/'s .md pages; every .py file (docstrings, comments, strings)
of src/, bench/, components/, pipelines/, tools/ and tests/; the Makefile, pyproject.toml, dvc.yaml, docker/,
recipes/ and .ci/. Not checked: bench/results/history/ and the recorded JSON and logs (what was true then), and
this file (its examples are stale on purpose).
Not citations: what a command writes (the paths of `--out`, `--candidate` and `cp` in an example command), placeholders in
capitals (tools/images/NAME.txt), the files the worked example in docs/architecture.md invents (EXAMPLE), and
paths that recorded data holds (RECORDED).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(r"(?<![\w/.-])((?:src|tests|bench|docs|recipes|pipelines|components|docker|tools|\.ci)/"
                   r"[\w./-]*[\w-]\.(?:py|md|yaml|yml|jsonl|json|txt|sh|png|log|npy|toml|cfg)(?![\w-]))")
WRITTEN = re.compile(r"(?:--out|--candidate|\bcp(?: \S+)?|>)\s*$")
PLACEHOLDER = re.compile(r"/[A-Z][A-Z_]+\.")
EXAMPLE = {"docs/architecture.md": {"components/dedup.py", "src/packtrain/commands/dedup.py",
                                    "src/packtrain/data/dedup.py", "src/packtrain/stages/dedup.py",
                                    "tests/stages/test_dedup.py"}}
"""The worked example "a dedup stage between ingest and validate" names the files a reader would add."""
RECORDED = {"tests/unit/test_gate_metrics.py": {"bench/gate_noise.py"}}
"""The command bench/baselines/noise-*.json's sessions were measured with (the suite's path then), which that test
accepts as it stands in the records."""


def _sources() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *(p for p in sorted((ROOT / "bench").rglob("*.md")) if "history" not in p.parts)]
    for top in ("src", "bench", "components", "pipelines", "tools", "tests"):
        files += sorted((ROOT / top).rglob("*.py"))
    files += [ROOT / name for name in ("Makefile", "pyproject.toml", "dvc.yaml")]
    files += sorted(p for top in ("docker", "recipes", ".ci") for p in (ROOT / top).rglob("*")
                    if p.is_file() and p.suffix not in (".jsonl", ".json"))
    return [f for f in files if f.is_file() and f != Path(__file__).resolve()]


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
                    or path in EXAMPLE.get(rel, ()) or path in RECORDED.get(rel, ()) or (ROOT / path).exists()):
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


def test_the_check_reads_tests_recipes_and_the_build_files():
    rel = {f.relative_to(ROOT).as_posix() for f in _sources()}
    assert {"tests/unit/test_import_graph.py", "recipes/retrain-cpu.yaml", "Makefile", "pyproject.toml",
            "dvc.yaml", "docker/Dockerfile", "bench/results/GPU_RESULTS.template.md"} <= rel
    assert "tests/unit/test_doc_paths.py" not in rel and not any("/history/" in r for r in rel)
