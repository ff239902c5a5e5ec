"""Warm start checks and the step-0 held-out loss, for the train stage.

    check_store_matches_model(tokens_dir, init)   before any work: the token store's ids must be the model's
    initial_eval(init_dir, eval_split, eval_cfg)  the held-out loss of the initial weights, before training

Mismatch rules (ConfigError, exit 2, naming both sides and what to do; nothing is written), after the family's
own (family, backend) refusal:
- (model.tokenizer_check=strict, the default) the token store's tokenizer_hash (meta.json; for older stores
  the hash of its tokenizer/) differs from the tokenizer the init model ships
  (packtrain.data.tokenizer_files.tokenizer_hash): the model would read other tokens' ids — silent garbage;
- the model's vocabulary is smaller than the store's max_token_id + 1: an embedding lookup out of range.
A model directory without a tokenizer gets the vocabulary check only.

Step-0 loss: the same evaluation as the evaluate stage (packtrain.evaluate.perplexity: open_eval_loader,
evaluate_batches, the same evaluate.rows / max_batches / precision / attention / device / seed), on the initial
weights loaded as the evaluate stage loads a model (packtrain.evaluate.loading.load_model_dir: the family ×
evaluate.attention check, fp32, AutoModelForCausalLM). Warm-started from the champion
on the same data, it equals the champion's recorded eval_loss (fp32 CPU: to ~1e-7): training continues exactly
where the champion ended.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

from packtrain.errors import ConfigError

if TYPE_CHECKING:
    from packtrain.config import EvalConfig
    from packtrain.registry.source import InitSource


def _short(h: str | None) -> str:
    return h[:23] if h else "none"   # sha256: + 16 hex digits


def model_vocab_size(path: Path) -> int:
    """The checkpoint's vocabulary (its config.json; an unknown architecture is a ConfigError naming it)."""
    from packtrain.model.build import read_checkpoint_config

    cfg = read_checkpoint_config(path)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    vocab = getattr(text, "vocab_size", None) or getattr(cfg, "vocab_size", None)
    if not vocab:
        raise ConfigError(f"model.init_from {path}: config.json has no vocab_size")
    return int(vocab)


def check_store_matches_model(tokens_dir: str | Path, init: InitSource, attention: str | None = None,
                              mode: str = "strict") -> dict:
    """Refuse a token store the init model cannot read (module doc). Returns what was compared:
    {"mode", "store_tokenizer_hash", "model_tokenizer_hash", "max_token_id", "model_vocab_size"} ({} from
    scratch). `attention`: the training backend — the family's own refusal (packtrain.model.families) comes
    first, so an unsupported pair is named as such. `mode`: model.tokenizer_check (strict | vocab)."""
    from packtrain.data.token_store import TokenStore
    from packtrain.data.tokenizer_files import tokenizer_hash
    from packtrain.model.build import read_checkpoint_config
    from packtrain.model.families import check_attention

    if init.path is None:
        return {}
    tokens_dir = Path(tokens_dir)
    where = f"model.init_from {init.value!r}" + (f" ({init.resolved} in {init.path})" if init.uri else
                                                 f" ({init.path})" if str(init.path) != init.value else "")
    if attention is not None:
        check_attention(read_checkpoint_config(init.path), attention, training=True,
                        where=f"model.init_from {init.path}")
    vocab = model_vocab_size(init.path)
    store = TokenStore.open(tokens_dir) if (tokens_dir / "meta.json").is_file() else None
    meta = store.meta if store is not None else {}
    store_hash = meta.get("tokenizer_hash") or tokenizer_hash(tokens_dir / "tokenizer")
    model_hash = tokenizer_hash(init.path)
    made_by = meta.get("tokenizer_from") or meta.get("tokenizer") or str(tokens_dir / "tokenizer")
    if mode == "strict" and model_hash and store_hash and model_hash != store_hash:
        raise ConfigError(
            f"token store {tokens_dir} was made by tokenizer {_short(store_hash)}… ({made_by}), but {where} ships "
            f"tokenizer {_short(model_hash)}…: the model would read other tokens' ids. Re-run `packtrain tokenize` "
            f"with the same model.init_from (it then tokenizes with the model's own tokenizer), or train from "
            f"model.init_from=scratch (model.tokenizer_check=vocab skips this comparison when the ids are known "
            f"to match)")
    out = {"mode": mode, "store_tokenizer_hash": store_hash, "model_tokenizer_hash": model_hash,
           "model_vocab_size": vocab}
    if store is not None:
        top = store.max_token_id
        out["max_token_id"] = top
        if top + 1 > vocab:
            raise ConfigError(
                f"{where}: vocab_size {vocab} < the tokenizer's {store.vocab_size}: token store {tokens_dir} holds "
                f"token id {top} (needs ≥ {top + 1}), made by another tokenizer ({made_by}). Re-run `packtrain "
                f"tokenize` with the same model.init_from (the model's own tokenizer), or train from scratch")
    return out


def initial_eval(init_dir: str | Path, eval_split_dir: str | Path, eval_cfg: EvalConfig) -> dict | None:
    """Held-out loss of the model in `init_dir` before any training (module doc); None when there are no
    eval packs (tokenize.eval_fraction 0).

    Returns {"eval_loss", "perplexity", "n_label_tokens", "n_batches", "n_batches_epoch", "complete", "device",
    "precision", "attention", "seconds"}.
    """
    import itertools

    import torch
    from transformers import AutoModelForCausalLM

    from packtrain.config.evaluate import eval_precision
    from packtrain.data.tokenizer_files import has_tokenizer
    from packtrain.evaluate.loading import load_model_dir, resolve_device
    from packtrain.evaluate.perplexity import evaluate_batches, open_eval_loader
    from packtrain.model.attention import HF_NAMES, register_attention_backends
    from packtrain.model.build import read_checkpoint_config
    from packtrain.model.families import check_attention, checkpoint_config, pick_attention

    eval_split_dir = Path(eval_split_dir)
    if not eval_split_dir.is_dir():
        return None
    t0 = time.perf_counter()
    dev = resolve_device(eval_cfg.device)
    precision = eval_precision(eval_cfg.precision, dev.type)
    # evaluate.attention for the init model's family: auto → a backend it allows (Gemma2 on the CPU: eager)
    backend = pick_attention(eval_cfg.attention, dev, precision, checkpoint_config(init_dir),
                             training=False, key="evaluate.attention", where=f"model.init_from {init_dir}")
    loader = open_eval_loader(eval_split_dir, eval_cfg.rows, eval_cfg.seed, device_type=dev.type)
    n_epoch = len(loader)
    if n_epoch == 0:
        return None
    n = n_epoch if eval_cfg.max_batches is None else min(n_epoch, eval_cfg.max_batches)
    if has_tokenizer(init_dir):   # exactly as the evaluate stage loads its model (family × backend check, fp32)
        model, _ = load_model_dir(init_dir, dev, backend)
    else:                         # a bare checkpoint: the same check and load without the tokenizer
        register_attention_backends()
        check_attention(read_checkpoint_config(Path(init_dir)), backend, training=False,
                        where=f"model.init_from {init_dir}", key="evaluate.attention")
        model = AutoModelForCausalLM.from_pretrained(str(init_dir), attn_implementation=HF_NAMES[backend],
                                                     dtype=torch.float32).to(dev).eval()
    try:
        sums = evaluate_batches(model, itertools.islice(iter(loader), n), dev, precision, total=n,
                                backend=backend)
    finally:
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if not sums["n_label_tokens"]:
        return None
    loss = sums["loss_sum"] / sums["n_label_tokens"]
    return {"eval_loss": loss, "perplexity": math.exp(min(loss, 700.0)), "n_label_tokens": sums["n_label_tokens"],
            "n_batches": sums["n_batches"], "n_batches_epoch": n_epoch, "complete": sums["n_batches"] == n_epoch,
            "device": str(dev), "precision": precision, "attention": backend,
            "seconds": round(time.perf_counter() - t0, 3)}


INIT_EVAL_FILE = "init_eval.json"
"""<train out>/init_eval.json: the step-0 evaluation, kept so a resumed run reports the number it started from."""


def read_init_eval(out_dir: Path) -> dict | None:
    p = Path(out_dir) / INIT_EVAL_FILE
    try:
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None
    except (OSError, ValueError):
        return None
