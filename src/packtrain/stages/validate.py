"""Stage runner: validate. `run_validate(cfg, docs_dir, out_dir)` → report.json, data_docs/, validate_result.json
(`packtrain.stages.results.ValidateResult`, also returned).

The outputs are built in a staging directory next to `out_dir` and published together only when the suite
passes (packtrain.publish.staged_output): a failed or killed validation leaves the previous out_dir
byte-identical. The report of a failed suite is published instead to `<out_dir>.failed/` (same files), so
it can be inspected without passing for a validated dataset; the next passing run removes that directory.
"""

from __future__ import annotations

from pathlib import Path

from packtrain.config import RunConfig
from packtrain.paths import RunPaths
from packtrain.publish import check_replaceable, output_target, publish_dir, staged_output
from packtrain.stages.lineage import documents_data_version, make_lineage, upstream_lineage
from packtrain.stages.results import IngestResult, ValidateResult

STATS_FILE = ValidateResult.FILE
OUTPUTS = ("report.json", "data_docs", STATS_FILE)
REQUIRED = ("report.json", STATS_FILE)   # GX may build no Data Docs site (then report.data_docs is null)


def failed_dir(out: Path) -> Path:
    """Where the report of a failed validation of `out` is published: `<out>.failed` (next to where `out`'s
    content lives, when `out` is a symbolic link)."""
    out = output_target(out)
    return out.with_name(out.name + ".failed")


def run_validate(cfg: RunConfig, docs_dir: str | Path | None = None, out_dir: str | Path | None = None
                 ) -> ValidateResult:
    """Run the GX suite on `docs_dir` (default <workdir>/ingest); raise ValidationFailed when it fails.

    Passing: report, Data Docs and stats (lineage `input_md5["documents"]` = DVC md5 of documents.parquet) are published
    to `out_dir`. Failing: the same files go to `<out_dir>.failed/` (named in the error) and `out_dir` is left
    as it was. Either way MLflow gets the metrics/artifacts/tags (`dvc.md5.documents`, `validate.success`)
    before the raise, so a failed validation is fully inspectable; the MLflow run then ends FAILED.
    """
    from packtrain.data.contamination_sources import sources_of
    from packtrain.data.documents_frame import resolve_documents
    from packtrain.data.record_rules import RowRules
    from packtrain.data.validate import validate_documents, validation_error, write_report
    from packtrain.tracking import stage_run
    from packtrain.versioning import data_md5

    paths = RunPaths(Path(cfg.workdir))
    docs = resolve_documents(docs_dir if docs_dir is not None else paths.stage_dir("ingest"))
    out = Path(out_dir) if out_dir is not None else paths.stage_dir("validate")
    failed = failed_dir(out)
    check_replaceable(failed, OUTPUTS, "validate")
    md5 = data_md5(docs)
    lineage = make_lineage({"documents": md5}, upstream_lineage(docs.parent / IngestResult.FILE))
    with stage_run("validate", cfg, section=cfg.validate_) as run, \
            staged_output(out, OUTPUTS, "validate", required=REQUIRED) as tmp:
        run.set_tags({"dvc.md5.documents": md5})
        run.log_dataset(docs, "documents", md5, context="input")
        report = validate_documents(docs, tmp, cfg.validate_, raise_on_failure=False, published_dir=out,
                                    rules=RowRules.of(cfg),   # role order; prompts against pack.budget
                                    contamination=sources_of(cfg, documents_data_version(docs)))   # every eval source
        if not report.success:
            report = write_report(report, tmp, failed)
        dup = next((r for r in report.results if r.name == "duplicate_ratio"), None)
        result = ValidateResult(
            success=report.success, documents=report.documents, expectations=len(report.results),
            passed=report.n_passed, failed=report.failed, report=report.report, data_docs=report.data_docs,
            input=str(docs),
            unexpected={r.name: r.unexpected_count for r in report.results if r.unexpected_count is not None},
            duplicate_ratio=dup.observed.get("duplicate_ratio") if dup is not None and isinstance(
                dup.observed, dict) else None,
            lineage=lineage, contamination=_contamination(report.contamination))
        result.write(tmp)
        run.log_stats({**result.to_dict(), "success": int(report.success)})
        run.set_tags({"validate.success": str(report.success).lower(), "validate.failed": ",".join(report.failed)})
        run.log_artifact(tmp / "report.json")
        if report.data_docs:
            run.log_artifact(tmp / "data_docs", artifact_path="data_docs")
        if not report.success:
            publish_dir(tmp, failed, OUTPUTS, "validate")   # the failure report, beside the untouched out_dir
            raise validation_error(report)
    _remove_stale_failure(failed)
    return result


def _contamination(found: dict | None) -> dict | None:
    """The contamination section of validate_result.json (+ `dropped` under policy drop), said on stderr when
    documents were found and the policy lets the run go on."""
    import sys

    from packtrain.data.contamination_check import log_line, unguarded_champion

    if found is None:
        return None
    if found["policy"] == "drop":
        found = {**found, "dropped": [o["doc_id"] for o in found["overlaps"]]}
    if found["overlaps"] and found["policy"] != "fail":
        print(log_line(found), file=sys.stderr)
    elif line := unguarded_champion(found):   # said by log_line when it prints
        print(f"validate: contamination: {line} (not checked against)", file=sys.stderr)
    return found


def _remove_stale_failure(failed: Path) -> None:
    """A passing run supersedes the report of an earlier failed one (only a directory of validate's files)."""
    import shutil

    from packtrain.errors import ConfigError

    if failed.is_dir() and not failed.is_symlink():
        try:
            check_replaceable(failed, OUTPUTS, "validate")
        except ConfigError:
            return
        shutil.rmtree(failed, ignore_errors=True)
