"""Reading the documents of a source's files: `.txt`, `.jsonl`, `.parquet` (finding them: source_files).

Every reader yields `(text, locator)` pairs; the locator goes into the documents table's `source` column
and says where the document came from:

    .txt  file mode        "notes/a.txt"          (one document per file, text kept byte-for-byte)
    .txt  paragraph mode   "notes/a.txt:12"       (blank-line-separated block starting on line 12)
    .jsonl                 "dump.jsonl:3"         (line 3, field cfg.text_field)
    .parquet               "part-0.parquet#41"    (row 41, column cfg.text_field)

`.jsonl`/`.parquet` may also hold chat records (`messages`: a list of {role, content}) or prompt/completion
records (`prompt` + `completion`), detected from the file's first record / its columns
(`detect_record_format`, or `ingest.record_format`). Their structure is kept as JSON in the documents
table's `record` column *as it is*: a wrong role, a missing content, a non-list `messages` is not refused
here but reported row by row by `packtrain validate` (packtrain.data.chat.record_problems).

Folders are walked by packtrain.data.source_files.discover_files (import it, Discovery and SkippedEntry
from there). Bad input raises `InputDataError` naming the file, line/row, field and value, and
what is allowed. Rules:
an empty or whitespace-only file is an error (it is almost always a broken export), and so is a .txt file
with no visible text (only NUL/control, zero-width or U+FFFD characters: a binary file or a decoding accident;
packtrain.data.record_rules.has_visible); an empty string value inside a .jsonl/.parquet is accepted here and
reported by `packtrain validate`; null is an error.

`on_bad="skip"` (ingest.on_bad_record): a problem of one line / row (not UTF-8, malformed JSON, not an
object, missing field, non-string, null) yields a `SkippedRecord(source, reason)` instead of raising, and the
reader goes on with the next line; problems of the whole file still raise.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from packtrain.data.chat import RecordFormat, detect_record_format, record_of, record_text
from packtrain.data.record_rules import describe_invisible, has_visible
from packtrain.data.source_files import (
    SourceFile,
)
from packtrain.errors import InputDataError

BOM = b"\xef\xbb\xbf"
Progress = Callable[[int], None]
Doc = tuple[str, str, RecordFormat, str | None]
"""(text, locator, record format, record JSON or None for plain text): what every reader yields."""
OnBad = Literal["fail", "skip"]


@dataclass(frozen=True)
class SkippedRecord:
    """A document dropped by ingest.on_bad_record=skip: its locator (`c.jsonl:3`) and why."""

    source: str
    reason: str

    def to_dict(self) -> dict:
        return {"source": self.source, "reason": self.reason}


def decode_utf8(data: bytes, where: str, base_offset: int = 0) -> str:
    """Strict UTF-8 (a leading BOM is dropped); the error names the byte offset and the byte."""
    skip = 3 if data.startswith(BOM) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        off = base_offset + skip + e.start
        bad = data[skip + e.start: skip + e.start + 4].hex(" ")
        raise InputDataError(
            f"{where}: not valid UTF-8 at byte offset {off} (bytes {bad}: {e.reason}); "
            "only UTF-8 text is allowed: re-encode the file, e.g. `iconv -f latin1 -t utf-8`") from None


def read_txt(f: SourceFile, mode: Literal["file", "paragraph"], max_chars: int,
             progress: Progress | None = None) -> Iterator[tuple[str, str]]:  # (text, locator)
    """One document per file, or one per blank-line-separated block (blocks keep their inner newlines)."""
    if mode == "file" and f.n_bytes > 4 * max_chars:  # UTF-8 needs ≤ 4 bytes per char: surely too long
        raise too_long_error(f, f.name, f.n_bytes, max_chars, approx=True)
    data = f.path.read_bytes()
    if not data.strip():
        what = "0 bytes" if not data else f"{len(data)} bytes of whitespace only"
        raise InputDataError(f"{f.path}: empty file ({what}); every .txt file must hold at least one document")
    text = decode_utf8(data, str(f.path))
    if not has_visible(text):
        raise InputDataError(f"{f.path}: no visible text ({describe_invisible(text)}); every .txt file must hold "
                             "at least one document a reader can see (is it a binary file, or text decoded with "
                             "the wrong encoding upstream?)")
    if progress:
        progress(len(data))
    if mode == "file":
        yield text, f.name
        return
    block: list[str] = []
    start = 0
    for lineno, line in enumerate(text.split("\n"), 1):
        if line.strip():
            if not block:
                start = lineno
            block.append(line)
        elif block:
            yield "\n".join(block), f"{f.name}:{start}"
            block = []
    if block:
        yield "\n".join(block), f"{f.name}:{start}"


def read_jsonl(f: SourceFile, field: str, progress: Progress | None = None,
               record_format: str = "auto", on_bad: OnBad = "fail") -> Iterator[Doc | SkippedRecord]:
    """One document per non-blank line: a JSON object whose `field` is a string, or a chat record
    ({"messages": [...]}) or a prompt/completion record (detect_record_format; the file's first good record
    decides for the whole file). Streams line by line. A bad line raises, or (on_bad="skip") is yielded as a
    SkippedRecord."""
    for item in _jsonl(f, field, progress, record_format):
        if isinstance(item, _BadLine):
            if on_bad == "fail":
                raise item.error
            yield SkippedRecord(item.source, str(item.error))
        else:
            yield item


@dataclass(frozen=True)
class _BadLine:
    source: str
    error: InputDataError


def _jsonl(f: SourceFile, field: str, progress: Progress | None, record_format: str
           ) -> Iterator[Doc | _BadLine]:
    """read_jsonl's lines: a Doc, or a _BadLine naming what is wrong with it."""
    offset = 0
    pending = 0
    n = 0
    fmt: RecordFormat | None = None
    with open(f.path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            start, offset = offset, offset + len(raw)
            pending += len(raw)
            if progress and pending >= 1 << 20:
                progress(pending)
                pending = 0
            where, loc = f"{f.path}: line {lineno}", f"{f.name}:{lineno}"
            try:
                line = decode_utf8(raw, where, base_offset=start)
            except InputDataError as e:
                yield _BadLine(loc, e)
                continue
            if not line.strip():
                continue
            n += 1
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                yield _BadLine(loc, InputDataError(
                    f"{where}: malformed JSON ({e.msg} at column {e.colno}): {_clip(line)}; "
                    f"each line must be one JSON object like {{\"{field}\": \"...\"}}"))
                continue
            if not isinstance(obj, dict):
                yield _BadLine(loc, InputDataError(
                    f"{where}: expected a JSON object with a {field!r} field, got a JSON {type(obj).__name__}: "
                    f"{_clip(line)}"))
                continue
            if fmt is None:
                fmt = detect_record_format(obj, field, record_format)
            if fmt != "text":
                record = record_of(obj, fmt)
                yield record_text(fmt, json.loads(record)), loc, fmt, record
                continue
            if field not in obj:
                keys = ", ".join(sorted(obj)[:20]) or "none"
                yield _BadLine(loc, InputDataError(
                    f"{where}: no field {field!r} (fields: {keys}); name the text field with "
                    f"--set ingest.text_field=NAME (chat records need a \"messages\" list, prompt/completion "
                    "records \"prompt\" and \"completion\")"))
                continue
            value = obj[field]
            if not isinstance(value, str):
                yield _BadLine(loc, InputDataError(
                    f"{where}: field {field!r} is {_json_type(value)} ({_clip(json.dumps(value))}); "
                    "expected a string"))
                continue
            yield value, loc, "text", None
    if progress and pending:
        progress(pending)
    if n == 0:
        raise InputDataError(f"{f.path}: empty file ({offset} bytes, no JSON lines); expected one JSON object per line")


def read_parquet(f: SourceFile, column: str, progress: Progress | None = None,
                 record_format: str = "auto", on_bad: OnBad = "fail") -> Iterator[Doc | SkippedRecord]:
    """One document per row of a string column, or per chat/prompt record (a `messages` list-of-struct
    column, or `prompt` + `completion` columns: detect_record_format on the column names). Streams record
    batches of 4,096 rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f.path, pre_buffer=False)   # streamed: no row group kept after use
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError) as e:
        raise InputDataError(f"{f.path}: not a readable parquet file ({e})") from None
    fmt = detect_record_format(dict.fromkeys(schema.names), column, record_format)
    if fmt != "text":
        yield from _parquet_records(f, pf, fmt, progress)
        return
    if column not in schema.names:
        raise InputDataError(
            f"{f.path}: no column {column!r} (columns: {', '.join(schema.names) or 'none'}); name the text "
            "column with --set ingest.text_field=NAME")
    typ = schema.field(column).type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)
            or getattr(pa.types, "is_string_view", lambda _t: False)(typ)):
        raise InputDataError(f"{f.path}: column {column!r} has type {typ}; expected string (UTF-8 text)")
    if pf.metadata.num_rows == 0:
        raise InputDataError(f"{f.path}: empty file (0 rows); expected at least one document")
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=4096, columns=[column]):
            col = batch.column(0)
            values = col.to_pylist()
            if col.null_count and on_bad == "fail":
                i = values.index(None)
                raise InputDataError(f"{f.path}: row {row + i}: column {column!r} is null; expected a string")
            for i, v in enumerate(values):
                if v is None:
                    yield SkippedRecord(f"{f.name}#{row + i}", f"{f.path}: row {row + i}: column {column!r} is "
                                        "null; expected a string")
                else:
                    yield v, f"{f.name}#{row + i}", "text", None
            row += len(values)
    except (pa.ArrowException, UnicodeDecodeError) as e:
        raise InputDataError(f"{f.path}: near row {row}: cannot read column {column!r} ({e})") from None
    if progress:
        progress(f.n_bytes)


def _parquet_records(f: SourceFile, pf, fmt: RecordFormat, progress: Progress | None) -> Iterator[Doc]:
    """Chat / prompt-completion rows of a parquet file: each row's columns as a JSON object (record_of)."""
    import pyarrow as pa

    cols = ["messages"] if fmt == "messages" else [c for c in ("prompt", "completion") if c in pf.schema_arrow.names]
    if pf.metadata.num_rows == 0:
        raise InputDataError(f"{f.path}: empty file (0 rows); expected at least one record")
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=4096, columns=cols):
            for obj in batch.to_pylist():
                record = record_of(obj, fmt)
                yield record_text(fmt, json.loads(record)), f"{f.name}#{row}", fmt, record
                row += 1
    except (pa.ArrowException, UnicodeDecodeError) as e:
        raise InputDataError(f"{f.path}: near row {row}: cannot read columns {cols} ({e})") from None
    if progress:
        progress(f.n_bytes)


def too_long_error(f: SourceFile, locator: str, n: int, limit: int, approx: bool = False) -> InputDataError:
    size = f"{n:,} bytes (> 4 × the limit)" if approx else f"{n:,} characters"
    return InputDataError(
        f"{f.path} ({locator}): document has {size}, over ingest.max_doc_chars = {limit:,}; split it into "
        "smaller documents, or raise the limit with --set ingest.max_doc_chars=N")


def _json_type(v) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}.get(
        type(v), type(v).__name__)


def _clip(s: str, n: int = 80) -> str:
    s = s.rstrip("\n")
    return repr(s if len(s) <= n else s[:n] + "...")
