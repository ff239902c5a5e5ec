"""Every stage's publish step under faults: ingest, validate, tokenize, pack, evaluate on tiny data.

For each stage, starting from a previous output directory (hash of every file taken first):
- a natural failure (bad input, failed suite, no training documents...) and an injected exception at the last
  moment before the commit leave the previous output byte-identical, with no staging directory left;
- a `packtrain <stage>` process of its own (forked from this one, tests/forked.py: a real pid that the fault
  SIGKILLs, without a fresh interpreter's imports of GX, tokenizers, transformers) SIGKILLed at a seeded random
  point of its publish step (PACKTRAIN_FAULT=publish@N, packtrain.publish.publish_dir) ends with exactly the
  complete previous output or the complete new one, as the point it died at says; a rerun then succeeds and
  removes the leftovers.
Seeds are in the test ids (`pack-seed9`): point = random.Random(seed).randrange(number of publish points).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from forked import run_forked

from packtrain import publish
from packtrain.cli import main
from packtrain.data.token_store import TokenStore
from packtrain.packing.store import PackStore
from packtrain.publish import FAULT_ENV
from packtrain.testing.tiny_model import build_tiny_model_dir, write_tiny_packs

NO_TRACK = ["--set", "tracking.enabled=false"]
COMMITTED = {"swapped", "removing-old"}   # publish points after which the new output is in place
TEXTS = ["def f(x):\n    return x\n", "import os\n", "The cat sat on the mat."] * 6


def tree(root: Path) -> dict[str, str]:
    """{relpath: sha256 or 'dir'}: equal ⇔ byte-identical directory."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".packtrain-" in p.name)


def _json(p: Path):
    return json.loads(p.read_text())


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """root/wd/{ingest,validate,tokenize,pack,evaluate}: the previous outputs every test starts from."""
    root = tmp_path_factory.mktemp("publish")
    for name, n in (("src", 60), ("src_new", 61)):
        (root / name).mkdir()
        for i in range(n):
            (root / name / f"d{i:02d}.txt").write_text(
                f"document {i} is about topic {i % 7}: alpha beta gamma delta epsilon {i * 13}\n")
    (root / "src_bad").mkdir()
    (root / "src_bad" / "a.txt").write_text("fine")
    (root / "src_bad" / "gone.txt").symlink_to("nowhere.txt")
    texts = [f"text number {i} with words" for i in range(60)]
    texts[50] = None
    (root / "docs_null").mkdir()
    pq.write_table(pa.table({"doc_id": pa.array(range(60), pa.int64()), "text": pa.array(texts, pa.string())}),
                   root / "docs_null" / "documents.parquet")
    build_tiny_model_dir(root / "model", TEXTS)
    rng = np.random.default_rng(0)
    write_tiny_packs(root / "packs" / "eval", [rng.integers(0, 250, size=20) for _ in range(5)], budget=32)
    wd = root / "wd"
    base = ["--set", f"workdir={root / 'wdrun'}", *NO_TRACK]
    with pytest.MonkeyPatch.context() as mp:   # module scope: conftest's autouse isolation is not active yet
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        for stage in STAGES.values():
            assert main([stage.name, *stage.previous(root), "--out", str(wd / stage.name), *base]) == 0, stage
    return root


@dataclass(frozen=True)
class Stage:
    name: str
    previous: object      # root -> CLI args of the run that made the previous output
    new: object           # root -> CLI args of the run under test (a visibly different output)
    is_new: object        # out -> bool
    check: object         # out -> None: the output is complete and consistent (raises otherwise)
    fail: object          # root -> (CLI args, exit code) of a run that fails after it started writing
    points: int           # publish points of one run over an existing output (see publish_dir)
    last_before_commit: int   # index of the point `synced` of the stage directory itself


def _check_ingest(out: Path) -> None:
    rows = pq.ParquetFile(out / "documents.parquet").metadata.num_rows
    assert rows == _json(out / "ingest_result.json")["documents"]


def _check_validate(out: Path) -> None:
    assert _json(out / "report.json")["success"] and _json(out / "validate_result.json")["success"]
    assert (out / "data_docs" / "index.html").is_file()


def _check_tokenize(out: Path) -> None:
    store = TokenStore.open(out)
    stats = _json(out / "tokenize_result.json")
    assert store.n_docs == stats["documents"] and int(store.meta["n_tokens"]) == stats["tokens"]
    assert (out / "tokenizer" / "tokenizer.json").is_file()


def _check_pack(out: Path) -> None:
    stats = _json(out / "pack_result.json")
    for split in ("train", "eval"):
        assert PackStore.open(out / split, verify=True).n_packs == stats[split]["n_packs"]


def _check_evaluate(out: Path) -> None:
    assert _json(out / "evaluate_result.json")["n_label_tokens"] > 0 and len(_json(out / "samples.json")) == 1


# The recipe's wordorder suite (200 items, rendered for validate's contamination check and scored by evaluate at each
# of a stage's ~5 runs here) left out: an output is published as a whole directory, whatever files it holds
NO_SUITES = ["--set", "validate.contamination.suites=false"]


def _docs(root: Path) -> list[str]:
    return ["--docs", str(root / "wd" / "ingest")]


STAGES = {s.name: s for s in [
    Stage("ingest", lambda r: ["--source", str(r / "src")], lambda r: ["--source", str(r / "src_new")],
          lambda o: _json(o / "ingest_result.json")["documents"] == 61, _check_ingest,
          lambda r: (["--source", str(r / "src_bad")], 3), 4, 1),
    Stage("validate", lambda r: [*_docs(r), *NO_SUITES, "--set", "validate.min_rows=10"],
          lambda r: [*_docs(r), *NO_SUITES, "--set", "validate.min_rows=11"],
          lambda o: _json(o / "report.json")["thresholds"]["min_rows"] == 11, _check_validate,
          lambda r: ([*_docs(r), *NO_SUITES, "--set", "validate.min_rows=100000"], 4), 4, 1),
    Stage("tokenize", lambda r: [*_docs(r), "--set", "tokenize.vocab_size=300"],
          # one thread: tokenizers' Rayon pool, once this process has used it, hangs in a fork (the killed run's)
          lambda r: [*_docs(r), "--set", "tokenize.vocab_size=300", "--set", "tokenize.append_eos=false",
                     "--set", "tokenize.workers=1"],
          lambda o: _json(o / "meta.json")["append_eos"] is False, _check_tokenize,
          lambda r: (["--docs", str(r / "docs_null"), "--set", "tokenize.vocab_size=300"], 3), 4, 1),
    Stage("pack", lambda r: ["--tokens", str(r / "wd" / "tokenize"), "--set", "pack.budget=64"],
          lambda r: ["--tokens", str(r / "wd" / "tokenize"), "--set", "pack.budget=96"],
          lambda o: _json(o / "pack_result.json")["budget"] == 96, _check_pack,
          lambda r: (["--tokens", str(r / "wd" / "tokenize"), "--set", "pack.min_doc_tokens=100000"], 3), 8, 5),
    Stage("evaluate",
          lambda r: ["--model", str(r / "model"), "--packs", str(r / "packs"), "--set", "evaluate.prompts=['def ']",
                     "--set", "evaluate.sample_tokens=4", "--set", "evaluate.suites=[]"],
          lambda r: ["--model", str(r / "model"), "--packs", str(r / "packs"),
                     "--set", "evaluate.prompts=['import ']", "--set", "evaluate.sample_tokens=4",
                     "--set", "evaluate.suites=[]"],
          lambda o: _json(o / "samples.json")[0]["prompt"] == "import ", _check_evaluate,
          lambda r: (["--model", str(r / "model"), "--packs", str(r / "nothing")], 5), 4, 1),
]}


@pytest.fixture
def previous(world, tmp_path):
    """A copy of one stage's previous output in tmp_path/<stage>; yields (stage name → (out, tree))."""
    def make(stage: Stage) -> tuple[Path, dict]:
        out = tmp_path / "outputs" / stage.name
        shutil.copytree(world / "wd" / stage.name, out)
        stage.check(out)
        assert not stage.is_new(out)
        return out, tree(out)
    return make


def run_in_process(stage: Stage, args: list[str], out: Path, tmp_path: Path) -> int:
    return main([stage.name, *args, "--out", str(out), "--set", f"workdir={tmp_path / 'wd'}", *NO_TRACK])


@pytest.mark.parametrize("name", list(STAGES))
def test_a_failing_stage_leaves_the_previous_output_byte_identical(world, previous, tmp_path, capsys, name):
    stage = STAGES[name]
    out, before = previous(stage)
    args, code = stage.fail(world)
    assert run_in_process(stage, args, out, tmp_path) == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert tree(out) == before and leftovers(out.parent) == []
    if name == "validate":   # the failed suite's report is published beside it, not over it
        failed = out.with_name("validate.failed")
        assert str(failed / "report.json") in err and not _json(failed / "report.json")["success"]


@pytest.mark.parametrize("name", list(STAGES))
def test_an_error_at_the_last_moment_before_publishing(world, previous, tmp_path, monkeypatch, capsys, name):
    """Every output written and checked, the staging directory fsynced: an error there still publishes
    nothing (PACKTRAIN_FAULT=publish.raise@N at the stage directory's `synced` point)."""
    stage = STAGES[name]
    out, before = previous(stage)
    monkeypatch.setattr(publish, "_fault_counter", itertools.count())
    monkeypatch.setenv(FAULT_ENV, f"publish.raise@{stage.last_before_commit}")
    assert run_in_process(stage, stage.new(world), out, tmp_path) == 1
    err = capsys.readouterr().err
    assert f"PACKTRAIN_FAULT publish.raise@{stage.last_before_commit}: synced of {out}" in err
    assert "injected fault" in err and tree(out) == before and leftovers(out.parent) == []


KILLS = [("ingest", 1), ("ingest", 5), ("ingest", 9), ("validate", 7), ("tokenize", 2), ("pack", 5), ("pack", 9),
         ("evaluate", 11)]


@pytest.mark.parametrize("name,seed", KILLS, ids=[f"{n}-seed{s}" for n, s in KILLS])
def test_sigkill_during_publish_leaves_old_or_new_whole(world, previous, tmp_path, name, seed):
    stage = STAGES[name]
    out, before = previous(stage)
    point = random.Random(seed).randrange(stage.points)
    env = {**os.environ, FAULT_ENV: f"publish@{point}", "DVC_NO_ANALYTICS": "1",
           "MLFLOW_DISABLE_TELEMETRY": "true"}
    log = tmp_path / "stderr"
    code = run_forked([name, *stage.new(world), "--out", str(out), "--set", f"workdir={tmp_path / 'wd'}", *NO_TRACK],
                      env, log, timeout=300)
    stderr = log.read_text() if log.exists() else ""
    assert code == -9, f"seed {seed} point {point}: rc {code}\n{stderr}"
    hit = re.search(rf"PACKTRAIN_FAULT publish@{point}: (\S+) of (\S+)", stderr)
    assert hit, stderr
    if hit[1] in COMMITTED and Path(hit[2]) == out:
        assert stage.is_new(out), f"seed {seed}: killed at {hit[1]} after the commit, the new output is in place"
        stage.check(out)
    else:
        assert tree(out) == before, f"seed {seed}: killed at {hit[1]} of {hit[2]}, before the commit"
        assert leftovers(out.parent), "the killed run's staging directory is still there (the rerun removes it)"
    assert run_in_process(stage, stage.new(world), out, tmp_path) == 0
    assert stage.is_new(out) and leftovers(out.parent) == []
    stage.check(out)


def test_a_directory_with_foreign_files_is_refused_before_any_work(world, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("not packtrain's")
    assert run_in_process(STAGES["ingest"], STAGES["ingest"].new(world), out, tmp_path) == 2
    err = capsys.readouterr().err
    assert "holds 1 entry that is not ingest output (thesis.tex" in err
    assert sorted(os.listdir(out)) == ["thesis.tex"] and leftovers(tmp_path) == []
