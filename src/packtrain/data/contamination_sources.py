"""What the contamination check (packtrain.data.contamination) compares the training documents with, by
default everything the run will score:

    source                          eval documents                                 suite named in the report
    evaluate.suites, text           each record's text (prompt + completion,       the suite's name ("replay")
                                    chat turns' contents)
    evaluate.suites, task (.yaml)   per item: doc_to_text + target_delimiter +     the suite's name ("wordorder")
                                    the gold choice (or doc_to_target), rendered
                                    from the task's own fields as lm-eval does;
                                    `doc_to_decontamination_query` when given;
                                    and the item as its data file stores it
                                    (the JSON record, its values in order)
    the held-out split ("recent")   the documents of this table that tokenize      "recent (held-out split)"
                                    holds out (tokenize.eval_fraction, the same
                                    doc_id hash): they are not checked
                                    themselves, only the training split is
    validate.contamination.against  .txt / .jsonl / .parquet records, or a task    the path as given
                                    YAML (.yaml/.yml) read as above
    the champion's held-out         with a champion (evaluate.against champion):   "champion_domain"
    documents (evaluate.suites:     the documents the evaluation scores as suite
    true)                           champion_domain, found as it finds them
                                    (packtrain.evaluate.champion_domain: version
                                    tag heldout.path, decoded with the champion's
                                    tokenizer); not found: not checked, the plain
                                    line "nothing measures the champion's
                                    domain: …" in the check's output

wordorder, for example: {"context": "    # skip empty entries and blank lines", "choices": ["for size in
range(key):", "in size range(key): for"], "label": 0} → "    # skip empty entries and blank lines for size
in range(key):" (11 words after normalisation).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packtrain.errors import InputDataError

if TYPE_CHECKING:
    from packtrain.config import RunConfig
    from packtrain.config.evaluate import SuiteConfig
    from packtrain.evaluate.champion_domain import ChampionDomain

HELD_OUT = "recent (held-out split)"
TASK_SUFFIXES = (".yaml", ".yml")
EvalDoc = tuple[tuple[str, str, str], str]
"""((suite, eval file, record locator), text)."""


@dataclass(frozen=True)
class EvalSources:
    """The eval side of one check: `against` paths, (index in evaluate.suites, its SuiteConfig), the
    held-out fraction (None: the held-out split is not an eval source) and the champion's domain (None: no
    champion; status unguarded: its documents were not found, only its line is reported)."""

    against: tuple[str, ...] = ()
    suites: tuple[tuple[int, SuiteConfig], ...] = ()
    held_out_fraction: float | None = None
    champion: ChampionDomain | None = None

    @property
    def empty(self) -> bool:
        return not self.against and not self.suites and self.held_out_fraction is None and self.champion is None


def sources_of(cfg: RunConfig, data_version: str | None = None) -> EvalSources:
    """The sources `validate.contamination` asks for in this run (module doc): each suite's documents as the
    evaluate stage scores them (its `max_documents`), unperturbed; a suite file listed twice (a perturbed copy
    of a regression suite) is read once, under its first name."""
    c = cfg.validate_.contamination
    seen: dict[str, tuple[int, SuiteConfig]] = {}
    if c.suites:
        for i, s in enumerate(cfg.evaluate.suites):
            seen.setdefault(s.path, (i, s.model_copy(update={"perturb": None})))
    held = cfg.tokenize.eval_fraction if c.held_out and cfg.tokenize.eval_fraction > 0 else None
    return EvalSources(tuple(c.against), tuple(seen.values()), held,
                       champion_documents(cfg, data_version) if c.suites else None)


def sources_identity(cfg: RunConfig, documents: str | Path | None = None) -> dict:
    """What `sources_of` reads, by content, for the validate and tokenize stage cache keys: each suite's files
    (packtrain.evaluate.suites.suite_identity), each `against` entry's DVC md5 and the champion's held-out
    documents (champion_domain_identity; `documents`: the stage's input). An eval file edited in place — an item
    added to a task's data file — is a miss, so the check runs against it instead of restoring a stale verdict."""
    from packtrain.evaluate.champion_domain import champion_domain_identity
    from packtrain.evaluate.suites import suite_identity
    from packtrain.versioning import data_md5

    c, parts = cfg.validate_.contamination, {}
    if c.suites and cfg.evaluate.suites:
        parts["suite_files"] = {s.name: suite_identity(s.path, Path.cwd()) for s in cfg.evaluate.suites}
    if c.suites and (champion := champion_domain_identity(cfg, documents)) is not None:
        parts["champion_domain"] = champion
    if c.against:
        parts["against_files"] = {a: data_md5(Path(a)) if Path(a).exists() else "missing" for a in c.against}
    return parts


def champion_documents(cfg: RunConfig, data_version: str | None = None) -> ChampionDomain | None:
    """The champion's held-out documents as the evaluation finds them (packtrain.evaluate.paired_scores:
    resolve_against, then measure_champion_domain, with no held-out packs of this run yet); None without a
    champion. `data_version`: this chain's source data (lineage data_version): a champion trained on it with
    this recipe held out this run's own held-out split (champion_domain.same_split), which the check reads
    already — status recent, nothing downloaded or added. Never an error: a registry, model or lineage that
    cannot be read is an unguarded ChampionDomain, whose line the check reports."""
    from packtrain.evaluate.champion_domain import (
        MD5_TAG,
        PATH_TAG,
        UNGUARDED,
        ChampionDomain,
        champion_version,
        same_split,
    )
    from packtrain.evaluate.paired_scores import measure_champion_domain, resolve_against
    from packtrain.secrets import redact_text

    if cfg.evaluate.against != "champion":
        return None
    _, version, tags = champion_version(cfg)
    if version is not None and same_split(tags, cfg, data_version):
        return ChampionDomain("recent", f"v{version}'s domain is this run's held-out split (same data version and "
                              "split settings): checked as the held-out split", tags.get(PATH_TAG), tags.get(MD5_TAG))
    try:
        against, note = resolve_against(cfg, "champion")
        if against is None:   # none yet, tracking off; or the registry cannot be read (that note is said)
            return ChampionDomain("unguarded", f"{UNGUARDED}: {note}") if "cannot be read" in note else None
        return measure_champion_domain(cfg.evaluate, against, None)
    except Exception as e:   # noqa: BLE001 - its download (registry, artifact store) or tokenizer: the evaluation
        # says it again; the check itself never fails for it
        return ChampionDomain("unguarded", f"{UNGUARDED}: the champion cannot be read ({type(e).__name__}: "
                              f"{redact_text(str(e))[:200]})")


def read_sources(src: EvalSources, text_field: str = "text", base: Path | None = None) -> list[EvalDoc]:
    """Every eval document of `against` and the suites (the held-out split is read from the table by the
    check). A missing file is the same error the evaluate stage would give, naming the suite."""
    from packtrain.evaluate.suite_types import TaskSuite
    from packtrain.evaluate.suites import load_suite

    base = Path.cwd() if base is None else base
    out: list[EvalDoc] = []
    for i, sc in src.suites:   # loaded and checked as the evaluate stage loads them: the same errors, earlier
        suite = load_suite(i, sc, base)
        if isinstance(suite, TaskSuite):
            out += [((sc.name, str(f), loc), text) for f, loc, text in task_documents(Path(suite.path), sc.name)]
        else:
            out += [((sc.name, suite.path, f"{Path(suite.path).name}:{d.doc_id}"), _plain(d.pieces)) for d in suite.docs]
    if src.champion is not None and src.champion.suite is not None:   # decoded packs: doc_id of the champion's table
        cs = src.champion.suite
        out += [((cs.name, cs.path, f"{Path(cs.path).name}:{d.doc_id}"), _plain(d.pieces)) for d in cs.docs]
    for value in src.against:
        path = Path(value)
        if path.is_file() and path.suffix.lower() in TASK_SUFFIXES:
            where = f"validate.contamination.against {value}"
            out += [((value, str(f), loc), text) for f, loc, text in task_documents(path, where)]
        else:
            out += read_against(value, text_field)
    return out


def read_against(value: str, text_field: str) -> list[EvalDoc]:
    """One `against` entry's text records (read_eval_documents, below), a .jsonl record
    without the text field refused with a hint naming the record's real text keys."""
    try:
        return read_eval_documents([value], text_field)
    except InputDataError as e:
        if f"no field {text_field!r}" not in str(e):
            raise
        raise InputDataError(_missing_field_hint(str(e).split(": line")[0], text_field)) from None


def read_eval_documents(paths: Iterable[str | Path], text_field: str = "text"
                        ) -> list[tuple[tuple[str, str, str], str]]:
    """[((suite, eval file, record locator), text)] of every eval file — `suite` is the entry of `paths` the
    file was found under (the file itself, or its folder): .txt one record per blank-line-separated block
    (`a.txt:12`), .jsonl per line (`q.jsonl:3`; the `text_field`, or a chat / prompt-completion record's
    text), .parquet per row (`p.parquet#41`); a folder: every such file in it. Read with ingest's readers, so a
    missing, empty or malformed eval file is the same InputDataError (exit 3) naming the file and line."""
    from packtrain.data.source_files import discover_files
    from packtrain.data.source_readers import SkippedRecord, read_jsonl, read_parquet, read_txt

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


def _missing_field_hint(file: str, text_field: str) -> str:
    """'<file>: a record has no field 'text' (its string fields: context; lists: choices). Set
    validate.contamination.text_field=context, or name the lm-eval task YAML beside it (wordorder.yaml) ...'"""
    path = Path(file)
    rec: dict = {}
    try:
        with open(path, encoding="utf-8") as fh:
            rec = next((json.loads(x) for x in fh if x.strip()), {})
    except (OSError, ValueError):
        pass
    strings = sorted(k for k, v in rec.items() if isinstance(v, str))
    lists = sorted(k for k, v in rec.items() if isinstance(v, list))
    best = max(strings, key=lambda k: len(rec[k]), default=None)
    yamls = sorted(p.name for p in path.parent.glob("*.y*ml")) if path.parent.is_dir() else []
    fields = f"its string fields: {', '.join(strings) or 'none'}" + (f"; lists: {', '.join(lists)}" if lists else "")
    task = (f"; it looks like an lm-eval task's data: name the task YAML ({path.parent / yamls[0]}) instead, which "
            "builds each item's document from its own fields (text + gold choice)") if yamls else ""
    return (f"{file}: a record has no field {text_field!r} ({fields}). Set validate.contamination.text_field="
            f"{best or 'NAME'} to check that field{task}")


def _plain(pieces) -> str:
    """A text suite document's text: its pieces without the chat markup, joined by newlines."""
    from packtrain.evaluate.suites import IM_END, IM_START

    return "\n".join(p.text for p in pieces if not p.text.startswith(IM_START) and p.text not in (IM_END, "\n"))


def task_documents(path: Path, where: str) -> list[tuple[Path, str, str]]:
    """(data file, record locator, document) of every item of an lm-eval task YAML (module doc): per item its
    rendered document first, then the item as its data file stores it (`stored_forms`), each under the item's
    locator."""
    from packtrain.evaluate.tasks import data_files, read_task_yaml

    spec = read_task_yaml(where, path)
    out = []
    for f in map(Path, data_files(f"{where}: {path}", spec, path.parent).values()):
        for k, rec in enumerate(_records(f), 1):
            loc = f"{f.name}:{k}" if f.suffix.lower() in (".jsonl", ".json", ".csv") else f"{f.name}#{k - 1}"
            text = task_text(spec, rec, f"{where}: {f}: record {k}")
            out += [(f, loc, t) for t in dict.fromkeys([text, *stored_forms(rec)])]
    return out


def stored_forms(rec: dict) -> list[str]:
    """An item as a copy of its data file holds it: the JSON record (a .jsonl line: keys and values, in the file's
    order) and its values in order (a .csv row, a table dump). The rendered document (task_text) misses both: a
    key such as "choices" or another choice stands between the prompt and the gold answer — a training corpus that
    swept up the task's data file (a checkout of the repository) would pass unseen.

    >>> stored_forms({"context": "# why", "choices": ["a = 1", "1 = a"], "label": 0})
    ['{"context": "# why", "choices": ["a = 1", "1 = a"], "label": 0}', '# why a = 1 1 = a 0']
    """
    def flat(v) -> list[str]:
        if isinstance(v, dict):
            return [x for u in v.values() for x in flat(u)]
        return [x for u in v for x in flat(u)] if isinstance(v, list) else [str(v)]

    return [json.dumps(rec, ensure_ascii=False, default=str), " ".join(flat(rec))]


def _records(f: Path) -> list[dict]:
    if f.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(f).to_pylist()
    if f.suffix.lower() == ".csv":
        import csv

        with open(f, encoding="utf-8", newline="") as fh:
            return list(csv.DictReader(fh))
    text = f.read_text(encoding="utf-8")
    if f.suffix.lower() == ".json" and text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def _render(template: Hashable | list, rec: dict, where: str):
    """A task field as lm-eval reads it: a record key → its value; a Jinja template → rendered; else itself."""
    if isinstance(template, list):
        return [_render(t, rec, where) for t in template]
    if isinstance(template, str) and template in rec:
        return rec[template]
    if isinstance(template, str) and ("{{" in template or "{%" in template):
        import jinja2

        try:
            return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template).render(**rec)
        except jinja2.TemplateError as e:
            raise InputDataError(f"{where}: template {template!r} does not render ({e}); the record's fields: "
                                 f"{', '.join(sorted(rec))}") from None
    return template


def task_text(spec: dict, rec: dict, where: str) -> str:
    """One item's document: the decontamination query when the YAML names one, else the rendered prompt, the
    target delimiter and the gold answer (the gold choice of a multiple_choice task)."""
    if "doc_to_decontamination_query" in spec:
        return str(_render(spec["doc_to_decontamination_query"], rec, where))
    text = str(_render(spec["doc_to_text"], rec, where))
    target = _render(spec["doc_to_target"], rec, where)
    if spec.get("output_type") == "multiple_choice":
        import ast

        choices = _render(spec["doc_to_choice"], rec, where)
        if isinstance(choices, str):
            try:
                choices = ast.literal_eval(choices)
            except (ValueError, SyntaxError):
                raise InputDataError(f"{where}: doc_to_choice rendered {choices[:80]!r}, not a list") from None
        if isinstance(target, str) and target.strip().lstrip("-").isdigit():
            target = int(target)
        if isinstance(target, int) and isinstance(choices, list) and 0 <= target < len(choices):
            target = choices[target]
    delim = spec.get("target_delimiter", " ")
    return f"{text}{delim}{target}" if isinstance(target, str | int | float) else text
