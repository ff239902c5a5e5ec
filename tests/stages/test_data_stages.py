"""ingest → validate → tokenize through the CLI on a slice of the default corpus, tracked in real MLflow
(sqlite in tmp); GX pass/fail report contents; tokenizer round-trip through AutoTokenizer; determinism."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtrain.cli import main
from packtrain.data.token_store import SPLIT_EVAL, TokenStore
from packtrain.data.tokenize import split_eval
from packtrain.stages.results import ValidateResult
from packtrain.versioning import data_md5

SMALL = ["--set", "ingest.default_corpus_mb=0.4", "--set", "validate.min_rows=10",
         "--set", "tokenize.vocab_size=400", "--set", "tokenize.train_chars=150000",
         "--set", "tokenize.eval_fraction=0.1", "--set", "tracking.system_metrics=false"]


def _md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Run the three stages once with MLflow tracking on; return (workdir, stdout per stage)."""
    wd = tmp_path_factory.mktemp("wd")
    outs = {}
    import contextlib
    import io

    with pytest.MonkeyPatch.context() as mp:  # module scope: the autouse env isolation is not active yet
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("PACKTRAIN_PARENT_RUN_ID", raising=False)
        for stage in ("ingest", "validate", "tokenize"):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                code = main([stage, "--set", f"workdir={wd}", *SMALL])
            assert code == 0, stage
            outs[stage] = buf.getvalue()
    return wd, outs


@pytest.mark.slow
def test_chain_outputs_md5s_and_mlflow_tags(chain):
    wd, outs = chain
    ing = json.loads((wd / "ingest" / "ingest_result.json").read_text())
    val = json.loads((wd / "validate" / "validate_result.json").read_text())
    tok = json.loads((wd / "tokenize" / "tokenize_result.json").read_text())
    docs = wd / "ingest" / "documents.parquet"
    assert ing["source_kind"] == "default" and ing["default_corpus"]["python"].startswith("CPython")
    src_md5, val_md5, tok_md5 = (d["lineage"]["input_md5"][k] for d, k in
                                 ((ing, "source"), (val, "documents"), (tok, "documents")))
    assert ing["output_md5"] == data_md5(docs) == val_md5 == tok_md5
    assert src_md5.endswith(".dir") and val["lineage"]["data_version"] == tok["lineage"]["data_version"] == src_md5
    assert ValidateResult.from_dict(val).to_dict() == val   # the written JSON is the typed result
    # summaries name documents, percentiles, the validation result and the md5
    assert f"{ing['documents']:,} documents" in outs["ingest"] and "p99" in outs["ingest"]
    assert "PASSED 13/13" in outs["validate"] and val_md5 in outs["validate"]   # 12 + contamination (on by default)
    assert f"{tok['tokens']:,} tokens" in outs["tokenize"] and "EOS (id 0)" in outs["tokenize"]

    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{wd / 'mlflow.db'}")
    runs = {r.info.run_name: r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])}
    assert {"ingest", "validate", "tokenize"} <= set(runs)
    assert runs["ingest"].data.tags["dvc.md5.source"] == src_md5
    assert runs["ingest"].data.tags["dvc.md5.documents"] == ing["output_md5"]
    assert runs["validate"].data.tags["dvc.md5.documents"] == val_md5
    assert runs["tokenize"].data.tags["dvc.md5.documents"] == tok_md5
    digests = {i.dataset.name: i.dataset.digest for i in runs["tokenize"].inputs.dataset_inputs}
    assert digests["documents"] == tok_md5
    assert runs["tokenize"].data.metrics["tokens"] == tok["tokens"]


@pytest.mark.slow
def test_validate_pass_report(chain):
    wd, _ = chain
    report = json.loads((wd / "validate" / "report.json").read_text())
    assert report["success"] and report["failed"] == []
    names = [r["name"] for r in report["results"]]
    assert names == ["columns_present", "doc_id_type", "text_type", "source_type", "n_chars_type", "doc_id_unique",
                     "text_not_null", "text_not_empty", "has_visible_text", "length_in_range", "duplicate_ratio",
                     "row_count", "contamination"]   # the last: on by default (the run's suites, its held-out split)
    n = report["documents"]
    assert next(r for r in report["results"] if r["name"] == "row_count")["observed"] == n
    length = next(r for r in report["results"] if r["name"] == "length_in_range")
    assert length["kwargs"]["mostly"] == 0.99 and length["element_count"] == n
    index = wd / "validate" / "data_docs" / "index.html"
    assert index.is_file() and "packtrain_text_corpus" in index.read_text()
    assert list((wd / "validate" / "data_docs" / "validations").rglob("*.html"))


@pytest.mark.slow
def test_tokenizer_round_trip_and_store(chain):
    from transformers import AutoTokenizer

    wd, _ = chain
    store = TokenStore.open(wd / "tokenize")
    tok = AutoTokenizer.from_pretrained(str(wd / "tokenize" / "tokenizer"))
    assert (tok.eos_token, tok.bos_token, tok.pad_token) == ("<|endoftext|>", "<|endoftext|>", "<|pad|>")
    assert store.meta["eos_id"] == tok.eos_token_id == 0 and store.vocab_size == len(tok) <= 400
    texts = pq.read_table(wd / "ingest" / "documents.parquet").column("text").to_pylist()
    assert store.n_docs == len(texts)
    for i in range(store.n_docs):
        ids = store.doc(i).tolist()
        assert ids[-1] == tok.eos_token_id  # EOS appended to every document
        assert tok(texts[i])["input_ids"] == ids[:-1]
        assert tok.decode(ids[:-1]) == texts[i]
    assert np.array_equal(store.split, split_eval(store.doc_ids, 0.1))
    assert 1 <= (store.split == SPLIT_EVAL).sum() < store.n_docs
    stats = json.loads((wd / "tokenize" / "tokenize_result.json").read_text())
    lt = stats["length_tokens"]
    assert lt["p50"] <= lt["p90"] <= lt["p99"] <= lt["max"] == int(store.lengths().max())
    assert stats["train_tokens"] + stats["eval_tokens"] == stats["tokens"] == int(store.offsets[-1])


@pytest.mark.slow
def test_tokenize_is_deterministic_and_loads_a_tokenizer_dir(chain, tmp_path, capsys):
    wd, _ = chain
    first = wd / "tokenize"
    again = tmp_path / "again"
    loaded = tmp_path / "loaded"
    common = ["--docs", str(wd / "ingest"), "--set", f"workdir={tmp_path}", *SMALL, "--set", "tracking.enabled=false"]
    assert main(["tokenize", "--out", str(again), *common]) == 0
    for f in ("tokens.bin", "offsets.npy", "doc_ids.npy", "split.npy", "tokenizer/tokenizer.json"):
        assert _md5(first / f) == _md5(again / f), f
    assert main(["tokenize", "--out", str(loaded), *common,
                 "--set", f"tokenize.tokenizer_dir={first / 'tokenizer'}"]) == 0
    assert _md5(first / "tokens.bin") == _md5(loaded / "tokens.bin")
    stats = json.loads((loaded / "tokenize_result.json").read_text())
    assert stats["tokenizer"] == str((first / "tokenizer").resolve())
    assert stats["lineage"]["input_md5"]["tokenizer"].endswith(".dir")
    capsys.readouterr()
    assert main(["tokenize", "--out", str(tmp_path / "x"), *common,
                 "--set", f"tokenize.tokenizer_dir={tmp_path / 'none'}"]) == 2
    assert "tokenize.tokenizer_dir" in capsys.readouterr().err


@pytest.mark.slow
def test_tokenize_streams_in_any_batch_size_to_the_same_store(chain, tmp_path, monkeypatch):
    """Documents are read and encoded batch by batch (tokenize.batch_docs documents, encode calls of at most
    ENCODE_CHARS characters): tiny batches give the byte-identical store and tokenizer."""
    import packtrain.data.tokenize as tk

    wd, _ = chain
    monkeypatch.setattr(tk, "ENCODE_CHARS", 500)
    small = tmp_path / "small"
    assert main(["tokenize", "--docs", str(wd / "ingest"), "--out", str(small), "--set", f"workdir={tmp_path}",
                 *SMALL, "--set", "tracking.enabled=false", "--set", "tokenize.batch_docs=3"]) == 0
    for f in ("tokens.bin", "offsets.npy", "doc_ids.npy", "split.npy", "tokenizer/tokenizer.json"):
        assert _md5(wd / "tokenize" / f) == _md5(small / f), f
    assert [len(b) for b in tk._by_chars(["a" * 300, "b" * 300, "c" * 900, "d"], 500)] == [1, 1, 1, 1]
    assert [len(b) for b in tk._by_chars(["a" * 200, "b" * 200, "c" * 50, "d" * 400], 500)] == [3, 1]


def test_tokenize_reads_dictionary_encoded_text_like_plain_text(tmp_path):
    """A hand-made table whose text column is dictionary-encoded (a pandas categorical) tokenizes to the same
    store as the plain string column."""
    texts = [f"row {i % 7} says hello" for i in range(30)]
    outs = []
    for kind, col in (("plain", pa.array(texts, pa.string())), ("dict", pa.array(texts).dictionary_encode())):
        d = tmp_path / kind
        d.mkdir()
        pq.write_table(pa.table({"doc_id": pa.array(range(30), pa.int64()), "text": col}), d / "documents.parquet")
        assert main(["tokenize", "--docs", str(d), "--out", str(d / "tok"), "--set", f"workdir={tmp_path}",
                     "--set", "tracking.enabled=false", "--set", "tokenize.vocab_size=300",
                     "--set", "tokenize.batch_docs=8"]) == 0
        outs.append(d / "tok")
    for f in ("tokens.bin", "offsets.npy", "tokenizer/tokenizer.json"):
        assert _md5(outs[0] / f) == _md5(outs[1] / f), f


def test_tokenize_missing_text_midway_names_it_and_keeps_the_old_store(tmp_path, capsys):
    """A null text in a later batch: an error naming its doc_id after some batches were already encoded; the
    previous token store is left as it was and no temp directory remains."""
    docs = tmp_path / "docs"
    docs.mkdir()
    texts = [f"document number {i} with some words" for i in range(40)]
    pq.write_table(pa.table({"doc_id": pa.array(range(40), pa.int64()), "text": texts}), docs / "documents.parquet")
    out = tmp_path / "tok"
    common = ["--docs", str(docs), "--out", str(out), "--set", f"workdir={tmp_path}", "--set", "tracking.enabled=false",
              "--set", "tokenize.vocab_size=300", "--set", "tokenize.batch_docs=4"]
    assert main(["tokenize", *common]) == 0
    before = _md5(out / "tokens.bin")
    texts[33] = None
    pq.write_table(pa.table({"doc_id": pa.array(range(40), pa.int64()), "text": pa.array(texts, pa.string())}),
                   docs / "documents.parquet")
    capsys.readouterr()
    assert main(["tokenize", *common, "--set", f"tokenize.tokenizer_dir={out / 'tokenizer'}"]) == 3
    err = capsys.readouterr().err
    assert "doc_id 33: text is None" in err and "Traceback" not in err
    assert _md5(out / "tokens.bin") == before
    assert [p.name for p in tmp_path.iterdir() if ".packtrain-" in p.name or p.name.endswith(".tmp")] == []


def test_validate_fail_report_names_offending_doc_ids(tmp_path, capsys):
    """A table with one problem per row; each expectation lists exactly the doc_ids that break it."""
    texts = ["fine text"] * 3 + ["", "   \n", None, "x" * 50, "dup", "dup", "ok"]
    n_chars = [9, 9, 9, 0, 4, 0, 50, 3, 3, 2]
    docs = tmp_path / "docs"
    docs.mkdir()
    pq.write_table(pa.table({"doc_id": pa.array(range(10), pa.int64()), "text": pa.array(texts, pa.string()),
                             "source": ["t"] * 10, "n_chars": pa.array(n_chars, pa.int64())}),
                   docs / "documents.parquet")
    before = _md5(docs / "documents.parquet")
    out = tmp_path / "val"
    code = main(["validate", "--docs", str(docs), "--out", str(out), "--set", f"workdir={tmp_path}",
                 "--set", "tracking.enabled=false", "--set", "validate.max_chars=20", "--set", "validate.min_rows=20",
                 "--set", "validate.length_mostly=0.9", "--set", "validate.max_duplicate_ratio=0.1"])
    err = capsys.readouterr().err
    assert code == 4 and _md5(docs / "documents.parquet") == before
    assert not out.exists()   # a failed suite publishes its report to <out>.failed only
    out = tmp_path / "val.failed"
    report = json.loads((out / "report.json").read_text())
    by = {r["name"]: r for r in report["results"]}
    assert set(report["failed"]) == {"text_not_null", "text_not_empty", "length_in_range", "duplicate_ratio",
                                     "row_count"}
    for name in report["failed"]:
        assert name in err
    assert str(out / "report.json") in err
    assert by["text_not_null"]["offending_doc_ids"] == [5] and by["text_not_null"]["unexpected_count"] == 1
    assert sorted(by["text_not_empty"]["offending_doc_ids"]) == [3, 4]
    assert sorted(by["length_in_range"]["offending_doc_ids"]) == [3, 5, 6]  # n_chars 0, 0, 50 ∉ [1, 20]
    dup = by["duplicate_ratio"]
    assert dup["offending_doc_ids"] == [1, 2, 8] and dup["unexpected_count"] == 3
    assert dup["observed"]["duplicate_ratio"] == pytest.approx(3 / 10)
    assert by["row_count"]["observed"] == 10 and by["row_count"]["offending_doc_ids"] == []
    assert by["doc_id_unique"]["success"] and by["text_type"]["success"]


def test_validate_wrong_types_and_missing_column(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    pq.write_table(pa.table({"doc_id": pa.array([0, 1], pa.int32()), "text": pa.array([1, 2], pa.int64()),
                             "n_chars": pa.array([1, 1], pa.int64())}), docs / "documents.parquet")
    code = main(["validate", "--docs", str(docs), "--out", str(tmp_path / "v"), "--set", f"workdir={tmp_path}",
                 "--set", "tracking.enabled=false", "--set", "validate.min_rows=1"])
    err = capsys.readouterr().err
    assert code == 4
    by = {r["name"]: r for r in json.loads((tmp_path / "v.failed" / "report.json").read_text())["results"]}
    assert by["columns_present"]["observed"]["missing"] == ["source"] and not by["columns_present"]["success"]
    assert by["doc_id_type"]["observed"] == "int32" and not by["doc_id_type"]["success"]
    assert not by["text_type"]["success"] and not by["source_type"]["success"]
    assert by["source_type"]["error"].startswith("column 'source' is missing")
    assert "doc_id_type" in err and "columns_present" in err
