"""Stage runner: tokenize. `run_tokenize(cfg, docs_dir, out_dir)` → token store + tokenize_result.json in out_dir
(`packtrain.stages.results.TokenizeResult`, also returned).

The token store, its tokenizer/ and tokenize_result.json are built in a staging directory next to `out_dir`, checked
(the store opens with consistent shapes, the tokenizer loads, the counts match the stats) and published
together (packtrain.publish.staged_output): a failed or killed tokenize leaves the previous out_dir
byte-identical, a successful one replaces it whole.

The tokenizer travels with the model: when `model.init_from` (resolved like the train stage does it,
packtrain.registry.source.resolve_init: a registry source is downloaded once into
<workdir>/models/<name>/v<version>/) ships a tokenizer, that tokenizer is used — not a BPE trained afresh —
and its BOS/EOS rules apply (packtrain.data.tokenize). `tokenize.tokenizer_dir` must then be unset or hold the
same tokenizer (same tokenizer_hash), else exit 2 naming both. meta.json and tokenize_result.json record
`tokenizer_hash` and `tokenizer_from` (and the lineage its tokenizer_hash); MLflow tags `packtrain.tokenizer_hash`, `packtrain.tokenizer_from`.

Contamination (`validate.contamination.policy: drop`, the default): the documents the validate stage's n-gram
check lists (packtrain.data.contamination, the same pure check on the same table and eval sources) are left out of the store —
neither trained on nor in the eval split; tokenize_result.json `contamination_dropped` lists their doc_ids, and the
input's md5 (lineage) is still documents.parquet's.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

from packtrain.config import RunConfig
from packtrain.paths import RunPaths
from packtrain.publish import staged_output
from packtrain.stages.lineage import documents_data_version, make_lineage, upstream_lineage
from packtrain.stages.results import IngestResult, TokenizeResult, from_library

STATS_FILE = TokenizeResult.FILE
REQUIRED = ("tokens.bin", "offsets.npy", "doc_ids.npy", "split.npy", "meta.json", "tokenizer", STATS_FILE)
OUTPUTS = (*REQUIRED, "loss_mask.bin")   # loss_mask.bin only for chat / prompt-completion records


def run_tokenize(cfg: RunConfig, docs_dir: str | Path | None = None, out_dir: str | Path | None = None
                 ) -> TokenizeResult:
    """Tokenize `docs_dir` (default <workdir>/ingest) into `out_dir` (default <workdir>/tokenize).

    The result adds `tokens_md5` (tokens.bin: equal across runs ⇔ same ids); its lineage `input_md5` holds
    "documents" (documents.parquet) and "tokenizer" when the tokenizer was loaded from tokenize.tokenizer_dir.
    MLflow tags: `dvc.md5.documents`, `dvc.md5.tokenizer`, `dvc.md5.tokens`.
    """
    from packtrain.data.contamination_check import contaminated_ids, write_without
    from packtrain.data.contamination_sources import sources_of
    from packtrain.data.documents_frame import resolve_documents
    from packtrain.data.tokenize import tokenize_documents
    from packtrain.data.tokenizer_setup import check_tokenizer_dir
    from packtrain.tracking import stage_run
    from packtrain.versioning import data_md5

    paths = RunPaths(Path(cfg.workdir))
    docs = resolve_documents(docs_dir if docs_dir is not None else paths.stage_dir("ingest"))
    out = Path(out_dir) if out_dir is not None else paths.stage_dir("tokenize")
    md5 = data_md5(docs)
    tok_md5 = data_md5(check_tokenizer_dir(cfg.tokenize.tokenizer_dir)) if cfg.tokenize.tokenizer_dir else None
    tok_cfg, init_from = tokenizer_of_init(cfg)
    dropped = contaminated_ids(docs, cfg.validate_.contamination,   # [] unless drop found some
                               sources_of(cfg, documents_data_version(docs)))
    with stage_run("tokenize", cfg, section=cfg.tokenize) as run, \
            staged_output(out, OUTPUTS, "tokenize", required=REQUIRED) as tmp, contextlib.ExitStack() as temp:
        run.set_tags({"dvc.md5.documents": md5, "dvc.md5.tokenizer": tok_md5})
        run.log_dataset(docs, "documents", md5, context="input")
        if tok_md5 and cfg.tokenize.tokenizer_dir:
            run.log_dataset(cfg.tokenize.tokenizer_dir, "tokenizer", tok_md5, context="input")
        src = docs
        if dropped:   # the table without them, in a temporary directory; documents.parquet itself is only read
            src = write_without(docs, dropped, Path(temp.enter_context(tempfile.TemporaryDirectory(
                prefix="packtrain-tokenize-"))) / "documents.parquet")
            print(f"tokenize: left out {len(dropped)} contaminated document(s) (validate.contamination.policy=drop): "
                  f"doc_id {', '.join(map(str, dropped[:20]))}" + (" ..." if len(dropped) > 20 else ""),
                  file=sys.stderr)
        stats = tokenize_documents(src, tmp, tok_cfg, publish=False, tokenizer_from=init_from,
                                   prompt_budget=cfg.pack.budget)   # a longer prompt could not share a pack with its answer
        run.set_tags({"packtrain.tokenizer_hash": stats.tokenizer_hash, "packtrain.tokenizer_from": init_from})
        _check_store(tmp, stats)
        lineage = make_lineage({"documents": md5, "tokenizer": tok_md5},
                               upstream_lineage(docs.parent / IngestResult.FILE), tokenizer_hash=stats.tokenizer_hash)
        result = from_library(TokenizeResult, stats.to_dict(), lineage, STATS_FILE, output=str(out),
                              input=str(docs), tokens_md5=data_md5(tmp / "tokens.bin"),
                              contamination_dropped=dropped)
        result.write(tmp)
        run.log_stats(result.to_dict())
        run.set_tags({"dvc.md5.tokens": result.tokens_md5})
        run.log_artifact(tmp / STATS_FILE)
        run.log_artifact(tmp / "meta.json")
    return result


def tokenizer_of_init(cfg: RunConfig):
    """(TokenizeConfig to use, model.init_from or None): the init model's tokenizer directory substituted for
    tokenize.tokenizer_dir when the init source ships one (checked against an explicit tokenizer_dir)."""
    from packtrain.data.tokenizer_files import has_tokenizer, tokenizer_hash
    from packtrain.errors import ConfigError
    from packtrain.registry.source import resolve_init

    init = resolve_init(cfg)
    if init.path is None or not has_tokenizer(init.path):
        return cfg.tokenize, None
    own = cfg.tokenize.tokenizer_dir
    if own:
        a, b = tokenizer_hash(own), tokenizer_hash(init.path)
        if a != b:
            raise ConfigError(f"tokenize.tokenizer_dir {own} (tokenizer {a or 'none'}) is not the tokenizer of "
                              f"model.init_from {init.value!r} ({init.path}: {b}); a model reads only its own "
                              "tokenizer's ids: unset tokenize.tokenizer_dir (the model's tokenizer is used)")
    return cfg.tokenize.model_copy(update={"tokenizer_dir": str(init.path)}), init.value


def _check_store(staged: Path, stats) -> None:
    """The staged store must open, agree with the stats, and its tokenizer must load; else nothing is published."""
    from packtrain.data.token_store import TokenStore
    from packtrain.data.tokenizer_setup import load_tokenizer
    from packtrain.errors import PacktrainError

    store = TokenStore.open(staged)
    n_tokens = int(store.meta["n_tokens"])
    if store.n_docs != stats.documents or n_tokens != stats.tokens:
        raise PacktrainError(f"tokenize: the staged store holds {store.n_docs} documents / {n_tokens} tokens, "
                             f"the stats say {stats.documents} / {stats.tokens}; nothing was published")
    if len(load_tokenizer(staged / "tokenizer")) != store.vocab_size:
        raise PacktrainError(f"tokenize: the staged tokenizer's vocabulary differs from meta.json's vocab_size "
                             f"{store.vocab_size}; nothing was published")
