"""ingest: a source (or the default corpus) → `documents.parquet`, the table every later stage reads.

    documents.parquet   doc_id int64 (0..n-1, in order) | text string | source string | n_chars int64
                        [| format string | record string]   only when a chat/prompt-completion file is read

Chat and prompt/completion records (packtrain.data.chat) add two columns: `format` ("text", "messages" or
"prompt_completion") and `record` (the record's structure as JSON, null for text rows); their `text` is the
record's contents joined by blank lines (what validate's length/empty/duplicate checks see):

    >>> # chat.jsonl: '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}'
    >>> # → text ["Hi\n\nYo"], source ["chat.jsonl:1"], format ["messages"],
    >>> #   record ['[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]']

A plain-text source gives exactly the four columns it always did (the same bytes as before).

    >>> # folder/{a.txt: "hi", b.jsonl: '{"text": "x"}\\n{"text": "yz"}\\n'}
    >>> # → doc_id [0, 1, 2], text ["hi", "x", "yz"], source ["a.txt", "b.jsonl:1", "b.jsonl:2"], n_chars [2, 1, 2]

Order and ids are deterministic: files in sorted relative-path order, documents in file order; the same
source gives a byte-identical table (same pyarrow version). The table is streamed to a temp file in
batches (≤ 4,096 documents or 64 MB) and renamed into place, so a failed ingest leaves no table behind and
the source is only ever read. Duplicates are kept (validate reports them). Symbolic links in a source folder
are followed safely (packtrain.data.source_files.discover_files); the stage (packtrain.stages.ingest) builds the
table and ingest_result.json in a staging directory and publishes both together (packtrain.publish).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from packtrain.config import IngestConfig
from packtrain.data.chat import file_record_format
from packtrain.data.corpus import DefaultCorpus, select_default_corpus
from packtrain.data.ingest_stats import IngestStats
from packtrain.data.record_rules import RowRules
from packtrain.data.source_files import Discovery, SourceFile, discover_files
from packtrain.data.source_readers import (
    Doc,
    SkippedRecord,
    read_jsonl,
    read_parquet,
    read_txt,
    too_long_error,
)
from packtrain.errors import InputDataError

DOCUMENTS_FILE = "documents.parquet"
_FLUSH_DOCS, _FLUSH_BYTES = 4096, 64 << 20


def length_summary(lengths: list[int]) -> dict[str, float]:
    """{'min', 'p50', 'p90', 'p99', 'max', 'mean'} of a list of lengths (numpy 'linear' percentiles)."""
    import numpy as np

    if not lengths:
        return {}
    a = np.asarray(lengths, dtype=np.int64)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"min": int(a.min()), "p50": round(float(p50), 1), "p90": round(float(p90), 1),
            "p99": round(float(p99), 1),
            "max": int(a.max()), "mean": round(float(a.mean()), 1)}


class _DocWriter:
    """Streams rows into a parquet temp file; `commit()` renames it into place, `abort()` removes it."""

    def __init__(self, final: Path, records: bool = False):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa = pa
        cols = [("doc_id", pa.int64()), ("text", pa.string()), ("source", pa.string()), ("n_chars", pa.int64())]
        if records:
            cols += [("format", pa.string()), ("record", pa.string())]
        self.records = records
        self.schema = pa.schema(cols)
        self.final = final
        self.tmp = final.with_name(f".{final.name}.tmp")
        self.writer = pq.ParquetWriter(self.tmp, self.schema, compression="zstd")
        self.cols: dict[str, list] = {n: [] for n in self.schema.names}
        self.buffered = 0
        self.n = 0

    def add(self, text: str, source: str, fmt: str = "text", record: str | None = None) -> None:
        self.cols["doc_id"].append(self.n)
        self.cols["text"].append(text)
        self.cols["source"].append(source)
        self.cols["n_chars"].append(len(text))
        if self.records:
            self.cols["format"].append(fmt)
            self.cols["record"].append(record)
        self.n += 1
        self.buffered += len(text)
        if len(self.cols["doc_id"]) >= _FLUSH_DOCS or self.buffered >= _FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.cols["doc_id"]:
            self.writer.write_table(self._pa.table(self.cols, schema=self.schema))
            self.cols = {n: [] for n in self.schema.names}
            self.buffered = 0

    def commit(self) -> None:
        self._flush()
        self.writer.close()
        os.replace(self.tmp, self.final)

    def abort(self) -> None:
        try:
            self.writer.close()
        finally:
            self.tmp.unlink(missing_ok=True)


def ingest_documents(source: str | Path | None, dst_dir: str | Path, cfg: IngestConfig,
                     published_dir: str | Path | None = None, rules: RowRules | None = None) -> IngestStats:
    """Read `source` (None → the default corpus, `packtrain.data.corpus`) into `dst_dir/documents.parquet`.

    Raises InputDataError (file, line/row, field, value, what is allowed) for: a missing/unsupported source,
    an empty file or folder, non-UTF-8 bytes (byte offset), malformed JSONL (line number), a missing text
    field/column, a non-string value, a document over `cfg.max_doc_chars`, an unreadable file, unsupported
    files, dangling or looping links and special files in a folder (unless `cfg.unsupported == "skip"`: then
    they are skipped, named on stderr and in the stats). `published_dir`: where the table will be published
    when `dst_dir` is a staging directory (default `dst_dir`); a source file inside it is an error (it would
    read the previous output). 24 MB default corpus: ≈2 s on one core.

    `cfg.on_bad_record == "skip"`: a bad line/row/.txt file, and a document that validate's per-document rules
    (`rules`, packtrain.data.record_rules; the stage passes RowRules.of(cfg)) or text_not_empty would refuse,
    is dropped instead, named on stderr and listed in the stats (`skipped_records`).
    """
    from tqdm import tqdm

    t0 = time.perf_counter()
    dst_dir = Path(dst_dir)
    final = dst_dir / DOCUMENTS_FILE
    files, label, kind, default, disc = _discover(source, cfg, Path(published_dir if published_dir is not None else dst_dir))
    dst_dir.mkdir(parents=True, exist_ok=True)
    records = any(file_record_format(f, cfg.text_field, cfg.record_format) != "text" for f in files)
    writer = _DocWriter(final, records=records)
    tally = _Tally()
    bar = tqdm(total=sum(f.n_bytes for f in files), unit="B", unit_scale=True, desc="ingest",
               file=sys.stderr, delay=2.0, leave=False)
    try:
        _read_files(files, kind, cfg, rules or RowRules(), writer, tally, bar)
        if writer.n == 0:
            raise InputDataError(f"{label}: no documents found" + (
                f" ({len(tally.skipped)} bad record(s) skipped: {_shown(tally.skipped)})" if tally.skipped else ""))
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    if tally.skipped:
        print(f"warning: ingest skipped {len(tally.skipped)} bad record(s) (ingest.on_bad_record=skip): "
              f"{_shown(tally.skipped)}; all listed in ingest_result.json (skipped_records)", file=sys.stderr)
    return IngestStats(
        documents=writer.n, chars=sum(tally.lengths), bytes_utf8=tally.n_bytes, files=len(tally.read),
        source=label, source_kind=kind, output=str(final), files_by_type=tally.by_type, skipped_files=disc.skipped,
        skipped_entries=[e.to_dict() for e in disc.bad_entries], linked_folders=disc.linked_folders,
        length_chars=length_summary(tally.lengths), stopped_at_max_docs=tally.stopped,
        seconds=round(time.perf_counter() - t0, 3),
        default_corpus=default.provenance() if default else None,
        records_by_format=tally.by_format if records else {}, input_files=tally.read,
        records_skipped=len(tally.skipped), skipped_records=[r.to_dict() for r in tally.skipped],
        input_exact=source is not None and disc.exact)


def _discover(source: str | Path | None, cfg: IngestConfig, out: Path
              ) -> tuple[list[SourceFile], str, str, DefaultCorpus | None, Discovery]:
    """The files to read: (files, label for messages, source_kind, the default corpus or None, the discovery).
    A source that holds the output directory `out` (where the table is published) is refused."""
    if source is None:
        default = select_default_corpus(cfg.default_corpus_mb)
        files = [SourceFile(f.path, f.source, "txt", f.n_bytes) for f in default.files]
        label, kind = f"default corpus ({default.python} standard library)", "default"
        return _nonempty(files, label), label, kind, default, Discovery([], [])
    src = Path(source)
    disc = discover_files(src, cfg.unsupported)
    files = disc.files
    label, kind = str(src), ("folder" if src.is_dir() else files[0].kind)
    out = out.resolve()
    inside = next((f for f in files if f.path.resolve() == out or out in f.path.resolve().parents), None)
    if inside is not None:
        raise InputDataError(f"source {src} contains the output directory {out} ({inside.name}): choose "
                             "another --out, outside the source")
    _warn_skipped(src, disc)
    return _nonempty(files, label), label, kind, None, disc


def _nonempty(files: list[SourceFile], label: str) -> list[SourceFile]:
    if not files:
        raise InputDataError(f"{label}: no files to ingest")
    return files


@dataclass
class _Tally:
    """What reading the files counted, for IngestStats."""

    by_type: dict[str, int] = field(default_factory=dict)       # files per kind (or suffix, default corpus)
    by_format: dict[str, int] = field(default_factory=dict)     # documents per record format
    lengths: list[int] = field(default_factory=list)            # characters per document written
    read: dict[str, Path] = field(default_factory=dict)         # source name → file read
    skipped: list[SkippedRecord] = field(default_factory=list)  # bad records dropped (on_bad_record=skip)
    n_bytes: int = 0                                            # UTF-8 bytes of the documents written
    stopped: bool = False                                       # ingest.max_docs reached


def _read_files(files: list[SourceFile], kind: str, cfg: IngestConfig, rules: RowRules, writer: _DocWriter,
                tally: _Tally, bar) -> None:
    """Every document of `files`, in order, into `writer`, counted in `tally`; stops at ingest.max_docs."""
    skip = cfg.on_bad_record == "skip"
    for f in files:
        tally.read[f.name] = f.path
        key = Path(f.name).suffix.lstrip(".") if kind == "default" else f.kind
        tally.by_type[key] = tally.by_type.get(key, 0) + 1
        for item in _reading(f, _file_docs(f, cfg, bar), skip):
            bad = item if isinstance(item, SkippedRecord) else _bad_document(f, item, cfg, rules, skip)
            if bad is not None:
                tally.skipped.append(bad)
                continue
            text, where, fmt, record = cast(Doc, item)
            writer.add(text, where, fmt, record)
            tally.by_format[fmt] = tally.by_format.get(fmt, 0) + 1
            tally.lengths.append(len(text))
            tally.n_bytes += len(text.encode("utf-8")) if not text.isascii() else len(text)
            if cfg.max_docs is not None and writer.n >= cfg.max_docs:
                tally.stopped = True
                return


def _file_docs(f: SourceFile, cfg: IngestConfig, bar) -> Iterator[Doc | SkippedRecord]:
    """The documents (or, on_bad_record=skip, bad records) of one file, by its kind."""
    if f.kind == "txt":
        return ((t, w, "text", None) for t, w in read_txt(f, cfg.txt_mode, cfg.max_doc_chars, bar.update))
    if f.kind == "jsonl":
        return read_jsonl(f, cfg.text_field, bar.update, cfg.record_format, cfg.on_bad_record)
    return read_parquet(f, cfg.text_field, bar.update, cfg.record_format, cfg.on_bad_record)


def _bad_document(f: SourceFile, doc: Doc, cfg: IngestConfig, rules: RowRules, skip: bool) -> SkippedRecord | None:
    """Why `doc` is not written (None: it is): over ingest.max_doc_chars (an error unless skip), or, with skip,
    refused by the per-document rules."""
    text, where = doc[0], doc[1]
    if len(text) > cfg.max_doc_chars:
        err = too_long_error(f, where, len(text), cfg.max_doc_chars)
        if not skip:
            raise err
        return SkippedRecord(where, str(err))
    return _refused(doc, rules) if skip else None


def _warn_skipped(src: Path, disc: Discovery) -> None:
    """Name every skipped entry on stderr (ingest.unsupported=skip); the stats list them too."""
    if disc.skipped:
        print(f"warning: ingest skipped {len(disc.skipped)} unsupported file(s) in {src}: "
              + ", ".join(disc.skipped[:10]) + (" ..." if len(disc.skipped) > 10 else ""), file=sys.stderr)
    if disc.bad_entries:
        print(f"warning: ingest skipped {len(disc.bad_entries)} entr{'y' if len(disc.bad_entries) == 1 else 'ies'} "
              f"of {src} that cannot be read: " + ", ".join(e.describe() for e in disc.bad_entries),
              file=sys.stderr)


def _reading(f: SourceFile, docs: Iterator[Doc | SkippedRecord], skip: bool = False
             ) -> Iterator[Doc | SkippedRecord]:
    """`docs`, with an OS error while reading `f` (permissions, I/O) turned into an InputDataError naming it.
    `skip`: a .txt file the reader refuses (empty, no visible text, not UTF-8, too long) is one skipped
    record, named by the file."""
    while True:
        try:
            item = next(docs)
        except StopIteration:
            return
        except OSError as e:
            raise InputDataError(f"{f.path}: cannot read ({e.strerror or e}); make it readable or remove it from "
                                 "the source") from None
        except InputDataError as e:
            if not (skip and f.kind == "txt"):
                raise
            yield SkippedRecord(f.name, str(e))
            return
        yield item


def _refused(doc: Doc, rules: RowRules) -> SkippedRecord | None:
    """The document as a SkippedRecord when validate would refuse it row by row (text_not_empty, the record
    checks and packtrain.data.record_rules), else None."""
    import json

    from packtrain.data.record_rules import row_problem

    text, where, fmt, record = doc
    if not text.strip():
        return SkippedRecord(where, "text_not_empty: the text is empty (whitespace only)")
    found = row_problem(fmt, json.loads(record) if record is not None else None, text, rules)
    return SkippedRecord(where, f"{found[0]}: {found[1]}") if found else None


def _shown(skipped: list[SkippedRecord], n: int = 5) -> str:
    return ", ".join(f"{r.source} ({r.reason})" for r in skipped[:n]) + (
        f", ... ({len(skipped) - n} more)" if len(skipped) > n else "")
