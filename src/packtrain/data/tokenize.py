"""tokenize: documents.parquet → a tokenizer + the token store (packtrain.data.token_store).

Tokenizer, first match:
1. the init model's own (`model.init_from` is a directory or registered model that ships tokenizer.json /
   tokenizer_config.json; the tokenize stage passes its directory as `tokenizer_dir`): a model can only
   read ids of its own tokenizer;
2. `tokenize.tokenizer_dir`;
3. trained with `tokenizers` (byte-level BPE, GPT-2 pre-tokenization regex, no normalization, so any UTF-8
   text round-trips exactly) on ≈`train_chars` characters of *train-split* documents.
A loaded tokenizer's files are copied byte for byte into <out>/tokenizer (so it hashes like its source,
packtrain.data.tokenizer_files); a trained one is saved with `PreTrainedTokenizerFast.save_pretrained`.
Either way `AutoTokenizer.from_pretrained(<out>/tokenizer)` loads it, and meta.json records its
`tokenizer_hash`. Special tokens of a trained tokenizer:

    id 0  <|endoftext|>   eos_token and bos_token (GPT-2 convention: one separator token)
    id 1  <|pad|>         pad_token (packing pads the tail of a row; those labels are -100)

BOS/EOS follow the tokenizer's own rules: whatever `tok(text)` puts around a text's ids (Llama, Mistral,
Gemma, Phi-3 tokenizers: BOS first; Qwen: nothing; a trained BPE: nothing) is read once from a probe text
(`special_tokens_rule`) and put around every document — meta.json `special_prefix` / `special_suffix`. With
`append_eos` (default) the stage then appends `eos_id` unless the tokenizer's own suffix already ends with
it, so a document of n text tokens has n + |prefix| + 1 ids and the model learns where documents end; BOS and
EOS count as document tokens in every statistic. After packing, each document's first token carries no loss
(its label is -100 in PackedBatch), and the previous document's EOS marks the boundary.

Eval split: document i is held out when u(doc_id) < eval_fraction, u = splitmix64(doc_id) / 2^64, a fixed
hash (same split on every machine and run; independent of document order). If that holds out no document
(tiny corpora) the document with the smallest u is held out; at least one document stays in train. The
tokenizer is trained on train documents only, visited in decreasing u order.

Chat / prompt-completion records (documents.parquet with `format`/`record` columns, packtrain.data.ingest)
are rendered by packtrain.data.chat (the tokenizer's own chat_template, or the built-in ChatML-like one) and
a uint8 loss mask is written beside the ids (token_store `loss_mask.bin`; text rows all 1). A record whose
prompt — the tokens before its first learned token — is longer than `prompt_budget` (the tokenize stage passes
pack.budget) would be packed as chunks whose answer cannot see its question: every such record, and every
record that does not render (wrong role, missing content, ...: `packtrain validate` lists them first), is
named by source (file:line) and doc_id in one InputDataError (exit 3), after the whole table was read.
Records longer than `prompt_budget` follow `tokenize.long_records` (refuse | truncate | split_with_prompt,
packtrain.data.long_records: a split record becomes several documents of the store, each ≤ the budget and each
starting with the record's prompt, masked) and control strings typed in content follow `tokenize.control_text`
(packtrain.data.record_fit, which counts both for the stats).

Encoding uses `Tokenizer.encode_batch` on `batch_docs` documents at a time with tokenizers' Rayon thread
pool enabled for the call (`workers` threads; TOKENIZERS_PARALLELISM is off elsewhere in packtrain):
≈4-6 M chars/s on 2 cores with vocab 4096.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from packtrain.config import TokenizeConfig
from packtrain.data.chat import record_batches
from packtrain.data.documents_frame import resolve_documents
from packtrain.data.ingest import length_summary
from packtrain.data.record_fit import RecordFit
from packtrain.data.split import doc_hash_unit, split_eval
from packtrain.data.token_store import SPLIT_EVAL, SPLIT_TRAIN, TokenStore, TokenStoreWriter
from packtrain.data.tokenize_stats import TokenizeStats
from packtrain.data.tokenizer_files import tokenizer_hash
from packtrain.data.tokenizer_setup import (
    _document_ids,
    _ship_tokenizer,
    load_tokenizer,
    special_tokens_rule,
    tokenizer_threads,
    train_tokenizer,
)
from packtrain.errors import ConfigError, InputDataError

ENCODE_CHARS = 4 << 20
"""Characters per encode_batch call: the call's Encoding objects cost ~100 bytes per token until they are
written out, so a 2,000-document batch of long documents held ~600 MB; 4 M characters hold ~150 MB."""


def _by_chars(texts: list[str], limit: int):
    """Consecutive slices of `texts` of ≤ `limit` characters each (a longer document alone)."""
    start, total = 0, 0
    for i, t in enumerate(texts):
        if total and total + len(t) > limit:
            yield texts[start:i]
            start, total = i, 0
        total += len(t)
    if start < len(texts):
        yield texts[start:]


def _is_text_type(t) -> bool:
    """string, large_string, string_view, null, or a dictionary of one of them (a pandas categorical)."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)
            or getattr(pa.types, "is_string_view", lambda _: False)(t))


def _open_documents(path: Path):
    """(ParquetFile, doc_ids int64 [n]) after checking the columns; the texts stay on disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path, pre_buffer=False)   # pre-buffering keeps every read row group alive
        names = pf.schema_arrow.names
        if "doc_id" not in names or "text" not in names:
            raise KeyError(f"columns are {names}")
        text_type = pf.schema_arrow.field("text").type
        doc_ids = pf.read(columns=["doc_id"]).column("doc_id").to_numpy().astype(np.int64)
    except (pa.ArrowException, OSError, KeyError, ValueError) as e:
        raise InputDataError(f"{path}: cannot read columns doc_id, text ({e})") from None
    if not _is_text_type(text_type):
        raise InputDataError(f"{path}: column text is {text_type}; expected strings")
    if not len(doc_ids):
        raise InputDataError(f"{path}: no documents")
    return pf, doc_ids


def _text_batches(pf, path: Path, doc_ids: np.ndarray, batch_docs: int):
    """Yield (first document index, arrow string array) batch by batch; a missing text is an InputDataError
    naming its doc_id."""
    import pyarrow as pa

    start = 0
    for rb in pf.iter_batches(batch_size=batch_docs, columns=["text"]):
        col = rb.column(0)
        if not pa.types.is_large_string(col.type):   # dictionary / string_view / null → one plain layout
            col = col.cast(pa.large_string())
        if col.null_count:
            j = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise InputDataError(f"{path}: doc_id {doc_ids[start + j]}: text is None; expected a string "
                                 "(run `packtrain validate` to list every bad row)")
        yield start, col
        start += len(col)


def _char_lengths(pf, path: Path, doc_ids: np.ndarray, batch_docs: int) -> np.ndarray:
    """Characters (code points) of every document, int64 [n], streamed."""
    import pyarrow.compute as pc

    out = np.zeros(len(doc_ids), dtype=np.int64)
    for start, col in _text_batches(pf, path, doc_ids, batch_docs):
        out[start: start + len(col)] = pc.utf8_length(col).to_numpy(zero_copy_only=False)
    return out


def _training_texts(pf, path: Path, doc_ids: np.ndarray, split: np.ndarray, u: np.ndarray,
                    lengths: np.ndarray, budget: int, batch_docs: int) -> list[str]:
    """≈`budget` characters of train documents in decreasing u order (the last one cut), read in one pass."""
    take: dict[int, int] = {}
    total = 0
    order = np.argsort(-u, kind="stable")
    for i in order:
        if split[i] != SPLIT_TRAIN or not lengths[i]:
            continue
        take[int(i)] = min(int(lengths[i]), budget - total)
        total += take[int(i)]
        if total >= budget:
            break
    chosen: dict[int, str] = {}
    for start, col in _text_batches(pf, path, doc_ids, batch_docs):
        for j in [j for j in range(len(col)) if start + j in take]:
            chosen[start + j] = col[j].as_py()[: take[start + j]]
        if len(chosen) == len(take):
            break
    return [chosen[int(i)] for i in order if int(i) in chosen]


class _Tokenizer(NamedTuple):
    """The tokenizer a tokenize run encodes with, and where it came from (meta.json, TokenizeStats)."""

    hf: Any             # transformers PreTrainedTokenizerFast
    source: str         # the loaded directory (resolved) or "trained"
    hash: str | None    # tokenizer_files.tokenizer_hash of its files
    train_chars: int    # characters it was trained on (0: loaded)


def _tokenizer(cfg: TokenizeConfig, tokenizer_from: str | None, pf, path: Path, doc_ids: np.ndarray,
               split: np.ndarray, u: np.ndarray, tok_dir: Path) -> _Tokenizer:
    """Load `cfg.tokenizer_dir` and ship its files to `tok_dir`, or train one there on train documents."""
    if cfg.tokenizer_dir:
        field_name = f"model.init_from {tokenizer_from}" if tokenizer_from else "tokenize.tokenizer_dir"
        hf = load_tokenizer(cfg.tokenizer_dir, field_name)
        source = str(Path(cfg.tokenizer_dir).resolve())
        tok_hash = tokenizer_hash(cfg.tokenizer_dir)
        _ship_tokenizer(hf, Path(cfg.tokenizer_dir), tok_dir, field_name)
        return _Tokenizer(hf, source, tok_hash, 0)
    lengths = _char_lengths(pf, path, doc_ids, cfg.batch_docs)
    sample = _training_texts(pf, path, doc_ids, split, u, lengths, cfg.train_chars, cfg.batch_docs)
    train_chars = sum(map(len, sample))
    hf = train_tokenizer(sample, cfg.vocab_size, tok_dir)
    del sample
    return _Tokenizer(hf, "trained", tokenizer_hash(tok_dir), train_chars)


def _encode_records(pf, doc_ids: np.ndarray, batch_docs: int, fit: RecordFit, writer: TokenStoreWriter,
                    wrap, prefix: list[int], eos: int | None, own_template: bool, bar) -> tuple[int, int, list[str]]:
    """Chat / prompt-completion records → store documents with their loss masks (RecordFit decides how a
    record fits the budget): (characters, loss tokens, problems: one line per record that cannot be used)."""
    chars, loss_tokens = 0, 0
    problems: list[str] = []
    for start, rows in record_batches(pf, batch_docs):
        for j, (text, fmt, rec, src) in enumerate(rows):
            written, bad = fit.row(text, fmt, rec, wrap, prefix, own_template)
            if bad:
                problems.append(f"{src} (doc_id {int(doc_ids[start + j])}): {bad}")
                written = [([eos if eos is not None else 0], [0])]   # placeholder; never published
            for ids, mask in written:
                writer.append(ids, mask)
                loss_tokens += int(sum(mask))
                fit.rows_of_docs.append(start + j)
            chars += len(text)
        bar.update(len(rows))
    return chars, loss_tokens, problems


def _encode_texts(pf, path: Path, doc_ids: np.ndarray, batch_docs: int, encode, writer: TokenStoreWriter,
                  wrap, bar) -> int:
    """Plain text documents → store documents, `ENCODE_CHARS` at a time: the characters read."""
    chars = 0
    for _, col in _text_batches(pf, path, doc_ids, batch_docs):
        texts = col.to_pylist()
        for sub in _by_chars(texts, ENCODE_CHARS):   # bounds the Encoding objects alive at once
            for enc in encode(sub, add_special_tokens=False):
                writer.append(wrap(enc.ids))
        chars += sum(map(len, texts))
        bar.update(len(texts))
    return chars


def _refuse_records(path: Path, problems: list[str], fit: RecordFit | None) -> None:
    """One InputDataError naming (up to 20 of) the records that cannot be tokenized, if there are any."""
    if problems:
        raise InputDataError(
            f"{path}: {len(problems)} record(s) cannot be tokenized for training: "
            + "; ".join(problems[:20]) + (f"; ... ({len(problems) - 20} more)" if len(problems) > 20 else "")
            + ". Fix or remove them (`packtrain validate` lists malformed records row by row); a prompt "
            "longer than the pack budget needs a larger pack.budget or a shorter prompt"
            + ("" if fit is None else fit.hint()))


def _finish_store(writer: TokenStoreWriter, doc_ids: np.ndarray, split: np.ndarray, meta: dict,
                  chat: str | None, fit: RecordFit | None) -> TokenStore:
    """The store's meta.json (+ the chat template and RecordFit's counts) and every store document's doc_id and
    split (a split record's pieces keep their record's)."""
    if chat is not None:
        meta["chat_template"] = chat
    if fit is None:
        return writer.finish(doc_ids, split, meta)
    meta.update(fit.meta())
    rows_of = np.frombuffer(fit.rows_of_docs, dtype=np.int64)   # table row of every store document
    return writer.finish(doc_ids[rows_of], split[rows_of], meta)


def tokenize_documents(docs: str | Path, out_dir: str | Path, cfg: TokenizeConfig,
                       publish: bool = True, tokenizer_from: str | None = None,
                       prompt_budget: int | None = None) -> TokenizeStats:
    """Train/load the tokenizer, encode every document (+ EOS), write the token store to `out_dir`.

    `tokenizer_from`: set when `cfg.tokenizer_dir` is the init model's directory (the tokenize stage's
    substitution); recorded in meta.json and the stats, and named in errors instead of tokenize.tokenizer_dir.
    `prompt_budget`: chat / prompt-completion records whose prompt has ≥ this many tokens are refused (the
    stage passes pack.budget); None → not checked.

    Streams: texts are read `batch_docs` at a time and each batch's ids go straight to the store's temp file,
    so memory is O(documents) + one batch, whatever the corpus size (200 MB of text: peak RSS 1.66 GB when
    everything was held in memory; see docs/data.md for the streamed figure). `out_dir` is replaced atomically
    (token_store.TokenStoreWriter); a failure leaves it as it was. `publish=False`: write straight into
    `out_dir` (new or empty), which the caller publishes with its other outputs (the tokenize stage).
    """
    from tqdm import tqdm

    t0 = time.perf_counter()
    path = resolve_documents(docs)
    out_dir = Path(out_dir)
    pf, doc_ids = _open_documents(path)
    n_docs = len(doc_ids)
    split = split_eval(doc_ids, cfg.eval_fraction)
    u = doc_hash_unit(doc_ids)

    with TokenStoreWriter(out_dir, publish=publish) as writer:
        tok_dir = writer.dir / "tokenizer"   # saved straight into the store being built
        t1 = time.perf_counter()
        with tokenizer_threads(cfg.workers):
            tok = _tokenizer(cfg, tokenizer_from, pf, path, doc_ids, split, u, tok_dir)
            hf = tok.hf
            train_s = time.perf_counter() - t1
            eos = hf.eos_token_id
            if cfg.append_eos and eos is None:
                raise ConfigError(f"tokenize.append_eos is true but the tokenizer from {tok.source} has no eos_token")
            prefix, suffix = special_tokens_rule(hf)
            backend = hf.backend_tokenizer
            encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
            wrap = _document_ids(prefix, suffix, eos, cfg.append_eos)
            records = "record" in pf.schema_arrow.names
            chat = None
            if records:
                from packtrain.data.chat import has_own_template

                chat = "tokenizer" if cfg.chat_template == "auto" and has_own_template(hf) else "builtin"
                writer.enable_mask()
            loss_tokens = 0
            problems: list[str] = []
            fit = RecordFit(cfg, prompt_budget, hf, chat == "builtin") if records else None
            t2 = time.perf_counter()
            with tqdm(total=n_docs, unit="doc", desc="tokenize", file=sys.stderr, delay=2.0, leave=False) as bar:
                if fit is not None:
                    chars, loss_tokens, problems = _encode_records(pf, doc_ids, cfg.batch_docs, fit, writer, wrap,
                                                                   prefix, eos, chat == "tokenizer", bar)
                else:
                    chars = _encode_texts(pf, path, doc_ids, cfg.batch_docs, encode, writer, wrap, bar)
            _refuse_records(path, problems, fit)
            encode_s = time.perf_counter() - t2
            meta = {"vocab_size": len(hf), "eos_id": eos, "pad_id": hf.pad_token_id, "bos_id": hf.bos_token_id,
                    "append_eos": cfg.append_eos, "tokenizer": tok.source, "tokenizer_hash": tok.hash,
                    "tokenizer_from": tokenizer_from, "special_prefix": prefix, "special_suffix": suffix}
            store = _finish_store(writer, doc_ids, split, meta, chat, fit)

    lengths = store.lengths()
    is_eval = store.split == SPLIT_EVAL
    n_tok = int(lengths.sum())
    return TokenizeStats(
        documents=store.n_docs, tokens=n_tok, train_documents=int((~is_eval).sum()),
        eval_documents=int(is_eval.sum()), train_tokens=int(lengths[~is_eval].sum()),
        eval_tokens=int(lengths[is_eval].sum()), chars=chars, chars_per_token=round(chars / max(n_tok, 1), 4),
        vocab_size=store.vocab_size, eos_id=eos, pad_id=hf.pad_token_id, append_eos=cfg.append_eos,
        tokenizer=tok.source, tokenizer_train_chars=tok.train_chars, length_tokens=length_summary(lengths.tolist()),
        train_seconds=round(train_s, 3), encode_seconds=round(encode_s, 3),
        tokens_per_second=round(n_tok / max(encode_s, 1e-9), 1), seconds=round(time.perf_counter() - t0, 3),
        output=str(out_dir), tokenizer_hash=tok.hash, tokenizer_from=tokenizer_from, special_prefix=prefix,
        special_suffix=suffix, loss_mask=records, loss_tokens=loss_tokens if records else None,
        chat_template=chat, **(fit.stats() if fit is not None else {"text_rows": n_docs}))
