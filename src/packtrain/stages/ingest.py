"""Stage runner: ingest. `run_ingest(cfg, out_dir)` → out_dir/documents.parquet + ingest_result.json
(`packtrain.stages.results.IngestResult`, also returned).

Both files are built in a staging directory next to `out_dir`, checked (the table's row count equals the
stats' `documents`) and published together (packtrain.publish.staged_output): a failed or killed ingest leaves
the previous out_dir byte-identical, a successful one replaces it whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from packtrain.config import RunConfig
from packtrain.paths import RunPaths
from packtrain.publish import staged_output
from packtrain.stages.lineage import make_lineage
from packtrain.stages.results import IngestResult, from_library

STATS_FILE = IngestResult.FILE
OUTPUTS = ("documents.parquet", STATS_FILE)


def run_ingest(cfg: RunConfig, out_dir: str | Path | None = None) -> IngestResult:
    """Ingest `cfg.ingest.source` (None → default corpus) into `out_dir` (default <workdir>/ingest).

    The result adds `output_md5` (documents.parquet) and the lineage: `input_md5["source"]` is the DVC md5
    of the source file or folder; when files were skipped (ingest.unsupported=skip) or links followed it is
    the `.dir` md5 of exactly the files read, keyed by their source names (`input_md5_of: "files read"`), as
    for the default corpus (keyed `stdlib/<relpath>`). It is the chain's `data_version`. MLflow: metrics from
    the stats, tags `dvc.md5.source` / `dvc.md5.documents`, dataset inputs with those digests.
    """
    from packtrain.data.ingest import DOCUMENTS_FILE, ingest_documents
    from packtrain.data.record_rules import RowRules
    from packtrain.tracking import stage_run
    from packtrain.versioning import data_md5

    out = Path(out_dir) if out_dir is not None else RunPaths(Path(cfg.workdir)).stage_dir("ingest")
    source = cfg.ingest.source
    with stage_run("ingest", cfg, section=cfg.ingest) as run, staged_output(out, OUTPUTS, "ingest") as tmp:
        stats = ingest_documents(source, tmp, cfg.ingest, published_dir=out,
                                 rules=RowRules.of(cfg))   # what on_bad_record=skip drops: what validate refuses
        input_md5, md5_of = _input_md5(source, stats)
        staged_docs = tmp / DOCUMENTS_FILE
        result = from_library(IngestResult, stats.to_dict(), make_lineage({"source": input_md5}), STATS_FILE,
                              output=str(out / DOCUMENTS_FILE), input_md5_of=md5_of,
                              output_md5=data_md5(staged_docs))
        _check_table(staged_docs, result.documents)
        result.write(tmp)
        run.log_stats(result.to_dict())
        run.set_tags({"dvc.md5.source": input_md5, "dvc.md5.documents": result.output_md5,
                      "dvc.git_rev": result.lineage.git_sha})
        src_path = Path(source) if source is not None else Path(next(iter(cast(dict, result.default_corpus)["roots"].values())))
        run.log_dataset(src_path, "source", input_md5, context="input")
        run.log_dataset(out / DOCUMENTS_FILE, "documents", result.output_md5, context="output")
        run.log_artifact(tmp / STATS_FILE)
    return result


def _input_md5(source, stats) -> tuple[str, str]:
    """(md5, what it covers): "source" (DVC md5 of the file/folder) or "files read"."""
    from packtrain.versioning import data_md5, files_md5

    if source is None:
        return files_md5({k.replace(":", "/", 1): p for k, p in stats.input_files.items()}), "files read"
    if stats.input_exact:
        try:
            return data_md5(source), "source"
        except OSError:   # e.g. a broken link among the hidden entries discovery ignores
            pass
    return files_md5(stats.input_files), "files read"


def _check_table(path: Path, documents: int) -> None:
    """The staged table must open and hold exactly `documents` rows, else nothing is published."""
    import pyarrow.parquet as pq

    from packtrain.errors import PacktrainError

    rows = pq.ParquetFile(path).metadata.num_rows
    if rows != documents:
        raise PacktrainError(f"ingest: the staged {path.name} holds {rows} rows but {documents} documents were "
                             "read; nothing was published")
