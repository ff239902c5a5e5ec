"""Eval-set contamination: word n-gram overlap of training documents with evaluation documents.

GPT-3 (Brown et al. 2020, appendix C) and lm-eval's decontamination: normalise both sides, split into words,
and call a training document contaminated when it shares one word n-gram (13 by default) with an eval
document. Normalisation (`normalize`): lowercase, delete punctuation (Unicode non-word, non-space characters
and `_`, as lm-eval's Janitor deletes `string.punctuation`), split on any run of whitespace:

    normalize("The Quick, brown fox's\\n  TAIL!")  →  ['the', 'quick', 'brown', 'foxs', 'tail']

    eval      e0 "a b c d e f"                     n = 3: {abc, bcd, cde, def}
    train     t0 "x y a b c z"                     {xya, yab, abc, bcz}   → abc shared: contaminated by e0
              t1 "a b x c d y"                     {abx, bxc, xcd, cdy}   → clean (words shared, no 3-gram)

A document with fewer than n words has no n-gram and is never reported (nor does a short eval document
contaminate anything: a 5-word answer such as "the answer is 42 ." would match everywhere).

How it is fast: a word's id is its str hash (a dict lookup per word cost 8× more); a batch of documents
becomes one int64 array of ids and its n-grams a vectorised polynomial hash mod 2^64 over n shifted views;
the eval hashes are sorted once and each batch of 512 training documents is one `np.searchsorted`. A hash
hit is confirmed by comparing the n word ids themselves, so an n-gram hash collision reports nothing (a false
report would need 13 word-hash collisions at once).

Measured on this 2-core machine (`python -m packtrain.data.contamination --bench`): 10,000 training
documents of 300 words (3.0 M words, 20 MB) against 1,000 eval documents of 60 words, n 13: 1.7 s of CPU
(≈ 1.8 M words/s; 5.3 s wall while the machine was shared at load 8), the 100 planted documents
found exactly. ASCII text is normalised with `str.translate` (30× the regex used for other text).

`find_contamination(train_docs, eval_docs, n)` is pure: any iterables of (doc_id, text), ids of any
hashable type (the validate stage passes doc_ids and (suite, eval file, record) triples), and returns a
`ContaminationReport`. Reading eval files (.txt/.jsonl/.parquet) is `read_eval_documents`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

if TYPE_CHECKING:
    from packtrain.config.data import ContaminationConfig

_PUNCT = re.compile(r"[^\w\s]|_")
_ASCII_PUNCT = str.maketrans("", "", "".join(c for c in map(chr, range(128)) if _PUNCT.match(c)))
"""The same deletion for ASCII text as a translate table: 30× faster than the regex."""
_MULT = np.uint64(0x9E3779B97F4A7C15)   # odd: the polynomial hash is a bijection per position


def normalize(text: str) -> list[str]:
    """Lowercase, punctuation deleted, whitespace-split words (module doc).

    >>> normalize("Hello,   World! it's  A_B")
    ['hello', 'world', 'its', 'ab']
    >>> normalize("Ça  «marche»: très_bien")
    ['ça', 'marche', 'trèsbien']
    """
    text = text.lower()
    return (text.translate(_ASCII_PUNCT) if text.isascii() else _PUNCT.sub("", text)).split()


@dataclass
class Overlap:
    """One contaminated training document and the first eval document it shares an n-gram with."""

    doc_id: Hashable              # the training document's id as given
    eval_id: Hashable             # the eval document's id as given
    ngram: str                    # the first shared n-gram, normalised words joined by spaces
    shared_ngrams: int            # n-gram positions of the training document found on the eval side


@dataclass
class ContaminationReport:
    """What `find_contamination` found. `overlaps` is in training-document order, one entry per document."""

    ngram: int
    train_documents: int
    eval_documents: int
    eval_ngrams: int              # distinct eval n-grams
    eval_too_short: int           # eval documents with fewer than `ngram` words (no n-gram)
    overlaps: list[Overlap] = field(default_factory=list)

    @property
    def doc_ids(self) -> list[Hashable]:
        return [o.doc_id for o in self.overlaps]

    def to_dict(self) -> dict:
        return asdict(self)


def _word_ids(words: Iterable[str], count: int = -1) -> np.ndarray:
    """int64 [len(words)]: each word's str hash (the same word → the same id within one process)."""
    return np.fromiter(map(hash, words), dtype=np.int64, count=count)


def _ngram_hashes(ids: np.ndarray, n: int) -> np.ndarray:
    """uint64 [len(ids) - n + 1]: Σ_k ids[i+k]·M^(n-1-k) mod 2^64 (Horner over n shifted views)."""
    m = len(ids) - n + 1
    h = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * _MULT + ids[k: k + m].astype(np.uint64)
    return h


class _EvalIndex:
    """Sorted n-gram hashes of the eval documents, each with (eval doc index, start position)."""

    def __init__(self, eval_docs: Iterable[tuple[Hashable, str]], n: int):
        self.n, self.ids, self.words = n, [], []
        self.too_short = 0
        hashes, owner, start = [], [], []
        for i, (eid, text) in enumerate(eval_docs):
            self.ids.append(eid)
            w = _word_ids(normalize(text))
            self.words.append(w)
            if len(w) < n:
                self.too_short += 1
                continue
            h = _ngram_hashes(w, n)
            hashes.append(h)
            owner.append(np.full(len(h), i, dtype=np.int64))
            start.append(np.arange(len(h), dtype=np.int64))
        cat = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
        order = np.argsort(cat, kind="stable")   # stable: a hash shared by several eval docs → the first listed
        self.hashes = cat[order]
        self.owner = np.concatenate(owner)[order] if owner else np.zeros(0, dtype=np.int64)
        self.start = np.concatenate(start)[order] if start else np.zeros(0, dtype=np.int64)

    def distinct(self) -> int:
        return int(len(np.unique(self.hashes)))

    def match_batch(self, docs: list[list[str]]) -> list[tuple[int, int, int] | None]:
        """Per document: (eval doc index, word position, shared n-gram count) of its first confirmed shared
        n-gram, or None. The documents are joined with the id of "" (never a word) between them, so an n-gram
        across two documents matches no eval n-gram."""
        n = self.n
        out: list[tuple[int, int, int] | None] = [None] * len(docs)
        if not len(self.hashes) or not docs:
            return out
        lens = np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=len(docs))
        ids = _word_ids(itertools.chain.from_iterable(d + [""] for d in docs), int(lens.sum()))   # "": separator
        if len(ids) < n:
            return out
        h = _ngram_hashes(ids, n)
        pos = np.minimum(np.searchsorted(self.hashes, h), len(self.hashes) - 1)
        hit = np.flatnonzero(self.hashes[pos] == h)
        if not len(hit):
            return out
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        which = np.searchsorted(starts, hit, side="right") - 1   # the document of each hit
        for i, d in zip(hit.tolist(), which.tolist(), strict=True):
            j = int(pos[i])
            while j < len(self.hashes) and self.hashes[j] == h[i]:   # confirm against the words (collisions)
                e, s = int(self.owner[j]), int(self.start[j])
                if np.array_equal(self.words[e][s: s + n], ids[i: i + n]):
                    prev = out[d]
                    out[d] = (e, i - int(starts[d]), 1) if prev is None else (prev[0], prev[1], prev[2] + 1)
                    break
                j += 1
        return out


def find_contamination(train_docs: Iterable[tuple[Hashable, str]], eval_docs: Iterable[tuple[Hashable, str]],
                       n: int = 13, batch_docs: int = 512) -> ContaminationReport:
    """The training documents sharing a word n-gram with an eval document (module doc).

    >>> r = find_contamination([(0, "x y a b c z"), (1, "a b x c d y")], [("e0", "a b c d e f")], n=3)
    >>> [(o.doc_id, o.eval_id, o.ngram) for o in r.overlaps]
    [(0, 'e0', 'a b c')]
    """
    if n < 1:
        raise ValueError(f"n-gram size must be ≥ 1, got {n}")
    index = _EvalIndex(eval_docs, n)
    overlaps, n_train = [], 0
    it = iter(train_docs)
    while batch := list(itertools.islice(it, batch_docs)):
        n_train += len(batch)
        words = [normalize(text) for _, text in batch]
        for (doc_id, _), w, found in zip(batch, words, index.match_batch(words), strict=True):
            if found is not None:
                e, i, count = found
                overlaps.append(Overlap(doc_id=doc_id, eval_id=index.ids[e], ngram=" ".join(w[i: i + n]),
                                        shared_ngrams=count))
    return ContaminationReport(ngram=n, train_documents=n_train, eval_documents=len(index.ids),
                               eval_ngrams=index.distinct(), eval_too_short=index.too_short, overlaps=overlaps)


def read_eval_documents(paths: Iterable[str | Path], text_field: str = "text"
                        ) -> list[tuple[tuple[str, str, str], str]]:
    """[((suite, eval file, record locator), text)] of every eval file — `suite` is the entry of `paths` the
    file was found under (the file itself, or its folder): .txt one record per blank-line-separated block
    (`a.txt:12`), .jsonl per line (`q.jsonl:3`; the `text_field`, or a chat / prompt-completion record's
    text), .parquet per row (`p.parquet#41`); a folder: every such file in it. Read with ingest's readers, so a
    missing, empty or malformed eval file is the same InputDataError (exit 3) naming the file and line."""
    from packtrain.data.source_files import discover_files
    from packtrain.data.sources import SkippedRecord, read_jsonl, read_parquet, read_txt

    out: list[tuple[tuple[str, str, str], str]] = []
    for p in paths:
        root = Path(p)
        for f in discover_files(root).files:
            label = str(root) if root.is_file() else str(root / f.name)
            if f.kind == "txt":
                docs = ((t, loc) for t, loc in read_txt(f, "paragraph", max_chars=1 << 62))
            else:   # on_bad="fail" (the default) never yields a SkippedRecord: a bad eval record is an error
                read = read_jsonl if f.kind == "jsonl" else read_parquet
                docs = ((d[0], d[1]) for d in read(f, text_field) if not isinstance(d, SkippedRecord))
            out.extend(((str(p), label, loc), text) for text, loc in docs)
    return out


def table_documents(path: Path, batch_rows: int = 2048) -> Iterator[tuple[int, str]]:
    """(doc_id, text) of a documents.parquet, streamed; rows whose text is not a string are skipped (the
    text_not_null / text_type expectations report them)."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path, pre_buffer=False)
    for rb in pf.iter_batches(batch_size=batch_rows, columns=["doc_id", "text"]):
        for doc_id, text in zip(rb.column(0).to_pylist(), rb.column(1).to_pylist(), strict=True):
            if isinstance(text, str) and isinstance(doc_id, int):
                yield doc_id, text


def check_table(path: Path, cfg: ContaminationConfig,
                evals: list[tuple[tuple[str, str, str], str]] | None = None) -> dict | None:
    """The contamination check of a documents table against `cfg.against` (None when `against` is empty and
    no `evals` are given). `evals`: eval records already read, [((suite, eval file, record), text)] — how named
    eval suites (each several files) can be checked without an `against` list. Returns

        {"ngram", "policy", "against", "eval_documents", "eval_ngrams", "eval_too_short", "documents" (checked),
         "contaminated" (count), "overlaps": [{"doc_id", "source", "suite", "eval_file", "eval_record",
         "ngram", "shared_ngrams"}, ...]}   # every contaminated document, in table order

    `suite` is the `against` entry the eval file was found under; `source` the document's file:line."""
    import pyarrow.parquet as pq

    if not cfg.against and evals is None:
        return None
    if evals is None:
        evals = read_eval_documents(cfg.against, cfg.text_field)
    report = find_contamination(table_documents(path), evals, cfg.ngram)
    bad = set(report.doc_ids)
    sources: dict[int, str] = {}
    if bad:
        t = pq.read_table(path, columns=["doc_id", "source"])
        for doc_id, src in zip(t.column("doc_id").to_pylist(), t.column("source").to_pylist(), strict=True):
            if doc_id in bad:
                sources.setdefault(doc_id, src)
    overlaps = []
    for o in report.overlaps:
        suite, eval_file, record = cast("tuple[str, str, str]", o.eval_id)   # as read_eval_documents names them
        overlaps.append({"doc_id": o.doc_id, "source": sources.get(cast(int, o.doc_id)), "suite": suite,
                         "eval_file": eval_file, "eval_record": record, "ngram": o.ngram,
                         "shared_ngrams": o.shared_ngrams})
    return {"ngram": cfg.ngram, "policy": cfg.policy, "against": list(cfg.against),
            "eval_documents": report.eval_documents, "eval_ngrams": report.eval_ngrams,
            "eval_too_short": report.eval_too_short, "documents": report.train_documents,
            "contaminated": len(overlaps), "overlaps": overlaps}


def describe(o: dict, with_source: bool = True) -> str:
    """'train.jsonl:7 (doc_id 6) overlaps qa.jsonl:2 of suite evals/qa.jsonl on "the quick brown fox ..."'
    (the n-gram cut at 8 words); without the source: 'overlaps qa.jsonl:2 of suite ...'."""
    words = o["ngram"].split()
    shown = " ".join(words[:8]) + (" ..." if len(words) > 8 else "")
    head = f'{o["source"]} (doc_id {o["doc_id"]}) ' if with_source else ""
    return f'{head}overlaps {o["eval_record"]} of suite {o["suite"]} on "{shown}"'


def problem_column(found: dict | None, doc_ids: list) -> list[str | None]:
    """The validate suite's `contamination_problem` column: per row of `doc_ids`, `describe` without the
    source (the report adds it), or None."""
    by_id = {o["doc_id"]: o for o in (found or {}).get("overlaps", [])}
    return [describe(o, with_source=False) if (o := by_id.get(d)) else None for d in doc_ids]


def add_problem_column(df, path: Path, cfg: ContaminationConfig) -> dict | None:
    """The validate stage's hook: with `cfg.against` set, `check_table(path)` (read from the file: the
    suite's frame holds text digests) and its per-row `contamination_problem` column added to `df`; None (and
    no column) when the check is off or the table has no doc_id/text columns (columns_present reports that)."""
    import pandas as pd

    if not cfg.against or not {"doc_id", "text"} <= set(df.columns):
        return None
    found = check_table(path, cfg)
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


def contaminated_ids(path: Path, cfg: ContaminationConfig) -> list[int]:
    """The doc_ids tokenize leaves out: those `check_table` finds under policy drop ([] otherwise). The
    same pure check the validate stage ran on the same table and eval files, so exactly the documents its
    report lists (`dropped` in validate_stats.json)."""
    if cfg.policy != "drop" or not cfg.against:
        return []
    found = check_table(path, cfg)
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


def log_line(found: dict) -> str:
    """The stderr line of a drop / warn run: what was found and what happens to it."""
    what = {"drop": "dropped from training (tokenize leaves them out)", "warn": "kept and trained on (policy warn)",
            "fail": "refused"}[found["policy"]]
    ov = found["overlaps"]
    return (f"validate: contamination: {len(ov)} of {found['documents']} document(s) overlap the eval data "
            f"({found['ngram']}-gram), {what}" + (": " + "; ".join(map(describe, ov[:10])) if ov else "")
            + (f"; ... ({len(ov) - 10} more in validate_stats.json)" if len(ov) > 10 else ""))


def _bench(n_train: int = 10_000, n_eval: int = 1_000, planted: int = 100) -> dict:
    """The docstring's figure: synthetic words, `planted` training documents holding an eval passage."""
    import time

    rng = np.random.default_rng(0)
    vocab = np.array([f"w{i}" for i in range(50_000)])
    evals = [(("bench", "bench", f"e{i}"), " ".join(rng.choice(vocab, 60))) for i in range(n_eval)]
    train = []
    for i in range(n_train):
        words = list(rng.choice(vocab, 300))
        if i < planted:
            words[100:100] = evals[i][1].split()[:20]
        train.append((i, " ".join(words) + "."))
    t0, c0 = time.perf_counter(), time.process_time()
    r = find_contamination(train, evals, 13)
    s, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"train_documents": n_train, "words": sum(len(t.split()) for _, t in train),
            "mb": round(sum(len(t) for _, t in train) / 1e6, 1), "seconds": round(s, 2), "cpu_seconds": round(cpu, 2),
            "found": len(r.overlaps), "exact": r.doc_ids == list(range(planted))}


if __name__ == "__main__":
    import json
    import sys

    if "--bench" in sys.argv:
        print(json.dumps(_bench()))
