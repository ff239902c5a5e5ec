"""The README and docs quote `packtrain run` as it really is.

- Every sample of its output in README.md and docs/*.md (a code block with a `packtrain run — ` line) is the
  real output: line by line it appears in the session's real run (`tiny_pipeline`) modulo numbers, ids and
  paths, and exactly (modulo paths) in the recorded run bench/results/cpu_run_tiny.json.
- The `make run` timings are that file's numbers, quoted once; no test count is quoted (it changes daily).

Re-record after changing what `packtrain run` prints: `python -m bench cpu-run --out bench/results/cpu_run_tiny.json`,
then paste its output.
"""

from __future__ import annotations

import json
import re

import pytest
from pipeline_helpers import REPO

RECORD = REPO / "bench" / "results" / "cpu_run_tiny.json"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_PATH = re.compile(r"(?<![^\s=(])(?:sqlite:|https?:|file:|/|\.venv/|\.\.?/)\S*")


def _paths(line: str) -> str:
    """Paths and URLs → <path>; the store arguments of a printed command (`--set workdir=…`) dropped."""
    return re.sub(r" --set \S+", "", _PATH.sub("<path>", line.rstrip()))


def _mask(line: str) -> str:
    """Also ids/md5s → <id> and numbers → # (what differs between two real runs)."""
    line = re.sub(r"\b[0-9a-f]{8,32}\b", "<id>", _paths(line))
    return re.sub(r"\d[\d,]*(?:\.\d+)?", "#", line)


def samples() -> list[tuple[str, list[str]]]:
    """(file name, lines) of every fenced block holding `packtrain run`'s output."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", doc.read_text(encoding="utf-8"), re.M | re.S):
            lines = [ln for ln in block.splitlines() if ln.strip()]
            if any(ln.startswith("packtrain run — ") for ln in lines):
                out.append((doc.name, lines))
    return out


def _recorded() -> dict:
    return json.loads(RECORD.read_text(encoding="utf-8"))


def test_samples_are_the_recorded_run():
    found = samples()
    assert {name for name, _ in found} >= {"README.md", "pipeline.md"}
    first = {_paths(ln) for ln in _recorded()["runs"][0]["stdout"]}
    for name, lines in found:
        missing = [ln for ln in lines if _paths(ln) not in first]
        assert not missing, f"{name}: sample lines not in {RECORD.name} (re-record and paste): {missing}"


def test_samples_match_a_real_run_now(tiny_pipeline):
    """The recorded output is not stale: today's `packtrain run` prints the same lines (other numbers)."""
    r = tiny_pipeline["result"]
    assert r.returncode == 0
    real = {_mask(ln) for ln in r.stdout.splitlines()}
    for name, lines in samples():
        stale = [ln for ln in lines if _mask(ln) not in real]
        assert not stale, f"{name}: `packtrain run` no longer prints {stale}; re-record (python -m bench cpu-run)"


@pytest.mark.parametrize("doc", ["README.md", "docs/pipeline.md"])
def test_run_timings_come_from_the_record(doc):
    runs = {r["name"]: r["seconds"] for r in _recorded()["runs"]}
    allowed = {f"{runs['first']:.1f}", f"{runs['cached']:.1f}"}
    text = (REPO / doc).read_text(encoding="utf-8")
    for line in text.splitlines():
        if re.search(r"make run|second run|^packtrain run — ", line):
            quoted = set(re.findall(r"(\d+(?:\.\d+)?) s\b", line))
            assert quoted <= allowed, f"{doc}: {line!r} quotes {quoted - allowed}, the record says {allowed}"
    assert not re.search(r"\d[\d,]* (tests )?passed", text), f"{doc} quotes a test count"
