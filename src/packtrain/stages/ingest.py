"""Stage runner: ingest. `run_ingest(cfg, out_dir)` → out_dir/documents.parquet + ingest_stats.json."""

from __future__ import annotations

from pathlib import Path

from packtrain.config import RunConfig
from packtrain.paths import RunPaths, write_json

STATS_FILE = "ingest_stats.json"


def run_ingest(cfg: RunConfig, out_dir: str | Path | None = None) -> dict:
    """Ingest `cfg.ingest.source` (None → default corpus) into `out_dir` (default <workdir>/ingest).

    Stats add `input_md5` (DVC md5 of the source file/folder, or the `.dir` md5 of exactly the default
    corpus files read, keyed `stdlib/<relpath>`), `output_md5` (documents.parquet) and `git_rev`. MLflow:
    metrics from the stats, tags `dvc.md5.source` / `dvc.md5.documents`, dataset inputs with those digests.
    """
    from packtrain.data.ingest import DOCUMENTS_FILE, ingest_documents
    from packtrain.tracking import stage_run
    from packtrain.versioning import data_md5, files_md5, git_rev

    out = Path(out_dir) if out_dir is not None else RunPaths(Path(cfg.workdir)).stage_dir("ingest")
    source = cfg.ingest.source
    with stage_run("ingest", cfg, section=cfg.ingest) as run:
        stats = ingest_documents(source, out, cfg.ingest)
        d = stats.to_dict()
        if source is None:
            d["input_md5"] = files_md5({k.replace(":", "/", 1): p for k, p in stats.input_files.items()})
        else:
            d["input_md5"] = data_md5(source)
        docs = out / DOCUMENTS_FILE
        d["output_md5"] = data_md5(docs)
        d["git_rev"] = git_rev()
        write_json(out / STATS_FILE, d)
        run.log_stats(d)
        run.set_tags({"dvc.md5.source": d["input_md5"], "dvc.md5.documents": d["output_md5"],
                      "dvc.git_rev": d["git_rev"]})
        src_path = Path(source) if source is not None else Path(next(iter(d["default_corpus"]["roots"].values())))
        run.log_dataset(src_path, "source", d["input_md5"], context="input")
        run.log_dataset(docs, "documents", d["output_md5"], context="output")
        run.log_artifact(out / STATS_FILE)
    return d
