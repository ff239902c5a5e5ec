"""Stage runner: tokenize. `run_tokenize(cfg, docs_dir, out_dir)` → token store + stats.json in out_dir."""

from __future__ import annotations

from pathlib import Path

from packtrain.config import RunConfig
from packtrain.paths import RunPaths, write_json

STATS_FILE = "stats.json"


def run_tokenize(cfg: RunConfig, docs_dir: str | Path | None = None, out_dir: str | Path | None = None) -> dict:
    """Tokenize `docs_dir` (default <workdir>/ingest) into `out_dir` (default <workdir>/tokenize).

    Stats add `input_md5` (documents.parquet), `tokenizer_md5` when the tokenizer was loaded from a
    directory, `tokens_md5` (tokens.bin: equal across runs ⇔ same ids) and `git_rev`. MLflow tags:
    `dvc.md5.documents`, `dvc.md5.tokenizer`.
    """
    from packtrain.data.tokenize import check_tokenizer_dir, tokenize_documents
    from packtrain.data.validate import resolve_documents
    from packtrain.tracking import stage_run
    from packtrain.versioning import data_md5, git_rev

    paths = RunPaths(Path(cfg.workdir))
    docs = resolve_documents(docs_dir if docs_dir is not None else paths.stage_dir("ingest"))
    out = Path(out_dir) if out_dir is not None else paths.stage_dir("tokenize")
    md5 = data_md5(docs)
    tok_md5 = data_md5(check_tokenizer_dir(cfg.tokenize.tokenizer_dir)) if cfg.tokenize.tokenizer_dir else None
    with stage_run("tokenize", cfg, section=cfg.tokenize) as run:
        run.set_tags({"dvc.md5.documents": md5, "dvc.md5.tokenizer": tok_md5})
        run.log_dataset(docs, "documents", md5, context="input")
        if tok_md5:
            run.log_dataset(cfg.tokenize.tokenizer_dir, "tokenizer", tok_md5, context="input")
        stats = tokenize_documents(docs, out, cfg.tokenize)
        d = stats.to_dict()
        d.update(input=str(docs), input_md5=md5, tokenizer_md5=tok_md5, tokens_md5=data_md5(out / "tokens.bin"),
                 git_rev=git_rev())
        write_json(out / STATS_FILE, d)
        run.log_stats(d)
        run.set_tags({"dvc.md5.tokens": d["tokens_md5"]})
        run.log_artifact(out / STATS_FILE)
        run.log_artifact(out / "meta.json")
    return d
