"""Finding and reading the documents of a source: `.txt`, `.jsonl`, `.parquet` files or a folder of them.

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

Folders are walked in sorted order following symbolic links (also out of the folder), every folder read at
most once by its resolved path; dangling or looping links, links to a folder already read and special files
are named (`discover_files`). Bad input raises `InputDataError` naming the file, line/row, field and value,
and what is allowed. Rules:
an empty or whitespace-only file is an error (it is almost always a broken export); an empty string value
inside a .jsonl/.parquet is accepted here and reported by `packtrain validate`; null is an error.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from packtrain.data.chat import RecordFormat, detect_record_format, record_of, record_text
from packtrain.errors import InputDataError

Kind = Literal["txt", "jsonl", "parquet"]
SUPPORTED: dict[str, Kind] = {".txt": "txt", ".jsonl": "jsonl", ".parquet": "parquet"}
ALLOWED = ", ".join(SUPPORTED)
BOM = b"\xef\xbb\xbf"
Progress = Callable[[int], None]
Doc = tuple[str, str, RecordFormat, str | None]
"""(text, locator, record format, record JSON or None for plain text): what every reader yields."""


@dataclass(frozen=True)
class SourceFile:
    """One input file. `name` is what the `source` column shows (path relative to the source folder)."""

    path: Path
    name: str
    kind: Kind
    n_bytes: int


@dataclass(frozen=True)
class SkippedEntry:
    """An entry of a source folder that cannot be read: a dangling or looping symbolic link, a link to a
    folder already read, a special file (FIFO, socket, device). `target` is what a link points to
    (`os.readlink`), None for other entries."""

    name: str
    problem: str
    target: str | None = None

    def describe(self) -> str:
        """'notes/a.txt -> ../gone.txt (dangling: the target does not exist)'"""
        arrow = f" -> {self.target}" if self.target is not None else ""
        return f"{self.name}{arrow} ({self.problem})"

    def to_dict(self) -> dict:
        return {"name": self.name, "target": self.target, "problem": self.problem}


@dataclass
class Discovery:
    files: list[SourceFile]
    skipped: list[str]  # unsupported files skipped (ingest.unsupported=skip), relative names
    bad_entries: list[SkippedEntry] = field(default_factory=list)   # skipped (ingest.unsupported=skip)
    linked_folders: list[dict] = field(default_factory=list)         # [{"name", "target"}] read through a link
    linked_files: int = 0                                            # files read through a link to a file

    @property
    def exact(self) -> bool:
        """True when the files read are exactly the folder's plain files (nothing skipped, no link followed)."""
        return not (self.skipped or self.bad_entries or self.linked_folders or self.linked_files)


def discover_files(source: Path, unsupported: Literal["error", "skip"] = "error") -> Discovery:
    """The files of a source in deterministic order (sorted relative posix paths; hidden entries ignored).

    >>> # folder/{b.jsonl, a.txt, sub/c.parquet, .DS_Store} → [a.txt, b.jsonl, sub/c.parquet]

    Symbolic links are followed, also when they point outside the folder: a link to a file is read under the
    link's name, a link to a folder is walked under the link's name. Every folder is read at most once (by
    its resolved path), which is the loop detection: a link to a folder that is already read (the folder
    holding the link or one above it — a loop — or one reached another way) is not followed. Such links,
    dangling links, link chains that loop, special files (FIFO, socket, device) and unsupported file types are
    an InputDataError naming each entry (and a link's target), or, with `unsupported="skip"`, skipped and
    returned in `skipped` / `bad_entries` for the caller to report.
    """
    if not source.exists():
        if source.is_symlink():
            raise InputDataError(f"source {source} is a symbolic link to {os.readlink(source)} "
                                 f"({_link_problem(source)}); point --source at an existing file or folder")
        raise InputDataError(f"source {source} does not exist (expected a {ALLOWED} file or a folder of them)")
    if source.is_file():
        kind = SUPPORTED.get(source.suffix.lower())
        if kind is None:
            raise InputDataError(
                f"source {source}: unsupported file type {source.suffix or '(no suffix)'!r} (allowed: {ALLOWED})")
        return Discovery([SourceFile(source, source.name, kind, source.stat().st_size)], [])
    if not source.is_dir():
        raise InputDataError(f"source {source} is not a regular file or folder (expected a {ALLOWED} file or a "
                             "folder of them)")
    disc = _walk(source)
    files, bad, entries = disc.files, disc.skipped, disc.bad_entries
    if not files and not bad and not entries:
        raise InputDataError(f"source folder {source} is empty: no {ALLOWED} files found (hidden files are ignored)")
    if (bad or entries) and unsupported == "error":
        parts = []
        if bad:
            parts.append(f"{len(bad)} file(s) of unsupported type: {_shown(bad)} (allowed: {ALLOWED})")
        if entries:
            parts.append(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} that cannot be read: "
                         + _shown([e.describe() for e in entries]))
        raise InputDataError(
            f"source folder {source}: " + "; ".join(parts) + "; remove them or pass --set ingest.unsupported=skip "
            "to ingest the supported files and skip these")
    if not files:
        raise InputDataError(
            f"source folder {source} has no {ALLOWED} files; {len(bad) + len(entries)} entries skipped: "
            + _shown(bad + [e.describe() for e in entries]))
    return disc


def _shown(items: list[str], n: int = 10) -> str:
    return ", ".join(items[:n]) + (f", ... ({len(items) - n} more)" if len(items) > n else "")


def _link_problem(path: Path) -> str | None:
    """Why the link `path` cannot be followed ('dangling: the target does not exist', 'a symbolic link loop',
    ...), or None when it resolves."""
    try:
        path.resolve(strict=True)
    except FileNotFoundError:
        return "dangling: the target does not exist"
    except RuntimeError:   # Python < 3.13: "Symlink loop from ..."
        return "a symbolic link loop"
    except OSError as e:
        return "a symbolic link loop" if e.errno == errno.ELOOP else f"cannot be followed: {e.strerror}"
    return None


def _walk(source: Path) -> Discovery:
    """Depth-first over sorted entries, following links, each real folder once (see discover_files)."""
    disc = Discovery([], [])
    read_as: dict[str, str] = {}   # real path of every folder read (or about to be) → its name in the source

    def claim(real: str, name: str) -> None:
        """Mark `real` and its plain (non-link, non-hidden) subfolders as read under `name`."""
        for dirpath, dirnames, _ in os.walk(real, onerror=_raise_unreadable(source, name)):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = os.path.relpath(dirpath, real)
            read_as[dirpath] = name if rel == "." else (f"{name}/{rel}" if name else rel)

    def visit(folder: str, prefix: str) -> None:
        """Read `folder` (a path as reached from the source, through links) whose entries are named prefix+…"""
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise InputDataError(f"source folder {source}: cannot read folder {prefix or '.'} ({e.strerror}); "
                                 "make it readable or remove it") from None
        for entry in entries:
            if entry.name.startswith("."):
                continue
            name = prefix + entry.name
            if entry.is_symlink():
                _visit_link(entry, name)
            elif entry.is_dir(follow_symlinks=False):
                visit(entry.path, name + "/")
            elif entry.is_file(follow_symlinks=False):
                _add_file(Path(entry.path), name, entry.stat(follow_symlinks=False).st_size)
            else:
                disc.bad_entries.append(SkippedEntry(name, "not a regular file: a FIFO, socket or device"))

    def _visit_link(entry: os.DirEntry, name: str) -> None:
        target = os.readlink(entry.path)
        path = Path(entry.path)
        problem = _link_problem(path)
        if problem is not None:
            disc.bad_entries.append(SkippedEntry(name, problem, target))
            return
        real = str(path.resolve())
        if os.path.isdir(real):
            inside = next((r for r in read_as if r == real or r.startswith(real + os.sep)), None)
            if inside is not None:
                place = f"folder {read_as[inside]!r}" if read_as[inside] else "the source folder"
                holder = str(path.parent.resolve())
                if holder == real or holder.startswith(real + os.sep):
                    problem = f"a loop: links back to {place}"
                elif inside == real:
                    problem = f"links to {place}, which is read already"
                else:
                    problem = f"links to a folder that contains {place}, which is read already"
                disc.bad_entries.append(SkippedEntry(name, problem + "; not followed", target))
                return
            claim(real, name)
            disc.linked_folders.append({"name": name, "target": real})
            visit(entry.path, name + "/")
        elif os.path.isfile(real):
            disc.linked_files += 1
            _add_file(path, name, os.stat(real).st_size)
        else:
            disc.bad_entries.append(SkippedEntry(name, "links to something that is not a regular file or folder",
                                                 target))

    def _add_file(path: Path, name: str, size: int) -> None:
        kind = SUPPORTED.get(path.suffix.lower())
        if kind is None:
            disc.skipped.append(name)
        else:
            disc.files.append(SourceFile(path, name, kind, size))

    claim(str(source.resolve()), "")
    visit(str(source), "")
    disc.files.sort(key=lambda f: f.name)
    disc.skipped.sort()
    return disc


def _raise_unreadable(source: Path, name: str):
    def onerror(e: OSError) -> None:
        raise InputDataError(f"source folder {source}: cannot read folder {e.filename} ({e.strerror}); make it "
                             "readable or remove it") from None
    return onerror


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
               record_format: str = "auto") -> Iterator[Doc]:
    """One document per non-blank line: a JSON object whose `field` is a string, or a chat record
    ({"messages": [...]}) or a prompt/completion record (detect_record_format; the file's first record decides
    for the whole file). Streams line by line."""
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
            where = f"{f.path}: line {lineno}"
            line = decode_utf8(raw, where, base_offset=start)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputDataError(
                    f"{where}: malformed JSON ({e.msg} at column {e.colno}): {_clip(line)}; "
                    f"each line must be one JSON object like {{\"{field}\": \"...\"}}") from None
            if not isinstance(obj, dict):
                raise InputDataError(
                    f"{where}: expected a JSON object with a {field!r} field, got a JSON {type(obj).__name__}: "
                    f"{_clip(line)}")
            if fmt is None:
                fmt = detect_record_format(obj, field, record_format)
            n += 1
            if fmt != "text":
                record = record_of(obj, fmt)
                yield record_text(fmt, json.loads(record)), f"{f.name}:{lineno}", fmt, record
                continue
            if field not in obj:
                keys = ", ".join(sorted(obj)[:20]) or "none"
                raise InputDataError(
                    f"{where}: no field {field!r} (fields: {keys}); name the text field with "
                    f"--set ingest.text_field=NAME (chat records need a \"messages\" list, prompt/completion "
                    "records \"prompt\" and \"completion\")")
            value = obj[field]
            if not isinstance(value, str):
                raise InputDataError(
                    f"{where}: field {field!r} is {_json_type(value)} ({_clip(json.dumps(value))}); "
                    "expected a string")
            yield value, f"{f.name}:{lineno}", "text", None
    if progress and pending:
        progress(pending)
    if n == 0:
        raise InputDataError(f"{f.path}: empty file ({offset} bytes, no JSON lines); expected one JSON object per line")


def read_parquet(f: SourceFile, column: str, progress: Progress | None = None,
                 record_format: str = "auto") -> Iterator[Doc]:
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
            if col.null_count:
                i = values.index(None)
                raise InputDataError(f"{f.path}: row {row + i}: column {column!r} is null; expected a string")
            for i, v in enumerate(values):
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
