"""What the ingest library step measured (`IngestStats`), in a module of its own with no heavy import: the ingest
stage's typed result (packtrain.stages.results.IngestResult) is these fields plus the stage's own, by inheritance
— one field list, not two. `input_files` / `input_exact` stay in memory (the stage's md5 of what was read)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from packtrain.record_fields import MEMORY_ONLY, record_dict


@dataclass
class IngestStats:
    """What ingest wrote. `length_chars` holds min/p50/p90/p99/max/mean document length in characters."""

    documents: int
    chars: int
    bytes_utf8: int
    files: int
    source: str
    source_kind: str  # "default" | "txt" | "jsonl" | "parquet" | "folder"
    output: str
    files_by_type: dict[str, int] = field(default_factory=dict)
    skipped_files: list[str] = field(default_factory=list)
    skipped_entries: list[dict] = field(default_factory=list)
    """Unreadable entries skipped with ingest.unsupported=skip: [{"name", "target", "problem"}] (dangling or
    looping links, links to a folder already read, special files)."""
    linked_folders: list[dict] = field(default_factory=list)
    """Folders read through a symbolic link: [{"name": name in the source, "target": resolved path}]."""
    length_chars: dict[str, float] = field(default_factory=dict)
    stopped_at_max_docs: bool = False
    seconds: float = 0.0
    default_corpus: dict | None = None
    records_by_format: dict[str, int] = field(default_factory=dict)
    """Documents per record format ({"text": n, "messages": m, "prompt_completion": k}); {} for plain text."""
    records_skipped: int = 0
    """Documents dropped by ingest.on_bad_record=skip (0 with fail)."""
    skipped_records: list[dict] = field(default_factory=list)
    """Every one of them: [{"source": "c.jsonl:3", "reason": "..."}], in reading order."""
    input_files: dict[str, Path] = field(default_factory=dict, repr=False, metadata=MEMORY_ONLY)
    """Files read, keyed by their `source` name (for the DVC-style md5 of exactly what was read)."""
    input_exact: bool = field(default=True, repr=False, metadata=MEMORY_ONLY)
    """True when the files read are exactly the source's plain files (nothing skipped, no link followed)."""

    def to_dict(self) -> dict:
        return record_dict(self)
