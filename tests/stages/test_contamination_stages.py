"""validate.contamination through the real CLI on tiny data: a training document holding an eval record is
refused (exit 3, naming document and suite), dropped (tokenize and pack count exactly one document fewer) or
kept with a warning; the input table stays byte-identical."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest

from packtrain.cli import main
from packtrain.data.token_store import TokenStore

PASSAGE = "Which river flows through the old city of Prague and into the Elbe near Melnik? The Vltava."
BASE = ["--set", "tracking.enabled=false", "--set", "validate.min_rows=10", "--set", "tokenize.vocab_size=300",
        "--set", "tokenize.eval_fraction=0.1", "--set", "pack.budget=128"]


def _md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 training documents of random words, doc_id 7 (train.jsonl line 8) holding the second eval record;
    an eval suite folder with two files; the documents table ingested once."""
    root = tmp_path_factory.mktemp("contamination")
    rng = random.Random(0)
    words = [f"w{i}" for i in range(500)]
    docs = [" ".join(rng.choices(words, k=60)) for _ in range(40)]
    docs[7] = docs[7][:100] + " " + PASSAGE.upper() + " " + docs[7][100:]   # case and spacing differ
    (root / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    suite = root / "evals"
    suite.mkdir()
    (suite / "qa.jsonl").write_text(json.dumps({"text": "What is the capital of France? Paris, on the Seine."})
                                    + "\n" + json.dumps({"text": PASSAGE}) + "\n")
    (suite / "notes.txt").write_text("A passage nobody trained on, long enough to hold thirteen words or more.\n")
    wd = root / "wd"
    assert main(["ingest", "--source", str(root / "train.jsonl"), "--set", f"workdir={wd}", *BASE]) == 0
    return root, wd, suite


def _sets(wd: Path, suite: Path, policy: str) -> list[str]:
    return [*BASE, "--set", f"workdir={wd}", "--set", f"validate.contamination.against=[{suite}]",
            "--set", f"validate.contamination.policy={policy}"]


def test_fail_exits_3_naming_document_and_suite(corpus, capsys):
    root, wd, suite = corpus
    table = wd / "ingest" / "documents.parquet"
    before = _md5(table)
    out = root / "val-fail"
    assert main(["validate", "--out", str(out), *_sets(wd, suite, "fail")]) == 3
    err = capsys.readouterr().err
    assert "1 training document(s) overlap the eval data (13-gram" in err
    assert "train.jsonl:8 (doc_id 7) overlaps qa.jsonl:2 of suite " + str(suite) in err
    assert '"which river flows through the old city of ..."' in err and "policy=drop" in err
    assert not out.exists() and _md5(table) == before          # nothing published, the input untouched
    report = json.loads((root / "val-fail.failed" / "report.json").read_text())
    (exp,) = [r for r in report["results"] if r["name"] == "contamination"]
    assert exp["expectation"] == "expect_column_values_to_be_null" and not exp["success"]
    assert exp["offending_rows"][0]["doc_id"] == 7 and exp["offending_rows"][0]["source"] == "train.jsonl:8"
    assert report["failed"] == ["contamination"] and report["contamination"]["overlaps"][0]["eval_file"] == str(
        suite / "qa.jsonl")


def test_drop_removes_exactly_that_document_downstream(corpus, capsys):
    root, wd, suite = corpus
    runs = {}
    for policy in ("warn", "drop"):
        d = root / policy
        sets = _sets(wd, suite, policy)
        if policy == "drop":   # the warn run's tokenizer: token counts per document then compare exactly
            sets += ["--set", f"tokenize.tokenizer_dir={root / 'warn' / 'tokenize' / 'tokenizer'}"]
        assert main(["validate", "--out", str(d / "validate"), *sets]) == 0
        assert main(["tokenize", "--out", str(d / "tokenize"), *sets]) == 0
        assert main(["pack", "--tokens", str(d / "tokenize"), "--out", str(d / "pack"), *sets]) == 0
        runs[policy] = {s: json.loads((d / s / f).read_text()) for s, f in
                        (("validate", "validate_result.json"), ("tokenize", "tokenize_result.json"), ("pack", "pack_result.json"))}
    err = capsys.readouterr().err
    assert "contamination: 1 of 37 training document(s) overlap the eval data (13-gram; suite(s) wordorder; " \
           "the held-out split (3 documents, not checked themselves); against " in err and "kept and trained on" in err
    assert "dropped from training" in err and "tokenize: left out 1 contaminated document(s)" in err
    warn, drop = runs["warn"], runs["drop"]
    assert warn["validate"]["success"] and drop["validate"]["success"]
    assert drop["validate"]["contamination"]["dropped"] == [7] and "dropped" not in warn["validate"]["contamination"]
    assert drop["validate"]["contamination"]["overlaps"][0]["source"] == "train.jsonl:8"
    assert (warn["tokenize"]["documents"], drop["tokenize"]["documents"]) == (40, 39)
    assert drop["tokenize"]["contamination_dropped"] == [7] and warn["tokenize"]["contamination_dropped"] == []
    kept = TokenStore.open(root / "warn" / "tokenize")
    n7 = int(kept.lengths()[list(kept.doc_ids).index(7)])
    assert 7 not in TokenStore.open(root / "drop" / "tokenize").doc_ids.tolist()
    assert warn["tokenize"]["tokens"] - drop["tokenize"]["tokens"] == n7
    packed = {p: r["pack"]["train"]["n_tokens"] + r["pack"]["eval"]["n_tokens"] for p, r in runs.items()}
    assert packed["warn"] - packed["drop"] == n7
    assert (warn["pack"]["train"]["n_docs"] + warn["pack"]["eval"]["n_docs"]
            - drop["pack"]["train"]["n_docs"] - drop["pack"]["eval"]["n_docs"]) == 1
    np.testing.assert_array_equal(np.setdiff1d(kept.doc_ids, TokenStore.open(root / "drop" / "tokenize").doc_ids), [7])


def test_defaults_drop_a_planted_task_item_and_a_held_out_copy(tmp_path, capsys):
    """No contamination setting at all: the run's task suite and its own held-out split are checked, and the
    default policy drops the planted documents, naming their suites."""
    from packtrain.data.tokenize import split_eval

    wordorder = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "wordorder" / "wordorder.yaml"
    item = json.loads(wordorder.with_suffix(".jsonl").read_text().splitlines()[0])
    rng = random.Random(1)
    docs = [" ".join(rng.choices([f"w{i}" for i in range(500)], k=60)) for _ in range(30)]
    docs[5] += "\n" + item["context"] + "\n    " + item["choices"][item["label"]]   # a wordorder item, verbatim
    held = [int(i) for i in np.flatnonzero(split_eval(np.arange(31), 0.1))]
    docs.append(docs[held[0]])   # doc 30 (train.jsonl:31): a copy of a held-out document, lands in training
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    sets = [*BASE, "--set", f"workdir={tmp_path / 'wd'}",
            "--set", f"evaluate.suites=[{{name: wordorder, role: task, path: {wordorder}}}]"]
    assert main(["ingest", "--source", str(tmp_path / "train.jsonl"), *sets]) == 0
    assert main(["validate", *sets]) == 0 and main(["tokenize", *sets]) == 0
    err = capsys.readouterr().err
    stats = json.loads((tmp_path / "wd" / "validate" / "validate_result.json").read_text())["contamination"]
    assert stats["policy"] == "drop" and stats["dropped"] == [5, 30]
    assert [(o["suite"], o["eval_record"]) for o in stats["overlaps"]] == [
        ("wordorder", "wordorder.jsonl:1"), ("recent (held-out split)", f"train.jsonl:{held[0] + 1}")]
    assert "2 of 28 training document(s) overlap the eval data" in err and "dropped from training" in err
    tok = json.loads((tmp_path / "wd" / "tokenize" / "tokenize_result.json").read_text())
    assert tok["contamination_dropped"] == [5, 30] and tok["documents"] == 29
    assert held[0] in TokenStore.open(tmp_path / "wd" / "tokenize").doc_ids.tolist()   # the held-out one stays
