"""What the tokenize library step measured (`TokenizeStats`), in a module of its own with no heavy import: the
tokenize stage's typed result (packtrain.stages.results.TokenizeResult) is these fields plus the stage's own, by
inheritance — one field list, not two."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class TokenizeStats:
    """What tokenize wrote. `length_tokens`: min/p50/p90/p99/max/mean tokens per document (EOS included)."""

    documents: int
    tokens: int
    train_documents: int
    eval_documents: int
    train_tokens: int
    eval_tokens: int
    chars: int
    chars_per_token: float
    vocab_size: int
    eos_id: int | None
    pad_id: int | None
    append_eos: bool
    tokenizer: str  # "trained" or the directory it was loaded from
    tokenizer_train_chars: int
    length_tokens: dict[str, float] = field(default_factory=dict)
    train_seconds: float = 0.0
    encode_seconds: float = 0.0
    tokens_per_second: float = 0.0
    seconds: float = 0.0
    output: str = ""
    tokenizer_hash: str | None = None           # packtrain.data.tokenizer_files.tokenizer_hash
    tokenizer_from: str | None = None           # model.init_from when the tokenizer came with the init model
    special_prefix: list[int] = field(default_factory=list)   # ids the tokenizer puts before a text (BOS)
    special_suffix: list[int] = field(default_factory=list)   # ... and after it (before the appended EOS)
    loss_mask: bool = False                 # loss_mask.bin written (chat / prompt-completion records)
    loss_tokens: int | None = None          # tokens with mask 1 (None without a mask: all of them)
    chat_template: str | None = None        # "tokenizer" (its own chat_template) | "builtin" | None (no chat)
    # Rows of the table by kind, and the EOS rule each got (packtrain.data.record_fit): every text row gets the
    # appended EOS (append_eos); a record gets it unless its template wrote the tokenizer's EOS itself.
    text_rows: int = 0
    record_rows: int = 0
    eos_appended_records: int = 0
    eos_from_template_records: int = 0
    # Records longer than pack.budget (tokenize.long_records, packtrain.data.long_records). None: no records.
    long_records: str | None = None         # refuse | truncate | split_with_prompt
    record_budget: int | None = None        # the budget records were fitted to (pack.budget)
    records_over_budget: int = 0            # records longer than the budget (truncated or split; refused → error)
    records_split: int = 0                  # split_with_prompt: records written as several documents
    split_chunks: int = 0                   # ... the documents they became (each ≤ budget, each with the prompt)
    split_context_tokens: int = 0           # ... masked prompt/context tokens repeated in continuation chunks
    records_truncated: int = 0              # truncate: records cut to the budget
    record_truncated_tokens: int = 0        # tokens of records not written (the cut tails)
    control_text: str | None = None         # tokenize.control_text: as_text | refuse
    control_text_records: int = 0           # records with a control string typed in a content (as_text)

    def to_dict(self) -> dict:
        return asdict(self)
