"""Every bad input through the real CLI: exit code, a message naming file/line/field/value, the
input untouched, no half-written output. In-process `packtrain.cli.main` (one GX import for the module);
one case through the installed `packtrain` executable."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtrain.cli import main

NO_TRACK = ["--set", "tracking.enabled=false"]


def _snapshot(path: Path) -> dict:
    """{relpath: (md5, mtime_ns)} of every file under path (or of the file)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): (hashlib.md5(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in files}


def _ingest(tmp_path, source: Path, *extra: str):
    out = tmp_path / "out"
    before = _snapshot(source)
    code = main(["ingest", "--source", str(source), "--out", str(out), "--set", f"workdir={tmp_path}",
                 *NO_TRACK, *extra])
    assert _snapshot(source) == before, "input was modified"
    return code, out


def _make(tmp_path, name: str, content) -> Path:
    p = tmp_path / "in" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, pa.Table):
        pq.write_table(content, p)
    elif isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    return p


BAD = [
    # (id, file name, content, extra args, message fragments)
    ("empty-txt", "e.txt", b"", [], ["e.txt", "empty file (0 bytes)"]),
    ("blank-txt", "e.txt", b" \n\n", [], ["e.txt", "whitespace only"]),
    ("empty-jsonl", "e.jsonl", b"\n\n", [], ["e.jsonl", "no JSON lines"]),
    ("empty-parquet", "e.parquet", pa.table({"text": pa.array([], pa.string())}), [], ["e.parquet", "0 rows"]),
    ("non-utf8-txt", "latin.txt", "héllo wörld".encode("latin-1"), [], ["latin.txt", "byte offset 1", "e9"]),
    ("non-utf8-jsonl", "l.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n', [],
     ["l.jsonl", "line 2", "byte offset 28"]),
    ("malformed-jsonl", "m.jsonl", '{"text": "a"}\n{"text": "b"}\n{"text": "c",,}\n', [],
     ["m.jsonl", "line 3", "malformed JSON"]),
    ("jsonl-not-object", "m.jsonl", '["text"]\n', [], ["line 1", "JSON object", "list"]),
    ("missing-field", "f.jsonl", '{"body": "x", "id": 1}\n', [], ["f.jsonl", "line 1", "no field 'text'", "body, id"]),
    ("missing-column", "c.parquet", pa.table({"content": ["x"]}), [], ["c.parquet", "no column 'text'", "content"]),
    ("number-in-jsonl", "n.jsonl", '{"text": "ok"}\n{"text": 42}\n', [], ["n.jsonl", "line 2", "'text'", "a number", "42"]),
    ("null-in-jsonl", "n.jsonl", '{"text": null}\n', [], ["line 1", "null"]),
    ("number-column", "n.parquet", pa.table({"text": pa.array([1, 2], pa.int64())}), [], ["n.parquet", "'text'", "int64", "expected string"]),
    ("null-in-parquet", "n.parquet", pa.table({"text": ["a", None]}), [], ["n.parquet", "row 1", "null"]),
    ("corrupt-parquet", "x.parquet", b"PAR1 not really", [], ["x.parquet", "not a readable parquet"]),
    ("unsupported-file", "data.csv", "text\nx\n", [], ["data.csv", "unsupported file type '.csv'", ".txt, .jsonl, .parquet"]),
    ("over-max-chars", "long.txt", "x" * 2000, ["--set", "ingest.max_doc_chars=1000"],
     ["long.txt", "2,000 characters", "ingest.max_doc_chars = 1,000"]),
]


@pytest.mark.parametrize("name,content,extra,fragments", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_source_file(tmp_path, capsys, name, content, extra, fragments):
    src = _make(tmp_path, name, content)
    code, out = _ingest(tmp_path, src, *extra)
    err = capsys.readouterr().err
    assert code == 3, err
    assert err.startswith("error: ") and "Traceback" not in err
    for frag in fragments:
        assert frag in err, (frag, err)
    assert not (out / "documents.parquet").exists()
    assert not out.exists() or not list(out.glob(".*.tmp"))


def test_missing_source_and_empty_folder(tmp_path, capsys):
    code = main(["ingest", "--source", str(tmp_path / "nope"), "--set", f"workdir={tmp_path}", *NO_TRACK])
    assert code == 3 and "nope does not exist" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / ".DS_Store").write_bytes(b"\0")
    code, _ = _ingest(tmp_path, empty)
    err = capsys.readouterr().err
    assert code == 3 and f"source folder {empty} is empty" in err


def test_single_100mb_document_is_rejected_at_the_default_limit(tmp_path, capsys):
    """Decision: over ingest.max_doc_chars (default 50,000,000) is an error; 100 MB never reaches validate."""
    src = tmp_path / "in" / "huge.txt"
    src.parent.mkdir()
    with open(src, "wb") as f:
        chunk = b"0123456789abcdef" * 65536  # 1 MiB
        for _ in range(100):
            f.write(chunk)
    code, out = _ingest(tmp_path, src)
    err = capsys.readouterr().err
    assert code == 3
    assert "huge.txt" in err and "104,857,600 characters" in err and "max_doc_chars = 50,000,000" in err
    assert not (out / "documents.parquet").exists()


def test_mixed_folder_errors_naming_files_or_skips_with_warning(tmp_path, capsys):
    folder = tmp_path / "in"
    _make(tmp_path, "a.txt", "alpha")
    _make(tmp_path, "b.jsonl", '{"text": "beta"}\n')
    _make(tmp_path, "c.parquet", pa.table({"text": ["gamma"]}))
    _make(tmp_path, "img.png", b"\x89PNG\r\n")
    _make(tmp_path, "sub/notes.md", "# notes")
    code, out = _ingest(tmp_path, folder)
    err = capsys.readouterr().err
    assert code == 3 and "2 file(s) of unsupported type: img.png, sub/notes.md" in err
    assert "ingest.unsupported=skip" in err and not (out / "documents.parquet").exists()

    code, out = _ingest(tmp_path, folder, "--set", "ingest.unsupported=skip")
    cap = capsys.readouterr()
    assert code == 0 and "warning: ingest skipped 2 unsupported file(s)" in cap.err and "img.png" in cap.err
    t = pq.read_table(out / "documents.parquet")
    assert t.column("text").to_pylist() == ["alpha", "beta", "gamma"]
    assert t.column("source").to_pylist() == ["a.txt", "b.jsonl:1", "c.parquet#0"]
    stats = json.loads((out / "ingest_result.json").read_text())
    assert stats["skipped_files"] == ["img.png", "sub/notes.md"] and stats["documents"] == 3


def test_all_duplicate_corpus_ingests_but_fails_validation(tmp_path, capsys):
    src = _make(tmp_path, "dup.jsonl", "".join(json.dumps({"text": "same text"}) + "\n" for _ in range(12)))
    code, out = _ingest(tmp_path, src)
    assert code == 0
    capsys.readouterr()
    docs_before = _snapshot(out / "documents.parquet")
    val = tmp_path / "val"
    code = main(["validate", "--docs", str(out), "--out", str(val), "--set", f"workdir={tmp_path}",
                 "--set", "validate.min_rows=5", *NO_TRACK])
    err = capsys.readouterr().err
    assert code == 4
    # a failed suite publishes nothing to --out (no validated dataset); its report goes to <out>.failed
    failed = tmp_path / "val.failed"
    assert "duplicate_ratio" in err and str(failed / "report.json") in err
    assert _snapshot(out / "documents.parquet") == docs_before
    assert not val.exists() and [p.name for p in tmp_path.iterdir() if ".packtrain-" in p.name] == []
    report = json.loads((failed / "report.json").read_text())
    dup = next(r for r in report["results"] if r["name"] == "duplicate_ratio")
    assert report["success"] is False and report["failed"] == ["duplicate_ratio"]
    assert dup["unexpected_count"] == 11 and dup["observed"]["duplicate_ratio"] == pytest.approx(11 / 12, abs=1e-6)
    assert dup["offending_doc_ids"] == list(range(1, 12))
    assert report["report"] == str(failed / "report.json") and (failed / "data_docs" / "index.html").is_file()
    assert json.loads((failed / "validate_result.json").read_text())["success"] is False


def test_validate_without_documents(tmp_path, capsys):
    code = main(["validate", "--docs", str(tmp_path / "nothing"), "--set", f"workdir={tmp_path}", *NO_TRACK])
    assert code == 5 and "run `packtrain ingest` first" in capsys.readouterr().err


@pytest.mark.parametrize("args,fragments", [
    (["--set", "ingest.txt_mod=file"], ["ingest.txt_mod", "unknown key", "txt_mode"]),
    (["--set", "ingest.max_doc_chars=lots"], ["ingest.max_doc_chars", "'lots'"]),
    (["--set", "ingest.unsupported=ignore"], ["ingest.unsupported", "'ignore'", "'error'", "'skip'"]),
])
def test_config_typos_and_wrong_types(tmp_path, capsys, args, fragments):
    assert main(["ingest", "--set", f"workdir={tmp_path}", *args]) == 2
    err = capsys.readouterr().err
    assert all(f in err for f in fragments), err
    assert not (tmp_path / "ingest").exists()


def test_real_executable_reports_malformed_jsonl(tmp_path):
    src = _make(tmp_path, "m.jsonl", '{"text": "a"}\n{oops}\n')
    exe = Path(sys.executable).with_name("packtrain")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    p = subprocess.run([str(exe), "ingest", "--source", str(src), "--set", f"workdir={tmp_path}", *NO_TRACK],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 3 and "m.jsonl: line 2: malformed JSON" in p.stderr and "Traceback" not in p.stderr
    assert src.read_text() == '{"text": "a"}\n{oops}\n'
