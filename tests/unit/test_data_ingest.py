"""ingest library: literal tables of source → documents, determinism, the default corpus, properties."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtrain.config import IngestConfig
from packtrain.data.corpus import select_default_corpus
from packtrain.data.ingest import ingest_documents
from packtrain.data.record_rules import has_visible
from packtrain.data.source_files import SourceFile, discover_files
from packtrain.data.source_readers import decode_utf8, read_txt
from packtrain.errors import InputDataError


def _table(path):
    t = pq.read_table(path)
    return {c: t.column(c).to_pylist() for c in t.column_names}, t.schema


def _write(root, files: dict):
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        elif isinstance(content, pa.Table):
            pq.write_table(content, p)
        else:
            p.write_text(content, encoding="utf-8")


CASES = [
    # (files, config overrides, expected texts, expected sources)
    ({"a.txt": "hello\n\nworld\n"}, {}, ["hello\n\nworld\n"], ["a.txt"]),
    ({"a.txt": "hello\n\n\n  \nworld\nagain\n"}, {"txt_mode": "paragraph"},
     ["hello", "world\nagain"], ["a.txt:1", "a.txt:5"]),
    ({"d.jsonl": '{"text": "x"}\n\n{"text": "yz", "id": 3}\n'}, {}, ["x", "yz"], ["d.jsonl:1", "d.jsonl:3"]),
    ({"d.jsonl": '{"body": "x"}\n'}, {"text_field": "body"}, ["x"], ["d.jsonl:1"]),
    ({"p.parquet": pa.table({"text": ["p0", "p1"], "n": [1, 2]})}, {}, ["p0", "p1"], ["p.parquet#0", "p.parquet#1"]),
    ({"b.txt": "B", "a.txt": "A", "sub/c.jsonl": '{"text": "C"}\n', ".hidden": "x", ".git/x.txt": "no"}, {},
     ["A", "B", "C"], ["a.txt", "b.txt", "sub/c.jsonl:1"]),
    ({"a.txt": "\ufeffbom"}, {}, ["bom"], ["a.txt"]),
    ({"a.txt": "1", "b.txt": "2", "c.txt": "3"}, {"max_docs": 2}, ["1", "2"], ["a.txt", "b.txt"]),
]


@pytest.mark.parametrize("files,over,texts,sources", CASES)
def test_ingest_table(tmp_path, files, over, texts, sources):
    src = tmp_path / "src"
    src.mkdir()
    _write(src, files)
    stats = ingest_documents(src, tmp_path / "out", IngestConfig(**over))
    cols, schema = _table(tmp_path / "out" / "documents.parquet")
    assert cols["text"] == texts and cols["source"] == sources
    assert cols["doc_id"] == list(range(len(texts)))
    assert cols["n_chars"] == [len(t) for t in texts]
    assert [str(schema.field(c).type) for c in ("doc_id", "text", "source", "n_chars")] == \
        ["int64", "string", "string", "int64"]
    assert stats.documents == len(texts) and stats.chars == sum(map(len, texts))
    assert not list((tmp_path / "out").glob(".*tmp"))


def test_ingest_is_byte_identical_twice(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _write(src, {"a.txt": "α\n\nβ\n", "b.jsonl": json.dumps({"text": "γ" * 50}) + "\n"})
    digests = []
    for out in ("o1", "o2"):
        ingest_documents(src, tmp_path / out, IngestConfig(txt_mode="paragraph"))
        digests.append(hashlib.md5((tmp_path / out / "documents.parquet").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def test_failed_ingest_leaves_no_table_and_keeps_old_one(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _write(src, {"a.txt": "fine"})
    out = tmp_path / "out"
    ingest_documents(src, out, IngestConfig())
    before = (out / "documents.parquet").read_bytes()
    _write(src, {"b.txt": b"bad \xff"})
    with pytest.raises(InputDataError):
        ingest_documents(src, out, IngestConfig())
    assert (out / "documents.parquet").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["documents.parquet"]


@pytest.mark.parametrize("data,offset", [(b"ok\xff", 2), (b"\xef\xbb\xbfab\xc3(", 5), (b"\xe2\x82", 0)])
def test_decode_error_names_byte_offset(data, offset):
    with pytest.raises(InputDataError, match=f"byte offset {offset} "):
        decode_utf8(data, "f.txt")


def test_discover_skip_lists_unsupported(tmp_path):
    _write(tmp_path, {"a.txt": "x", "img.png": b"\x89PNG", "notes.md": "y"})
    d = discover_files(tmp_path, "skip")
    assert [f.name for f in d.files] == ["a.txt"] and d.skipped == ["img.png", "notes.md"]


def test_default_corpus_is_deterministic_long_tailed_and_utf8():
    a, b = select_default_corpus(0.5), select_default_corpus(0.5)
    assert [f.source for f in a.files] == [f.source for f in b.files]
    assert 0.5e6 <= a.total_bytes < 0.5e6 + max(f.n_bytes for f in a.files)
    assert [f.relpath for f in a.files] == sorted(f.relpath for f in a.files)
    assert all(f.source.startswith("stdlib:") and f.relpath.endswith((".py", ".txt", ".rst")) for f in a.files)
    assert "site-packages" not in " ".join(f.relpath for f in a.files)
    sizes = sorted(f.n_bytes for f in a.files)
    assert sizes[-1] > 5 * sizes[len(sizes) // 2]  # long tail: the largest file dwarfs the median


def test_default_corpus_falls_back_to_next_root(tmp_path):
    r1, r2 = tmp_path / "r1", tmp_path / "r2"
    _write(r1, {"a.py": "x" * 100, "bad.py": b"\xff\xfe", "blank.py": "  \n"})
    _write(r2, {"b.py": "y" * 100, "c.txt": "z" * 100, "skip.bin": "no"})
    c = select_default_corpus(250e-6, roots=[("stdlib", r1), ("site-packages", r2)])
    assert [f.source for f in c.files][0] == "stdlib:a.py" and len(c.files) == 3
    assert (c.skipped_non_utf8, c.skipped_blank) == (1, 1)
    assert set(c.roots) == {"stdlib", "site-packages"}


blocks = st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
                          min_size=1, max_size=20).filter(lambda s: s.strip()), min_size=1, max_size=6
                  ).filter(lambda ps: any(map(has_visible, ps)))   # a .txt with no visible text is refused


@settings(max_examples=60, deadline=None)
@given(blocks, st.integers(1, 3))
def test_paragraphs_round_trip(tmp_path_factory, paras, gap):
    """Blocks joined by ≥1 blank line come back one document each, in order, text unchanged."""
    p = tmp_path_factory.mktemp("para") / "p.txt"
    p.write_text(("\n" * (gap + 1)).join(paras) + "\n", encoding="utf-8")
    got = [t for t, _ in read_txt(SourceFile(p, "p.txt", "txt", p.stat().st_size), "paragraph", 10**9)]
    assert got == paras
