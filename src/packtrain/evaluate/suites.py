"""Evaluation suites: frozen sets of held-out documents (or lm-eval tasks) scored for challenger and champion.

    evaluate.suites:                                        → Suite
      - {name: replay, role: regression, path: old.jsonl}     TextSuite: docs, md5 (DVC md5 of the file), n
      - {name: arith, role: task, path: tasks/arith.yaml}     TaskSuite: the YAML, its data files' md5
      - {name: noisy, role: regression, path: old.jsonl,      TextSuite of the perturbed documents
         perturb: {kind: case, rate: 0.05, seed: 0}}
    + suite "recent": this run's held-out split (recent_suite, the eval packs decoded)

A document is a sequence of pieces, each scored or context only; its UTF-8 byte count is the scored pieces'
bytes, the same for every tokenizer (so bits per byte compare across tokenizers):

    file        record                                   pieces (scored marked *)
    .txt        paragraph (documents split on blank lines) *"text"
    .jsonl      {"text": "..."}                          *"text"
    .parquet    {"prompt": "2+2=", "completion": "4"}     "2+2="  *"4"
                {"messages": [{"role": "user", ...},      "<|im_start|>user\\n" "Hi" "<|im_end|>\\n"
                              {"role": "assistant", ...}]} "<|im_start|>assistant\\n" *"Yo" *"<|im_end|>" "\\n"

Errors name the suite, the field (`evaluate.suites[i].path`) and what is allowed: a missing file (exit 5), an
unknown format, a malformed record or task YAML, a suite without documents (exit 3).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from packtrain.errors import InputDataError, MissingDataError
from packtrain.evaluate.suite_types import Piece, Suite, SuiteDoc, TextSuite

if TYPE_CHECKING:
    from packtrain.config.evaluate import EvalConfig, SuiteConfig

TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
TASK_SUFFIXES = (".yaml", ".yml")
RECENT = "recent"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"




def _where(i: int, sc: SuiteConfig) -> str:
    return f"evaluate.suites[{i}] ({sc.name!r})"


def load_suites(cfg: EvalConfig, base: Path | None = None) -> list[Suite]:
    """Every configured suite, loaded and checked (module doc); `base` resolves relative paths (default cwd)."""
    base = Path.cwd() if base is None else Path(base)
    return [load_suite(i, sc, base) for i, sc in enumerate(cfg.suites)]


def load_suite(i: int, sc: SuiteConfig, base: Path) -> Suite:
    from packtrain.versioning import data_md5

    path = suite_path(sc.path, base)
    where = _where(i, sc)
    if not path.is_file():
        raise MissingDataError(f"{where}.path: {path} does not exist (a {', '.join(TEXT_SUFFIXES)} file of "
                               f"held-out documents or an lm-eval task YAML)")
    suffix = path.suffix.lower()
    if suffix in TASK_SUFFIXES:
        if sc.perturb is not None:
            raise InputDataError(f"{where}.perturb: only text suites ({', '.join(TEXT_SUFFIXES)}) can be perturbed")
        from packtrain.evaluate.tasks import load_task_suite

        return load_task_suite(where, sc, path)
    if suffix not in TEXT_SUFFIXES:
        raise InputDataError(f"{where}.path: {path.name} has an unknown format {suffix or '(no suffix)'!r} "
                             f"(allowed: {', '.join(TEXT_SUFFIXES + TASK_SUFFIXES)})")
    if sc.task is not None:
        raise InputDataError(f"{where}.task: only lm-eval task YAML suites take a task name")
    docs = read_documents(path, where)
    n_total = len(docs)
    if sc.max_documents is not None:
        docs = docs[: sc.max_documents]
    if not docs or not any(d.n_bytes for d in docs):
        raise InputDataError(f"{where}.path: {path} holds no document with text to score (empty file, or only "
                             "empty texts/completions)")
    perturb = None
    if sc.perturb is not None:
        from packtrain.evaluate.perturb import perturb_docs

        perturb = sc.perturb.model_dump()
        docs = perturb_docs(docs, sc.perturb.kind, sc.perturb.rate, sc.perturb.seed)
    return TextSuite(sc.name, sc.role, str(path), data_md5(path), docs, n_total, perturb)


RECIPES_PREFIX = "@recipes/"


def suite_path(value: str, base: Path) -> Path:
    """A suite path resolved: `@recipes/…` inside the recipes directory (the task files shipped with packtrain,
    e.g. @recipes/tasks/wordorder/wordorder.yaml), else relative to `base` (the working directory)."""
    if value.startswith(RECIPES_PREFIX):
        from packtrain.config import recipe_dir

        return (recipe_dir() / value[len(RECIPES_PREFIX):]).resolve()
    return (base / value).resolve()


def suite_files(value: str, base: Path) -> list[Path]:
    """The files a suite is read from: its file and, for a task YAML, each data file it names (a task's items live
    there: editing wordorder.jsonl changes no byte of wordorder.yaml). [] for a file that is not there; a YAML that
    names no readable data file is itself alone (the stage itself refuses both)."""
    p = suite_path(value, base)
    if not p.exists():
        return []
    files = [p]
    if p.suffix.lower() in (".yaml", ".yml"):
        from packtrain.evaluate.tasks import data_files, read_task_yaml

        try:
            files += [Path(f) for f in data_files(value, read_task_yaml(value, p), p.parent).values()]
        except (InputDataError, MissingDataError):
            pass
    return files


def suite_identity(value: str, base: Path) -> str:
    """A suite's files by content (suite_files: their DVC md5s), for the stage cache keys of evaluate and of
    validate / tokenize (their contamination check); "missing" for a file that is not there."""
    from packtrain.versioning import data_md5

    return " ".join(data_md5(f) for f in suite_files(value, base)) or "missing"


def read_documents(path: Path, where: str) -> list[SuiteDoc]:
    """The documents of a .txt / .jsonl / .parquet suite file (module doc)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".txt":
            text = path.read_text(encoding="utf-8")
            paras = [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text)]
            return [SuiteDoc(str(k), (Piece(p, True),)) for k, p in enumerate(x for x in paras if x.strip())]
        if suffix == ".jsonl":
            out = []
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputDataError(f"{where}.path: {path} line {n} is not JSON ({e.msg})") from None
                out.append(SuiteDoc(str(n), record_pieces(rec, f"{where}.path: {path} line {n}")))
            return out
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:   # pyarrow raises several types for a non-parquet file
            raise InputDataError(f"{where}.path: {path} is not a readable parquet file ({e})") from None
        return [SuiteDoc(str(k), record_pieces(r, f"{where}.path: {path} row {k}")) for k, r in enumerate(rows)]
    except UnicodeDecodeError as e:
        raise InputDataError(f"{where}.path: {path} is not UTF-8 ({e})") from None


def record_pieces(rec: object, where: str) -> tuple[Piece, ...]:
    """Pieces of one record: text | prompt + completion | messages (module doc)."""
    if isinstance(rec, dict) and isinstance(rec.get("messages"), str):
        try:
            rec = {**rec, "messages": json.loads(rec["messages"])}
        except json.JSONDecodeError:
            raise InputDataError(f"{where}: field 'messages' is a string that is not JSON") from None
    if isinstance(rec, dict) and isinstance(rec.get("text"), str):
        return (Piece(rec["text"], True),)
    if isinstance(rec, dict) and isinstance(rec.get("prompt"), str) and isinstance(rec.get("completion"), str):
        return Piece(rec["prompt"], False), Piece(rec["completion"], True)
    if isinstance(rec, dict) and isinstance(rec.get("messages"), list):
        pieces = []
        for k, m in enumerate(rec["messages"]):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise InputDataError(f"{where}: messages[{k}] must be an object with string 'role' and 'content'")
            learn = m["role"] == "assistant"
            pieces += [Piece(f"{IM_START}{m['role']}\n", False), Piece(m["content"], learn),
                       Piece(IM_END, learn), Piece("\n", False)]
        return tuple(pieces)
    keys = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
    raise InputDataError(f"{where}: a record needs a string 'text', string 'prompt' + 'completion', or a "
                         f"'messages' list (got {keys})")


def recent_suite(role: str, packs_eval_dir: Path, tokenizer, max_documents: int | None = None,
                 name: str = RECENT) -> TextSuite:
    """Suite "recent" (or `name`: the champion's held-out packs, packtrain.evaluate.champion_domain): the pipeline's held-out split, from the eval packs, one document per doc_id (chunks of a
    split document joined back in order), decoded with the tokenizer the packs were made with; with
    `max_documents` the first N by doc_id (evaluate.recent_max_documents). Scored as plain text by both models
    (a chat record's template markup is text here)."""
    import numpy as np

    from packtrain.packing.store import PackStore
    from packtrain.versioning import data_md5

    store = PackStore.open(packs_eval_dir)
    by_doc: dict[int, list[tuple[int, np.ndarray]]] = {}
    for p in range(store.n_packs):
        toks = store.pack_tokens(p)
        off = 0
        for doc_id, start, length in store.pack_segments(p):   # (doc_id, start in the document, length)
            by_doc.setdefault(int(doc_id), []).append((int(start), toks[off: off + int(length)]))
            off += int(length)
    docs = []
    for doc_id in sorted(by_doc)[:max_documents]:
        ids = np.concatenate([t for _, t in sorted(by_doc[doc_id], key=lambda x: x[0])]).tolist()
        text = tokenizer.decode(ids, skip_special_tokens=True)
        if text:
            docs.append(SuiteDoc(str(doc_id), (Piece(text, True),)))
    if not docs:
        raise InputDataError(f"suite {name!r}: the eval packs {packs_eval_dir} decode to no text")
    path = Path(packs_eval_dir).resolve()   # absolute: the registered version records it (heldout.path)
    return TextSuite(name, role, str(path), data_md5(path), docs, len(docs))  # type: ignore[arg-type]
