"""Stage runner: validate. `run_validate(cfg, docs_dir, out_dir)` → report.json, data_docs/, validate_stats.json."""

from __future__ import annotations

from pathlib import Path

from packtrain.config import RunConfig
from packtrain.paths import RunPaths, write_json

STATS_FILE = "validate_stats.json"


def run_validate(cfg: RunConfig, docs_dir: str | Path | None = None, out_dir: str | Path | None = None) -> dict:
    """Run the GX suite on `docs_dir` (default <workdir>/ingest); raise ValidationFailed when it fails.

    The report, Data Docs, stats (`input_md5` = DVC md5 of documents.parquet, `git_rev`) and MLflow
    metrics/artifacts/tags (`dvc.md5.documents`, `validate.success`) are written before the raise, so a
    failed validation is fully inspectable; the MLflow run then ends FAILED.
    """
    from packtrain.data.validate import resolve_documents, validate_documents, validation_error
    from packtrain.tracking import stage_run
    from packtrain.versioning import data_md5, git_rev

    paths = RunPaths(Path(cfg.workdir))
    docs = resolve_documents(docs_dir if docs_dir is not None else paths.stage_dir("ingest"))
    out = Path(out_dir) if out_dir is not None else paths.stage_dir("validate")
    md5 = data_md5(docs)
    with stage_run("validate", cfg, section=cfg.validate_) as run:
        run.set_tags({"dvc.md5.documents": md5})
        run.log_dataset(docs, "documents", md5, context="input")
        report = validate_documents(docs, out, cfg.validate_, raise_on_failure=False)
        d = {
            "success": report.success, "documents": report.documents, "expectations": len(report.results),
            "passed": report.n_passed, "failed": report.failed, "report": report.report,
            "data_docs": report.data_docs, "input": str(docs), "input_md5": md5, "git_rev": git_rev(),
            "unexpected": {r.name: r.unexpected_count for r in report.results if r.unexpected_count is not None},
        }
        dup = next((r for r in report.results if r.name == "duplicate_ratio"), None)
        if dup is not None and isinstance(dup.observed, dict):
            d["duplicate_ratio"] = dup.observed.get("duplicate_ratio")
        write_json(out / STATS_FILE, d)
        run.log_stats({**d, "success": int(report.success)})
        run.set_tags({"validate.success": str(report.success).lower(), "validate.failed": ",".join(report.failed)})
        run.log_artifact(out / "report.json")
        if report.data_docs:
            run.log_artifact(Path(report.data_docs).parent, artifact_path="data_docs")
        if not report.success:
            raise validation_error(report)
    return d
