"""A tiny model directory for tests and smoke runs: a byte-level BPE trained on `texts` + a random-init Llama.

    build_tiny_model_dir(tmp / "model", texts, vocab_size=300)   # ~0.1 s, ~60k parameters
    → model/{config.json, model.safetensors, generation_config.json, tokenizer.json, tokenizer_config.json}

The same layout the train stage writes (`save_pretrained` with the tokenizer next to the model), so
evaluate/register run on it unchanged. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

EOS = "<|endoftext|>"


def train_tiny_tokenizer(texts: list[str], vocab_size: int = 300):
    """A PreTrainedTokenizerFast: byte-level BPE (256 byte symbols + merges + EOS), eos = pad = EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def build_tiny_model_dir(out_dir: str | Path, texts: list[str], vocab_size: int = 300, seed: int = 0,
                         hidden_size: int = 32, num_layers: int = 2, num_heads: int = 4,
                         max_positions: int = 512, init_std: float = 0.02) -> Path:
    """Save a random-init LlamaForCausalLM + its tokenizer into `out_dir` (save_pretrained); returns it.

    Different `seed`s give different weights (hence different eval losses), same shapes.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    tok = train_tiny_tokenizer(texts, vocab_size)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=num_heads,
                      max_position_embeddings=max_positions, tie_word_embeddings=True,
                      initializer_range=init_std, bos_token_id=None, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    return out_dir


def write_tiny_packs(split_dir: str | Path, docs: list, budget: int, pad_id: int = 0, vocab_size: int = 0,
                     eos_id: int | None = None) -> Path:
    """A real pack store split (packtrain.packing.store format) from token arrays, bfd-packed.

    docs: list of int arrays (each 1 ≤ len ≤ budget); document i gets doc_id i. For tests that need eval
    packs without running tokenize + pack; `packtrain pack` writes the same format.
    """
    import numpy as np

    from packtrain.packing.store import write_pack_store
    from packtrain.packing.strategies import bfd

    lengths = np.array([len(d) for d in docs], np.int64)
    item_bin = bfd(lengths, budget)                                   # [n_docs] pack of each document
    order = np.argsort(item_bin, kind="stable")
    counts = np.bincount(item_bin, minlength=int(item_bin.max()) + 1)
    seg_offsets = np.concatenate([[0], np.cumsum(counts)])
    pack_offsets = np.concatenate([[0], np.cumsum(np.bincount(item_bin, weights=lengths).astype(np.int64))])
    segments = np.stack([order, np.zeros_like(order), lengths[order]], axis=1)
    meta = {"budget": budget, "vocab_size": vocab_size, "pad_id": pad_id, "eos_id": eos_id,
            "strategy": "bfd", "seed": 0, "split": Path(split_dir).name}
    return write_pack_store(split_dir, (np.asarray(docs[i], np.uint32) for i in order), pack_offsets,
                            seg_offsets, segments, meta)
