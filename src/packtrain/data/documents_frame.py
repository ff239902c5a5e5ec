"""documents.parquet as the validate suite sees it: found from a stage directory, read batch by batch into a pandas
DataFrame whose texts are md5 surrogates and whose per-document rules are `<check>_problem` columns.

    resolve_documents(docs)             a documents directory (→ its documents.parquet) or the file itself
    text_surrogates(texts)              what the suite sees of each text (md5 digest of a non-blank one)
    load_frame(path, batch_rows, rules) the DataFrame the suite runs on (packtrain.data.validate)
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from packtrain.data.record_rules import RowRules
from packtrain.errors import InputDataError, MissingDataError


def resolve_documents(docs: str | Path) -> Path:
    """A documents directory (→ its documents.parquet) or the parquet file itself."""
    p = Path(docs)
    if p.is_dir():
        p = p / "documents.parquet"
    if not p.is_file():
        raise MissingDataError(f"documents table {p} does not exist: run `packtrain ingest` first")
    return p


_NON_SPACE = re.compile(r"\S")   # the text_not_empty expectation's regex


def text_surrogates(texts: list) -> list:
    """What the suite sees of each text: None stays None, a non-str stays itself (text_type fails on it), a
    blank text (no match of \\S) stays itself (text_not_empty fails on it; distinct blanks stay distinct), any
    other text becomes "md5:<hex digest>" — the same answers for type, null, empty and distinct-count
    expectations at ~100 bytes per document instead of the text.

    >>> text_surrogates(["hello", "hello", " ", None])
    ['md5:5d41402abc4b2a76b9719d911017c592', 'md5:5d41402abc4b2a76b9719d911017c592', ' ', None]
    """
    out = []
    for t in texts:
        if isinstance(t, str) and _NON_SPACE.search(t):
            t = "md5:" + hashlib.md5(t.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()
        out.append(t)
    return out


def load_frame(path: Path, batch_rows: int = 2048, rules: RowRules | None = None):
    """The table as the pandas DataFrame the suite runs on, read batch by batch: string columns as object dtype
    (None for nulls), the text column as `text_surrogates` (so memory is O(documents), not O(text): 400 MB
    of text validated at a 475 MiB peak instead of 2,764 MiB, bench/results/data_memory.json); other columns as pyarrow
    converts them (an int32 doc_id stays int32, so the type expectation reports it). The per-document rules
    (packtrain.data.record_rules, `rules.checks`) are computed batch by batch on the real texts and records
    into `<check>_problem` columns; the `record` column itself is dropped."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtrain.data.record_rules import check_columns

    rules = rules or RowRules()
    try:
        pf = pq.ParquetFile(path, pre_buffer=False)
        schema = pf.schema_arrow
        strings = {f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)}
        checks = rules.checks(with_records="record" in schema.names) if "text" in schema.names else ()
        parts: dict[str, list] = {name: [] for name in schema.names}
        problems: dict[str, list] = {f"{c}_problem": [] for c in checks}
        for rb in pf.iter_batches(batch_size=batch_rows):
            batch = {name: rb.column(name).to_pylist() for name in schema.names if name in strings or name == "text"}
            if checks:
                for name, values in check_columns(batch.get("format") or [], batch.get("record") or [],
                                                  batch["text"], rules, checks).items():
                    problems[name].extend(values)
            for name in schema.names:
                if name == "text" and name in strings:
                    parts[name].extend(text_surrogates(batch[name]))
                elif name == "record":
                    continue   # only the checks need the structure (above)
                elif name in strings:
                    parts[name].extend(batch[name])
                else:
                    parts[name].append(rb.column(name))
    except (pa.ArrowException, OSError) as e:
        raise InputDataError(f"{path}: not a readable parquet file ({e})") from None
    cols = {}
    for f in schema:
        if f.name == "record":
            continue
        if f.name in strings:
            cols[f.name] = pd.Series(parts[f.name], dtype=object)
        else:
            cols[f.name] = pa.chunked_array(parts[f.name], type=f.type).to_pandas()
    for name, values in problems.items():
        cols[name] = pd.Series(values, dtype=object)
    return pd.DataFrame(cols) if cols else pd.DataFrame(index=range(pf.metadata.num_rows))
