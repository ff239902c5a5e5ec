"""validate: a Great Expectations (Core 1.x) suite for text corpora over `documents.parquet`.

The suite (thresholds from `ValidateConfig`; name → GX expectation):

    columns_present    ExpectTableColumnsToMatchSet        doc_id, text, source, n_chars all present
    doc_id_type        ExpectColumnValuesToBeOfType        int64            (n_chars_type likewise)
    text_type          ExpectColumnValuesToBeOfType        every value a str (source_type likewise)
    doc_id_unique      ExpectColumnValuesToBeUnique        doc_id
    text_not_null      ExpectColumnValuesToNotBeNull       text
    text_not_empty     ExpectColumnValuesToMatchRegex      text matches \\S  (whitespace-only = empty)
    has_visible_text   ExpectColumnValuesToBeNull          has_visible_text_problem is null: no non-blank text (or
                                                           turn, prompt, completion) of only NUL/control, zero-width
                                                           and U+FFFD characters (packtrain.data.record_rules)
    length_in_range    ExpectColumnValuesToBeBetween       min_chars ≤ n_chars ≤ max_chars, mostly=length_mostly
    duplicate_ratio    ExpectColumnProportionOfUniqueValuesToBeBetween
                                                           distinct texts / rows ≥ 1 - max_duplicate_ratio,
                                                           i.e. (rows - distinct) / rows ≤ max_duplicate_ratio
    row_count          ExpectTableRowCountToBeBetween      rows ≥ min_rows

Chat / prompt-completion tables (a `record` column, packtrain.data.ingest) get more expectations, one per
packtrain.data.chat.CHECKS and packtrain.data.record_rules.RULES, each ExpectColumnValuesToBeNull on a column
holding the row's first problem (None when the row is fine; plain-text rows always None):

    record_shape       messages is a list of {role, content} with string content; prompt and completion strings
    roles_allowed      every role is one of system, user, assistant, tool
    has_assistant_turn a conversation has at least one assistant turn
    content_not_empty  no empty (whitespace-only) content or completion
    role_order         optional system turn, then user/assistant alternating from user to assistant
                       (validate.role_order: alternating; "any" leaves it out)
    prompt_fits_budget the prompt's tokens (exact with tokenize.tokenizer_dir, else a lower bound) < pack.budget
                       (left out when the tokenizer is model.init_from's: tokenize checks it)

When there is something to check against (the stage: the run's suites, its held-out split and
`validate.contamination.against`; packtrain.data.contamination) one more expectation, ExpectColumnValuesToBeNull
on `contamination_problem` (per row: the eval record it holds):

    contamination      no training document holds validate.contamination.min_coverage of an eval document's
                       word n-grams (validate.contamination.ngram)

It fails the suite — with exit 3, bad input, naming every such document and suite — only under policy fail;
under drop (the default) / warn it is reported (success false, `report.contamination`) but not counted in `failed`.

Every failing expectation lists its rows in `offending_rows`: doc_id, `source` (file:line / file#row) and,
for these checks, the problem (`messages[1].role is "bot", allowed: ...`); the exit-4 message names them too.

Outputs in `out_dir`: `report.json` (per expectation: success, observed value, element/unexpected counts,
up to `max_offending_ids` offending doc_ids — for duplicate_ratio the ids of rows repeating an earlier
text, computed with pandas because GX's aggregate expectation lists none) and `data_docs/index.html`, the
GX Data Docs site built by a Checkpoint's UpdateDataDocsAction. GX runs in an ephemeral context on a
pandas DataFrame; string columns are handed over as Python objects so the type expectation checks each
value (GX 1.24 cannot match pandas 3's `str` dtype by name). The table is read batch by batch and each
non-blank text is handed to GX as its md5 digest (packtrain.data.documents_frame.text_surrogates): type, null, empty and duplicate
expectations give the same answers, and memory no longer grows with the corpus's text. The input is
opened read-only.
GX import ≈ 3-5 s; the suite on the 24 MB default corpus ≈ 1-2 s.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from packtrain.config import ValidateConfig
from packtrain.data.documents_frame import load_frame, resolve_documents
from packtrain.data.record_rules import RowRules
from packtrain.data.validation_summary import ValidationSummary

if TYPE_CHECKING:
    from packtrain.data.contamination_sources import EvalSources
from packtrain.errors import InputDataError, PacktrainError, ValidationFailed
from packtrain.publish import write_json

COLUMNS = {"doc_id": "int64", "text": "str", "source": "str", "n_chars": "int64"}
SUITE_NAME = "packtrain_text_corpus"
SITE_NAME = "packtrain"


@dataclass
class ExpectationResult:
    name: str
    expectation: str
    success: bool
    observed: object = None
    element_count: int | None = None
    unexpected_count: int | None = None
    unexpected_percent: float | None = None
    offending_doc_ids: list[int] = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    error: str | None = None
    offending_rows: list[dict] = field(default_factory=list)
    """[{"doc_id", "source", "problem"?}] of the offending doc_ids: where each row came from (file:line)."""

    def summary(self) -> str:
        """'length_in_range (12 unexpected, 0.8%)' — used in the failure message; chat checks name their rows:
        'roles_allowed (1 unexpected, 25.0%: chat.jsonl:3 messages[1].role is "bot", allowed: ...)'."""
        if self.error:
            return f"{self.name} (error: {self.error})"
        if self.unexpected_count is not None:
            rows = [f"{r['source']} {r['problem']}" for r in self.offending_rows[:5] if r.get("problem")]
            more = f" ... ({len(self.offending_rows) - 5} more listed in the report)" if len(rows) == 5 \
                and len(self.offending_rows) > 5 else ""
            where = (": " + "; ".join(rows) + more) if rows else ""
            return f"{self.name} ({self.unexpected_count} unexpected, {self.unexpected_percent or 0:.1f}%{where})"
        return f"{self.name} (observed {self.observed})"


@dataclass(kw_only=True)
class ValidationReport(ValidationSummary):
    """The full report (report.json): the summary, the thresholds checked and every expectation's result."""

    thresholds: dict
    results: list[ExpectationResult]

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def n_passed(self) -> int:
        return sum(r.success for r in self.results)


def build_suite(cfg: ValidateConfig, checks: tuple[str, ...] = ()) -> list[tuple[str, object]]:
    """[(name, GX expectation)] in report order; names are stored in each expectation's meta. `checks`: the
    per-document rules computed into `<check>_problem` columns (load_frame): has_visible_text follows
    text_not_empty, the record checks come first; contamination (the column packtrain.data.contamination adds
    when there is something to check against) comes last."""
    import great_expectations.expectations as gxe

    def named(name, exp):
        exp.meta = {"packtrain_name": name}
        return name, exp

    def null(c):
        return named(c, gxe.ExpectColumnValuesToBeNull(column=f"{c}_problem"))

    extra = [null(c) for c in checks if c not in ("has_visible_text", "contamination")]
    visible = [null("has_visible_text")] if "has_visible_text" in checks else []
    last = [null("contamination")] if "contamination" in checks else []
    return extra + [
        named("columns_present", gxe.ExpectTableColumnsToMatchSet(column_set=list(COLUMNS), exact_match=False)),
        *(named(f"{c}_type", gxe.ExpectColumnValuesToBeOfType(column=c, type_=t)) for c, t in COLUMNS.items()),
        named("doc_id_unique", gxe.ExpectColumnValuesToBeUnique(column="doc_id")),
        named("text_not_null", gxe.ExpectColumnValuesToNotBeNull(column="text")),
        named("text_not_empty", gxe.ExpectColumnValuesToMatchRegex(column="text", regex=r"\S")),
        *visible,
        named("length_in_range", gxe.ExpectColumnValuesToBeBetween(
            column="n_chars", min_value=cfg.min_chars, max_value=cfg.max_chars, mostly=cfg.length_mostly)),
        named("duplicate_ratio", gxe.ExpectColumnProportionOfUniqueValuesToBeBetween(
            column="text", min_value=1.0 - cfg.max_duplicate_ratio)),
        named("row_count", gxe.ExpectTableRowCountToBeBetween(min_value=cfg.min_rows)),
        *last,
    ]


def _error_message(info) -> str | None:
    """GX puts exceptions either flat or keyed by metric id; return the first message."""
    if not info:
        return None
    if isinstance(info, dict) and "raised_exception" in info:
        return info.get("exception_message") if info.get("raised_exception") else None
    if isinstance(info, dict):
        for v in info.values():
            msg = _error_message(v)
            if msg:
                return msg
    return None


def _to_result(name: str, r, df, cfg: ValidateConfig) -> ExpectationResult:
    res = dict(r.result or {})
    kwargs = {k: v for k, v in r.expectation_config.kwargs.items() if k not in ("batch_id", "result_format")}
    ids: list[int] = []
    for item in res.get("partial_unexpected_index_list") or []:
        if isinstance(item, dict) and "doc_id" in item:
            try:
                ids.append(int(item["doc_id"]))
            except (TypeError, ValueError):
                pass
    observed = res.get("observed_value")
    if name == "duplicate_ratio" and "text" in df.columns:
        dup = df["text"].duplicated(keep="first") & df["text"].notna()
        if "doc_id" in df.columns:
            ids = [int(x) for x in df.loc[dup, "doc_id"].head(cfg.max_offending_ids)]
        res["unexpected_count"] = int(dup.sum())
        res["element_count"] = len(df)
        res["unexpected_percent"] = 100.0 * int(dup.sum()) / max(len(df), 1)
        observed = {"distinct_proportion": observed, "duplicate_ratio": round(int(dup.sum()) / max(len(df), 1), 6)}
    if name == "columns_present":
        observed = {"columns": observed, **(res.get("details") or {}).get("mismatched", {})}
    if isinstance(observed, float):
        observed = round(observed, 6)
    error = _error_message(r.exception_info)
    column = kwargs.get("column")
    if column is not None and column not in df.columns:  # GX's own message here is an internal IndexError
        error = f"column {column!r} is missing (columns: {', '.join(map(str, df.columns)) or 'none'})"
    return ExpectationResult(
        name=name, expectation=r.expectation_config.type, success=bool(r.success), observed=observed,
        element_count=res.get("element_count"), unexpected_count=res.get("unexpected_count"),
        unexpected_percent=(round(res["unexpected_percent"], 4) if res.get("unexpected_percent") is not None
                            else None),
        offending_doc_ids=ids[: cfg.max_offending_ids], kwargs=kwargs, error=error,
        offending_rows=_offending_rows(ids[: cfg.max_offending_ids], df, column))


def _offending_rows(ids: list[int], df, column: str | None) -> list[dict]:
    """[{"doc_id", "source", "problem"?}] for `ids`: the source locator (file:line) and, for a record check's
    `<check>_problem` column, the problem text."""
    if not ids or "doc_id" not in df.columns or "source" not in df.columns:
        return []
    at = df.set_index("doc_id", drop=False)
    rows = []
    for i in ids:
        if i not in at.index:
            continue
        row = at.loc[i]
        if getattr(row, "ndim", 1) > 1:   # duplicated doc_id: the first
            row = row.iloc[0]
        item = {"doc_id": int(i), "source": row["source"]}
        if column is not None and column.endswith("_problem") and column in df.columns:
            item["problem"] = row[column]
        rows.append(item)
    return rows


def validate_documents(docs: str | Path, out_dir: str | Path, cfg: ValidateConfig,
                       raise_on_failure: bool = True, published_dir: str | Path | None = None,
                       rules: RowRules | None = None, contamination: EvalSources | None = None
                       ) -> ValidationReport:
    """Run the suite on `docs` (a directory with documents.parquet, or the file); write report + Data Docs.

    Raises ValidationFailed (after writing both) naming the failed expectations and the report path,
    unless `raise_on_failure` is False (the stage runner logs to MLflow first, then raises). `published_dir`:
    where the stage will publish `out_dir` when it is a staging directory — the paths inside report.json and
    the message name it (default `out_dir`). `rules`: what the per-document rules need from the run
    (packtrain.data.record_rules.RowRules.of(cfg); default: role order checked, prompts not). `contamination`:
    what the contamination check compares with (packtrain.data.contamination_sources.sources_of(run config):
    the stage passes the run's suites and held-out split); None → `cfg.contamination.against` alone.
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    path = resolve_documents(docs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from packtrain.data.contamination_check import add_problem_column

    df = load_frame(path, rules=rules)
    found = add_problem_column(df, path, cfg.contamination, contamination)   # None: nothing to check against

    import great_expectations as gx
    from great_expectations.checkpoint import UpdateDataDocsAction
    from great_expectations.data_context.types.base import ProgressBarsConfig

    from packtrain.data.contamination_check import counts_as_failure

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    tmp_docs = out_dir / ".data_docs.tmp"
    if tmp_docs.exists():
        shutil.rmtree(tmp_docs)
    ctx.add_data_docs_site(site_name=SITE_NAME, site_config={
        "class_name": "SiteBuilder",
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(tmp_docs.resolve())},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    })
    batch_def = (ctx.data_sources.add_pandas("packtrain").add_dataframe_asset("documents")
                 .add_batch_definition_whole_dataframe("all"))
    suite = ctx.suites.add(gx.ExpectationSuite(name=SUITE_NAME))
    names = []
    checks = tuple(str(c)[: -len("_problem")] for c in df.columns if str(c).endswith("_problem"))
    for name, exp in build_suite(cfg, checks):
        suite.add_expectation(exp)
        names.append(name)
    vdef = ctx.validation_definitions.add(gx.ValidationDefinition(name="documents", data=batch_def, suite=suite))
    result_format: dict = {"result_format": "SUMMARY", "partial_unexpected_count": cfg.max_offending_ids}
    if "doc_id" in df.columns:
        result_format["unexpected_index_column_names"] = ["doc_id"]
    checkpoint = ctx.checkpoints.add(gx.Checkpoint(
        name="packtrain_validate", validation_definitions=[vdef], result_format=result_format,
        actions=[UpdateDataDocsAction(name="data_docs", site_names=[SITE_NAME])]))
    run = checkpoint.run(batch_parameters={"dataframe": df})
    (vres,) = run.run_results.values()
    by_name = {(r.expectation_config.meta or {}).get("packtrain_name"): r for r in vres.results}
    results = [_to_result(n, by_name[n], df, cfg) for n in names if n in by_name]

    docs_dir = out_dir / "data_docs"
    if (tmp_docs / "index.html").is_file():
        if docs_dir.exists():
            shutil.rmtree(docs_dir)
        tmp_docs.rename(docs_dir)
    failed = [r.name for r in results if not r.success and counts_as_failure(r.name, cfg.contamination)]
    report = ValidationReport(
        success=not failed, documents=len(df), input=str(path), report="", data_docs=None,
        failed=failed, thresholds=cfg.model_dump(mode="json"), results=results, contamination=found)
    report = write_report(report, out_dir, published_dir if published_dir is not None else out_dir)
    if failed and raise_on_failure:
        raise validation_error(report)
    return report


def write_report(report: ValidationReport, out_dir: str | Path, published_dir: str | Path) -> ValidationReport:
    """(Re)write `out_dir/report.json` with `report.report` / `report.data_docs` naming `published_dir`, where
    the directory is (or will be) published; returns the updated report."""
    out_dir, published_dir = Path(out_dir), Path(published_dir)
    report.report = str(published_dir / "report.json")
    index = Path("data_docs") / "index.html"
    report.data_docs = str(published_dir / index) if (out_dir / index).is_file() else None
    write_json(out_dir / "report.json", report.to_dict())
    return report


def validation_error(report: ValidationReport) -> PacktrainError:
    """ValidationFailed (exit 4) naming the failed expectations; InputDataError (exit 3) when contamination
    failed under policy fail: the message names each contaminated document and suite first."""
    bad = [r.summary() for r in report.results if not r.success and r.name in report.failed]
    where = f"Report: {report.report}" + (f", Data Docs: {report.data_docs}" if report.data_docs else "")
    if "contamination" in report.failed and report.contamination:
        from packtrain.data.contamination_check import contamination_message

        others = [r.summary() for r in report.results if r.name in report.failed and r.name != "contamination"]
        also = f" Also failed: {'; '.join(others)}." if others else ""
        return InputDataError(f"{report.input}: {contamination_message(report.contamination)}.{also} {where}")
    return ValidationFailed(
        f"validation of {report.input} failed {len(bad)} of {len(report.results)} expectations: "
        + "; ".join(bad) + ". " + where)

