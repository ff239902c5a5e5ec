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

    def to_dict(self) -> dict:
        return asdict(self)
