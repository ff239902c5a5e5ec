"""Lineage: where a stage result came from (the "lineage" key of every stats JSON, packtrain.stages.results).

    Lineage(git_sha="4cff369e...", code_version="0.1.0+g4cff369e1a2b",
            input_md5={"packs": "9a2b....dir", "tokens": "bbe02f94..."},
            data_version="894677b4....dir", tokenizer_hash="sha256:5f1c...")

`make_lineage` builds a stage's lineage from the md5s of what it read and its upstream results' lineage
(`upstream_lineage(path)`); `_check_keys` is the strict key check every result class and Lineage share.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packtrain.errors import InputDataError


def _refuse(cls_name: str, source: str, problem: str) -> InputDataError:
    return InputDataError(f"{source}: {problem} for {cls_name}")


def _check_keys(cls, d: Any, source: str) -> None:
    """Unknown or missing required keys → InputDataError naming `source`, the key and what is allowed."""
    if not isinstance(d, dict):
        raise InputDataError(f"{source}: expected a JSON object for {cls.__name__}, got {type(d).__name__}")
    from packtrain.record_fields import recorded_fields

    fields = {f.name: f for f in sorted(recorded_fields(cls), key=lambda f: f.name == "lineage")}   # as written
    allowed = [*fields, *getattr(cls, "DERIVED_KEYS", ())]   # + what the library's to_dict adds
    unknown = [k for k in d if k not in allowed]
    if unknown:
        raise _refuse(cls.__name__, source, f"unknown key {unknown[0]!r} (allowed: {', '.join(allowed)})")
    missing = [n for n, f in fields.items() if n not in d and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise _refuse(cls.__name__, source, f"missing required key {missing[0]!r}"
                      + (f" (and {', '.join(missing[1:])})" if len(missing) > 1 else ""))


@dataclass(frozen=True)
class Lineage:
    """Where a stage's output came from (module doc)."""

    git_sha: str | None                      # HEAD of the code that ran (packtrain.versioning.git_sha)
    code_version: str                        # "0.1.0+g<sha12>", or the package version outside git
    input_md5: dict[str, str]                # DVC md5 per input artifact read
    data_version: str | None                 # DVC md5 of the chain's source data
    tokenizer_hash: str | None = None        # 'sha256:<hex>' of the tokenizer (tokenize onwards)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, source: str = "lineage") -> Lineage:
        _check_keys(cls, d, f"{source} (key 'lineage')")
        return cls(**{**d, "input_md5": dict(d["input_md5"] or {})})


def upstream_lineage(path: str | Path) -> Lineage | None:
    """The lineage in an upstream stage's stats file at `path`: None when the file does not exist or holds no
    "lineage" key (the library functions — pack_dataset, tokenize_documents, the synthetic training inputs —
    write the same file names without one: the chain then starts at the stage reading it); a "lineage" that
    does not parse is an InputDataError naming the file."""
    data = read_json_file(path)
    if not isinstance(data, dict) or "lineage" not in data:
        return None
    return Lineage.from_dict(data["lineage"], str(path))


def documents_data_version(docs: str | Path | None) -> str | None:
    """The source data version (lineage data_version) of the documents at `docs` (an ingest output: its
    directory or its documents.parquet), from the ingest result beside them; None without one."""
    if docs is None:
        return None
    docs = Path(docs)
    lin = upstream_lineage((docs if docs.is_dir() else docs.parent) / "ingest_result.json")
    return lin.data_version if lin is not None else None


def read_json_file(path: str | Path) -> Any:
    """The parsed JSON at `path`, None when the file does not exist; invalid JSON is an InputDataError naming it."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputDataError(f"{path}: not valid JSON: {e}") from None


def make_lineage(inputs: dict[str, str | None], *upstream: Lineage | None,
                 tokenizer_hash: str | None = None) -> Lineage:
    """The lineage of a stage that read `inputs` ({artifact: DVC md5}), continuing the upstream chains.

    data_version: the first upstream's that has one, else the first input's md5 (the chain starts here).
    tokenizer_hash: the one given (measured by this stage), else the first upstream's.
    >>> make_lineage({"documents": "aa"}).data_version, make_lineage({"tokens": "bb"}, Lineage(
    ...     git_sha=None, code_version="0", input_md5={}, data_version="aa", tokenizer_hash="t")).data_version
    ('aa', 'aa')
    """
    from packtrain.versioning import code_version, git_sha

    md5s = {k: v for k, v in inputs.items() if v}
    ups = [u for u in upstream if u is not None]
    data_version = next((u.data_version for u in ups if u.data_version), None) or next(iter(md5s.values()), None)
    tok = tokenizer_hash or next((u.tokenizer_hash for u in ups if u.tokenizer_hash), None)
    return Lineage(git_sha=git_sha(), code_version=code_version(), input_md5=md5s, data_version=data_version,
                   tokenizer_hash=tok)
