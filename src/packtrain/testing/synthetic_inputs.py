"""Synthetic training inputs (token store + pack store + tokenizer) for tests and the GPU smoke benchmark.

Documents have lognormal lengths (median `median_len`, σ=`sigma`: the long tail of real corpora) and are
drawn from a sparse order-1 Markov chain (each token has 4 likely successors), so a model's loss falls
visibly within tens of steps (from ln V toward ≈ ln 4) instead of sitting at ln V as with uniform noise.
The tokenizer is a word-level one over the names t0..t{V-1} (+ <pad>, <eos>, <unk> inside V), built without
training, loadable by AutoTokenizer.

    make_synthetic_inputs(root, n_docs=400, vocab_size=512, budget=256)
      root/tokenize/   token store (packtrain.data.token_store) with tokenizer/
      root/pack/train/, root/pack/eval/   pack stores (packtrain.packing.dataset.pack_dataset, bfd)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPECIALS = ("<pad>", "<eos>", "<unk>")


def lognormal_lengths(n: int, median_len: float, sigma: float, max_len: int, rng) -> np.ndarray:
    """int64 [n] in [2, max_len]: exp(N(ln median, σ²)). σ=1: p90/p50 ≈ 3.6 (a long tail)."""
    raw = np.exp(rng.normal(np.log(median_len), sigma, n))
    return np.clip(np.round(raw), 2, max_len).astype(np.int64)


def markov_documents(lengths: np.ndarray, vocab_size: int, rng, eos_id: int | None = None) -> list[np.ndarray]:
    """Token arrays drawn from a fixed sparse Markov chain (4 successors per token), EOS appended."""
    lo = len(SPECIALS)
    succ = rng.integers(lo, vocab_size, size=(vocab_size, 4))   # successors of each token
    docs = []
    for n in lengths:
        body = int(n) - (eos_id is not None)
        toks = np.empty(body, np.int64)
        toks[0] = rng.integers(lo, vocab_size)
        picks = rng.integers(0, 4, size=body)
        for i in range(1, body):
            toks[i] = succ[toks[i - 1], picks[i]]
        docs.append(np.append(toks, eos_id) if eos_id is not None else toks)
    return docs


def write_tokenizer(path: Path, vocab_size: int) -> Path:
    """A word-level tokenizer: ids 0..2 = <pad>, <eos>, <unk>; id i ≥ 3 = 't{i}'."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update({f"t{i}": i for i in range(len(SPECIALS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(path)
    return path


def make_synthetic_inputs(root: str | Path, n_docs: int = 400, vocab_size: int = 512, budget: int = 256,
                          median_len: float | None = None, sigma: float = 1.0, eval_fraction: float = 0.1,
                          seed: int = 0) -> tuple[Path, Path]:
    """Write root/tokenize (token store + tokenizer) and root/pack/{train,eval}; returns (tokens_dir, packs_dir)."""
    from packtrain.data.token_store import write_token_store

    root = Path(root)
    rng = np.random.default_rng(seed)
    pad_id, eos_id = 0, 1
    lengths = lognormal_lengths(n_docs, median_len or budget / 4, sigma, 2 * budget, rng)
    docs = markov_documents(lengths, vocab_size, rng, eos_id)
    split = (rng.random(n_docs) < eval_fraction).astype(np.uint8)
    doc_ids = np.arange(n_docs, dtype=np.int64)
    tok_tmp = root / ".tokenizer-src"
    write_tokenizer(tok_tmp, vocab_size)
    tokens_dir = root / "tokenize"
    write_token_store(tokens_dir, docs, doc_ids, split,
                      {"vocab_size": vocab_size, "eos_id": eos_id, "pad_id": pad_id}, tokenizer_dir=tok_tmp)
    import shutil

    shutil.rmtree(tok_tmp)
    from packtrain.config import PackConfig
    from packtrain.packing.dataset import pack_dataset

    packs_dir = root / "pack"
    pack_dataset(tokens_dir, packs_dir, PackConfig(budget=budget, strategy="bfd"))   # the pack stage's library
    return tokens_dir, packs_dir
