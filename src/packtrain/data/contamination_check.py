"""The contamination check of a documents table: what the validate and tokenize stages call.

    check_table(path, cfg, sources)          every contaminated training document of documents.parquet (the
                                             pure packtrain.data.contamination.find_contamination on its texts)
    add_problem_column(df, path, cfg, ...)   validate: the check + the suite's `contamination_problem` column
    contaminated_ids / write_without         tokenize under policy drop: the same documents, left out
    contamination_message / log_line         what a failed, dropped or warned check says

What is compared with (the run's suites, its held-out split, `against`) is packtrain.data.contamination_sources.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, cast

from packtrain.data.contamination import find_contamination

if TYPE_CHECKING:
    from packtrain.config.data import ContaminationConfig
    from packtrain.data.contamination_sources import EvalSources


def table_documents(path: Path, batch_rows: int = 2048) -> Iterator[tuple[int, str]]:
    """(doc_id, text) of a documents.parquet, streamed; rows whose text is not a string are skipped (the
    text_not_null / text_type expectations report them)."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path, pre_buffer=False)
    for rb in pf.iter_batches(batch_size=batch_rows, columns=["doc_id", "text"]):
        for doc_id, text in zip(rb.column(0).to_pylist(), rb.column(1).to_pylist(), strict=True):
            if isinstance(text, str) and isinstance(doc_id, int):
                yield doc_id, text


def check_table(path: Path, cfg: ContaminationConfig, sources: EvalSources | None = None) -> dict | None:
    """The contamination check of a documents table (None when there is nothing to check against). `sources`:
    what to compare with (packtrain.data.contamination_sources.sources_of: the run's suites, its held-out
    split, `against`); None → `cfg.against` alone. The held-out split's documents are eval documents, never
    checked themselves. Returns

        {"ngram", "min_ngram", "min_coverage", "policy", "against", "suites", "held_out", "champion_domain"
         (what measures the champion's domain: a line, or None without a champion), "eval_documents",
         "eval_ngrams", "eval_too_short", "documents" (checked: the training split), "held_out_documents",
         "contaminated" (count), "by_suite" ([[suite, contaminated documents]]), "overlaps": [{"doc_id", "source", "suite", "eval_file", "eval_record", "ngram",
         "shared_ngrams", "coverage"}, ...]}   # every contaminated document, in table order

    `suite` names the suite (or `against` entry) the eval document belongs to; `source` the document's file:line."""
    import numpy as np
    import pyarrow.parquet as pq

    from packtrain.data.contamination_sources import HELD_OUT, EvalSources, read_sources

    src = sources if sources is not None else EvalSources(tuple(cfg.against))
    if src.empty:
        return None
    cols = set(pq.ParquetFile(path).schema_arrow.names)
    if not {"doc_id", "text"} <= cols:
        return None   # validate's columns_present names what is missing; tokenize refuses such a table itself
    evals = read_sources(src, cfg.text_field)
    t = pq.read_table(path, columns=["doc_id", "source"] if "source" in cols else ["doc_id"])
    ids = t.column("doc_id").to_pylist()
    where = t.column("source").to_pylist() if "source" in cols else [f"doc_id {d}" for d in ids]
    held: set[int] = set()
    if src.held_out_fraction is not None and ids and all(isinstance(d, int) for d in ids):
        from packtrain.data.split import split_eval

        split = split_eval(np.asarray(ids, dtype=np.int64), src.held_out_fraction)
        held = {d for d, s in zip(ids, split.tolist(), strict=True) if s}   # SPLIT_EVAL = 1
    sources_by_id = dict(zip(ids, where, strict=True))
    if held:
        evals += [((HELD_OUT, str(path), sources_by_id[d]), text) for d, text in table_documents(path) if d in held]
    report = find_contamination(((d, x) for d, x in table_documents(path) if d not in held), evals, cfg.ngram,
                                min_coverage=cfg.min_coverage, min_ngram=cfg.min_ngram)
    overlaps = []
    for o in report.overlaps:
        suite, eval_file, record = cast("tuple[str, str, str]", o.eval_id)   # as read_sources names them
        overlaps.append({"doc_id": o.doc_id, "source": sources_by_id.get(o.doc_id), "suite": suite,
                         "eval_file": eval_file, "eval_record": record, "ngram": o.ngram,
                         "shared_ngrams": o.shared_ngrams, "coverage": o.coverage})
    champ = src.champion
    suites = [sc.name for _, sc in src.suites] + ([champ.suite.name] if champ and champ.suite is not None else [])
    return {"ngram": cfg.ngram, "min_ngram": cfg.min_ngram, "min_coverage": cfg.min_coverage, "policy": cfg.policy,
            "against": list(src.against), "suites": suites, "held_out": src.held_out_fraction is not None,
            "champion_domain": champ.line if champ else None, "eval_documents": report.eval_documents,
            "eval_ngrams": report.eval_ngrams, "eval_too_short": report.eval_too_short,
            "documents": report.train_documents, "held_out_documents": len(held),
            "contaminated": len(overlaps), "by_suite": by_suite(overlaps), "overlaps": overlaps}


def by_suite(overlaps: list[dict]) -> list[list]:
    """[[suite, contaminated documents], ...] in order of first appearance (pairs, not a dict: a suite name such as
    "recent (held-out split)" is no MLflow metric name): [{"suite": "champion_domain"}, ...] →
    [["champion_domain", 3]]."""
    out: dict[str, int] = {}
    for o in overlaps:
        out[o["suite"]] = out.get(o["suite"], 0) + 1
    return [[k, v] for k, v in out.items()]


def describe(o: dict, with_source: bool = True) -> str:
    """'train.jsonl:7 (doc_id 6) overlaps qa.jsonl:2 of suite evals/qa.jsonl on "the quick brown fox ..."'
    (the n-gram cut at 8 words); without the source: 'overlaps qa.jsonl:2 of suite ...'."""
    words = o["ngram"].split()
    shown = " ".join(words[:8]) + (" ..." if len(words) > 8 else "")
    head = f'{o["source"]} (doc_id {o["doc_id"]}) ' if with_source else ""
    part = f' ({o["coverage"]:.0%} of it)' if o.get("coverage", 1) < 1 else ""
    return f'{head}overlaps {o["eval_record"]} of suite {o["suite"]}{part} on "{shown}"'


def problem_column(found: dict | None, doc_ids: list) -> list[str | None]:
    """The validate suite's `contamination_problem` column: per row of `doc_ids`, `describe` without the
    source (the report adds it), or None."""
    by_id = {o["doc_id"]: o for o in (found or {}).get("overlaps", [])}
    return [describe(o, with_source=False) if (o := by_id.get(d)) else None for d in doc_ids]


def add_problem_column(df, path: Path, cfg: ContaminationConfig, sources: EvalSources | None = None
                       ) -> dict | None:
    """The validate stage's hook: `check_table(path, cfg, sources)` (read from the file: the suite's frame
    holds text digests) and its per-row `contamination_problem` column added to `df`; None (and no column) when
    there is nothing to check against or the table has no doc_id/text columns (columns_present reports that)."""
    import pandas as pd

    if not {"doc_id", "text"} <= set(df.columns):
        return None
    found = check_table(path, cfg, sources)
    if found is None:
        return None
    df["contamination_problem"] = pd.Series(problem_column(found, df["doc_id"].tolist()), dtype=object)
    return found


def counts_as_failure(name: str, cfg: ContaminationConfig) -> bool:
    """Whether a failed expectation fails the suite: every one does, but contamination under drop / warn."""
    return name != "contamination" or cfg.policy == "fail"


def contamination_message(found: dict, shown: int = 10) -> str:
    """'2 document(s) overlap the eval data (13-gram, validate.contamination.policy=fail): <describe>; ...'
    with what to do; the first `shown` documents, the rest counted."""
    ov = found["overlaps"]
    more = f"; ... ({len(ov) - shown} more in the report)" if len(ov) > shown else ""
    return (f"{len(ov)} training document(s) overlap the eval data ({found['ngram']}-gram, "
            f"validate.contamination.policy={found['policy']}): " + "; ".join(map(describe, ov[:shown])) + more
            + ". Remove them from the source, or pass --set validate.contamination.policy=drop to train without "
            "them (tokenize leaves exactly these documents out)")


def contaminated_ids(path: Path, cfg: ContaminationConfig, sources: EvalSources | None = None) -> list[int]:
    """The doc_ids tokenize leaves out: those `check_table` finds under policy drop ([] otherwise). The
    same pure check the validate stage ran on the same table and eval sources, so exactly the documents its
    report lists (`dropped` in validate_result.json)."""
    if cfg.policy != "drop":
        return []
    found = check_table(path, cfg, sources)
    return [o["doc_id"] for o in found["overlaps"]] if found else []


def write_without(path: Path, doc_ids: list[int], dst: Path) -> Path:
    """A copy of the documents table `path` without the rows of `doc_ids` at `dst` (schema and order kept,
    streamed 4,096 rows at a time); returns `dst`. The input is only read."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path, pre_buffer=False)
    drop = pa.array(sorted(set(doc_ids)), type=pa.int64())
    with pq.ParquetWriter(dst, pf.schema_arrow) as w:
        for rb in pf.iter_batches(batch_size=4096):
            keep = pc.invert(pc.is_in(rb.column("doc_id").cast(pa.int64()), value_set=drop))
            w.write_batch(rb.filter(keep))
    return dst


def checked_against(found: dict) -> str:
    """'suites wordorder, replay, champion_domain; the held-out split (37 documents); against evals/qa.jsonl'
    (what was read), and the plain line when the champion's held-out documents could not be read."""
    parts = [f"suite(s) {', '.join(found['suites'])}"] if found.get("suites") else []
    if found.get("held_out"):
        parts.append(f"the held-out split ({found['held_out_documents']} documents, not checked themselves)")
    if found.get("against"):
        parts.append(f"against {', '.join(found['against'])}")
    if unguarded := unguarded_champion(found):
        parts.append(f"{unguarded} (not checked against)")
    return "; ".join(parts) or "nothing"


def unguarded_champion(found: dict) -> str | None:
    """The check's "nothing measures the champion's domain: …" line (its documents not found: not checked)."""
    from packtrain.evaluate.champion_domain import UNGUARDED

    line = found.get("champion_domain") or ""
    return line if line.startswith(UNGUARDED) else None


def log_line(found: dict) -> str:
    """The stderr line of a drop / warn run: what was found and what happens to it."""
    what = {"drop": "dropped from training (tokenize leaves them out)", "warn": "kept and trained on (policy warn)",
            "fail": "refused"}[found["policy"]]
    ov = found["overlaps"]
    return (f"validate: contamination: {len(ov)} of {found['documents']} training document(s) overlap the eval "
            f"data ({found['ngram']}-gram; {checked_against(found)}), {what}"
            + (": " + "; ".join(map(describe, ov[:10])) if ov else "")
            + (f"; ... ({len(ov) - 10} more in validate_result.json)" if len(ov) > 10 else ""))
