"""Configs of the data stages: ingest, validate, tokenize."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from packtrain.config.base import (
    Float,
    Fraction,
    Int,
    NonNegativeInt,
    PathStr,
    PositiveInt,
    StrictModel,
    Text,
)


class IngestConfig(StrictModel):
    """Where documents come from and how a source splits into documents."""

    source: PathStr | None = None
    """A .txt/.jsonl/.parquet file or a folder of them. None → the default corpus (Python stdlib text)."""
    txt_mode: Literal["file", "paragraph"] = "file"
    """.txt sources: one document per file, or one per blank-line-separated block."""
    text_field: Text = "text"
    """JSON field (.jsonl) or column (.parquet) holding the text."""
    record_format: Literal["auto", "text", "messages", "prompt_completion"] = "auto"
    """.jsonl/.parquet records: auto → per file from its first record / columns: a `messages` list of
    {role, content} (chat), `prompt` + `completion`, else the text field. Chat and prompt/completion rows keep
    their structure in documents.parquet's `record` column; validate checks it (docs/data.md)."""
    default_corpus_mb: Float = Field(24.0, gt=0)
    """Target size of the default corpus in MB of UTF-8 text (≥ 20 MB keeps the long tail real)."""
    max_doc_chars: PositiveInt = 50_000_000
    """Documents longer than this are rejected at ingest (a single 100 MB document is almost always a bug)."""
    max_docs: PositiveInt | None = None
    """Keep only the first N documents in deterministic order (small runs, tests)."""
    on_bad_record: Literal["fail", "skip"] = "fail"
    """A document that cannot be used — a .jsonl line that is not valid UTF-8 or JSON, lacks the text field or
    holds a non-string; a null or over-long parquet value; a .txt file that is empty, shows no visible text,
    is not UTF-8 or is over-long; a record that validate's per-document rules would refuse (record shape, roles,
    role order, no visible text, a prompt over the pack budget as far as it can be counted before tokenize,
    packtrain.data.record_rules) — fails the stage (fail, the default: exit 3 at ingest, exit 4 at validate),
    or is dropped (skip): every skipped document is listed with its reason in ingest_result.json
    (`skipped_records`: source, reason), counted in `records_skipped` (an MLflow metric of the ingest run),
    and the run continues with the rest. File-level problems (unreadable file, no rows at all, a missing
    column) always fail."""
    unsupported: Literal["error", "skip"] = "error"
    """Folder sources: files that are not .txt/.jsonl/.parquet (hidden files aside), dangling or looping
    symlinks, links to a folder already read, and special files (FIFOs, sockets, devices) are an error naming
    them (default: silently dropped data is a classic pipeline bug), or skipped with a warning listing them
    (also recorded as `skipped_entries` in ingest_result.json)."""


class ContaminationConfig(StrictModel):
    """Eval-set contamination check of the validate stage (packtrain.data.contamination), on by default against
    everything the run scores: a training document that holds `min_coverage` of an eval document's word
    n-grams is contaminated (both sides lowercased, split into runs of letters, digits and `_`, so code words
    stay apart). docs/data.md#contamination says what is checked and why the default policy is drop."""

    ngram: Int = Field(13, ge=1, le=1000)
    """Words per n-gram (13: GPT-3 and lm-eval's decontamination). Smaller finds shorter shared passages and
    more chance overlaps."""
    min_ngram: Int = Field(8, ge=1, le=1000)
    """An eval document of min_ngram ≤ L < ngram words (a short task item) is matched whole, as one L-gram
    (GPT-3 took 8 as the floor of its per-benchmark n); a shorter one is never matched (counted as too short)."""
    min_coverage: Fraction = 0.5
    """Fraction of one eval document's n-grams a training document must hold to count as contaminated. 0.5
    finds verbatim and near-verbatim copies (a planted eval document, a templated near-duplicate file) but not
    a shared licence header or idiom (on the default corpus, any one shared 13-gram flags 164 of 1,409 training
    files against the held-out split, 0.5 flags 17 near-duplicates); 0 → any one shared n-gram (GPT-3, lm-eval)."""
    policy: Literal["fail", "drop", "warn"] = "drop"
    """drop (default): validate passes and lists them, tokenize leaves exactly those documents out of the token
    store (neither trained on nor in the eval split) and the run summary counts them; fail: validate exits 3
    naming every contaminated document (file:line, doc_id) and the eval record it overlaps; warn: listed and
    logged, trained on."""
    suites: bool = True
    """Check against every `evaluate.suites` entry (text suites' records; task suites' items built from the
    task's own fields: prompt + gold answer)."""
    held_out: bool = True
    """Check the training split against this run's held-out split (tokenize.eval_fraction, suite "recent"): a
    copy of a held-out document that lands in training is contaminated. Held-out documents are never flagged."""
    against: list[PathStr] = []
    """More eval files (.txt: one record per blank-line-separated block, .jsonl, .parquet, or an lm-eval task
    .yaml) or folders of them, each a suite named by its path. Relative paths are read from the working
    directory."""
    text_field: Text = "text"
    """JSON field (.jsonl) or column (.parquet) of the `against` files' text (chat / prompt-completion records
    are read as ingest reads them)."""


class ValidateConfig(StrictModel):
    """Thresholds of the Great Expectations suite for text corpora."""

    min_rows: PositiveInt = 10
    min_chars: NonNegativeInt = 1
    max_chars: PositiveInt = 5_000_000
    length_mostly: Float = Field(0.99, gt=0, le=1)
    """Fraction of documents whose length must lie in [min_chars, max_chars]."""
    max_duplicate_ratio: Fraction = 0.05
    """Duplicate texts / rows must not exceed this."""
    max_offending_ids: NonNegativeInt = 20
    """How many offending doc_ids the report lists per expectation."""
    contamination: ContaminationConfig = ContaminationConfig()
    """n-gram overlap of the documents with the run's eval suites, held-out split and `against` files (the
    `contamination` expectation)."""
    role_order: Literal["alternating", "any"] = "alternating"
    """Chat records: alternating → the role_order expectation refuses a conversation whose roles are not an
    optional leading system turn, then user and assistant alternating, starting with user and ending with
    assistant (tool turns only after an assistant turn, followed by a tool or assistant turn); the report
    names the file, line and the offending turn's index and role. any → roles are not ordered (only
    roles_allowed applies)."""

    @model_validator(mode="after")
    def _range(self):
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) must be ≤ max_chars ({self.max_chars})")
        return self


class TokenizeConfig(StrictModel):
    """Tokenizer training/loading and the token store."""

    tokenizer_dir: PathStr | None = None
    """A local directory with a saved tokenizer. None → train a byte-level BPE on the corpus."""
    vocab_size: Int = Field(4096, ge=260, le=1 << 20)
    train_chars: PositiveInt = 8_000_000
    """Characters of corpus used to train the BPE (enough for a stable vocab, bounded time)."""
    eval_fraction: Float = Field(0.02, ge=0, lt=1)
    """Documents held out for evaluation, chosen by a hash of doc_id (deterministic, never trained on)."""
    append_eos: bool = True
    """Append EOS to every document so the model learns to stop; the EOS counts as a document token."""
    workers: PositiveInt = 2
    batch_docs: PositiveInt = 2000
    chat_template: Literal["auto", "builtin"] = "auto"
    """Chat records: auto → the tokenizer's own chat_template when it has one, else the built-in ChatML-like
    template (`<|im_start|>role\ncontent<|im_end|>\n`, markers encoded as text); builtin → always the built-in
    one. The loss mask (1 = assistant content and its end-of-turn marker) is stored beside the ids
    (packtrain.data.chat)."""
    long_records: Literal["refuse", "truncate", "split_with_prompt"] = "split_with_prompt"
    """Chat / prompt-completion records longer than pack.budget (packtrain.data.long_records): refuse → an error
    naming each (validate's record_fits_budget names them first; ingest.on_bad_record=skip drops and counts them);
    truncate → the prompt + the head of the answer up to the budget, the rest dropped and counted;
    split_with_prompt → every continuation chunk starts with the record's prompt (masked), so no learned token is
    packed without its question (the repeated tokens are counted). Plain text rows follow pack.overlong."""
    control_text: Literal["as_text", "refuse"] = "as_text"
    """A control token typed inside a record's content (e.g. the text `<|im_end|>` or `<|endoftext|>` in a
    message): as_text → encoded as the plain text it is, never as the control id (counted, and said by the
    summary); refuse → the record is an error naming the turn and the string (validate's control_text check
    names it first; ingest.on_bad_record=skip drops it). Control strings: the tokenizer's special tokens, and the
    built-in template's markers (text in that template: a typed one reads like the template's own)."""
