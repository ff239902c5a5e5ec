"""Tiny random-weight checkpoints of every supported family, made locally (nothing is downloaded).

Each is the family's own transformers config class at toy sizes (hidden 32, 2 layers, 4 heads / 2 KV heads)
with the family's quirks switched on and made visible at toy lengths — a sliding window of 4 tokens on the
families that have one, Gemma2's soft-caps, Qwen3/Gemma head_dim ≠ hidden/heads — saved with `save_pretrained`
next to a word-level tokenizer, so `model.init_from=<dir>` and plain `AutoModelForCausalLM.from_pretrained`
load it like a released checkpoint:

    build_tiny_family_dir(tmp / "qwen2", "qwen2")      # ~0.1 s, ~20k parameters
    → qwen2/{config.json, model.safetensors, generation_config.json, tokenizer.json, tokenizer_config.json}

The tokenizer: ids 0..3 = <pad>, <eos>, <unk>, <bos>; id i ≥ 4 = 't{i}' (whitespace-split words), so texts
like "t5 t9 t12" encode without training. Families whose released tokenizers prepend BOS (Llama, Mistral,
Gemma, Phi-3) get a post-processor that does the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packtrain.model.saving import save_pretrained

SPECIALS = ("<pad>", "<eos>", "<unk>", "<bos>")
PAD, EOS, UNK, BOS = range(4)
WINDOW = 4
"""Sliding window of the tiny fixtures: shorter than the test documents, so a backend ignoring it is caught."""

COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
              pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, use_cache=False)
# initializer_range 0.2 (not 0.02): with toy widths the default makes attention nearly uniform, and a test that
# compares logits should see large differences when a document leaks or a window is dropped

FAMILY_KWARGS: dict[str, dict[str, Any]] = {
    "llama": dict(tie_word_embeddings=True),
    "mistral": dict(sliding_window=WINDOW, head_dim=8),
    "qwen2": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, tie_word_embeddings=True),
    "qwen3": dict(head_dim=16, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                  tie_word_embeddings=True),
    "gemma2": dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                   final_logit_softcapping=3.0, layer_types=["sliding_attention", "full_attention"]),
    "gemma3_text": dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16,
                        layer_types=["sliding_attention", "full_attention"]),
    "phi3": dict(sliding_window=WINDOW),
}
"""Per family, on top of COMMON. Soft-caps of 2 and 3 (Gemma2 ships 50 and 30) so they bite on toy logits."""
ADDS_BOS = {"llama", "mistral", "gemma2", "gemma3_text", "phi3"}
FAMILY_NAMES = tuple(FAMILY_KWARGS)


def tiny_family_config(family: str, vocab_size: int = 97, attn_implementation: str | None = None, **overrides):
    """The family's transformers config at toy sizes (`overrides` replace any key). Default attention: sdpa,
    eager for Gemma2 (transformers refuses sdpa for it)."""
    from transformers import AutoConfig

    if family not in FAMILY_KWARGS:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILY_NAMES)})")
    kw = {**COMMON, **FAMILY_KWARGS[family], "vocab_size": vocab_size, **overrides}
    cfg = AutoConfig.for_model(family, **kw)
    cfg._attn_implementation = attn_implementation or ("eager" if family == "gemma2" else "sdpa")
    return cfg


def tiny_family_model(family: str, vocab_size: int = 97, seed: int = 0, attn_implementation: str | None = None,
                      **overrides):
    """A random-init model of the family (fp32, eval mode, use_cache False)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_family_config(family, vocab_size, attn_implementation, **overrides)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def write_family_tokenizer(path: str | Path, vocab_size: int, add_bos: bool):
    """A word-level PreTrainedTokenizerFast over <pad> <eos> <unk> <bos> t4 … t{V-1}, saved to `path`.

    Caveat (transformers 5.24): next to a qwen2 config.json, AutoTokenizer picks Qwen2Tokenizer from the
    model_type and rebuilds it from a byte-level BPE that this word-level vocabulary is not, so the qwen2
    fixture's tokenizer encodes text to no ids (tokenize refuses it: "encodes 'Hello world' to no ids"). A
    real Qwen2 checkpoint ships its own BPE files and loads fine; tests that tokenize text use qwen3."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update({f"t{i}": i for i in range(len(SPECIALS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                           special_tokens=[("<bos>", BOS)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   bos_token="<bos>")
    fast.save_pretrained(str(path))
    return fast


def build_tiny_family_dir(out_dir: str | Path, family: str, vocab_size: int = 97, seed: int = 0,
                          **overrides) -> Path:
    """save_pretrained a tiny random-init model of `family` + its tokenizer into `out_dir`; returns it."""
    out_dir = Path(out_dir)
    model = tiny_family_model(family, vocab_size, seed, **overrides)
    save_pretrained(model, str(out_dir))
    write_family_tokenizer(out_dir, vocab_size, add_bos=family in ADDS_BOS)
    return out_dir
