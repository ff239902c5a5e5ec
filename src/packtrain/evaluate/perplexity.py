"""Held-out loss and perplexity over packed batches, with per-document attention isolation.

The eval split is the tokenize stage's held-out documents (chosen by a hash of doc_id, never trained on),
packed by the pack stage into `<packs>/eval`. One epoch over it, nothing dropped:

    batch (1, T = rows·budget)     input_ids   a a a a b b c c c · ·   ← `·` padding tail of a row
                                   position_ids 0 1 2 3 0 1 0 1 2 0 1   restart per document/padding (chunks of
                                                                        a split document: per the eval packs'
                                                                        meta.json chunk_positions, as in training)
                                   labels       - a a a - b - c c - -   `-` = -100 (doc start, padding)
    forward: packtrain.model.attention.model_inputs(batch, backend): sdpa/eager as (rows, budget) rows with
             restarting position_ids and no mask (transformers builds the block-diagonal mask), flex with a
             document BlockMask, varlen over cu_seqlens; always use_cache=False (docs/design.md)
    labels also -100 where the token store's loss_mask is 0 when the model was trained with train.loss_on ≠ all
             (read from the model directory, `loading.model_loss_on`): eval scores the tokens training did
    loss_sum += Σ CE(logits[t], labels[t+1]) over labels[t+1] ≠ -100         (fp64 accumulator)
    eval_loss = loss_sum / Σ label tokens;  perplexity = exp(eval_loss)

The token-mean over all label tokens makes the number independent of how documents were packed: it equals
the loss computed one document at a time (tests/unit/test_eval_perplexity.py, ≤ 1e-5 relative in fp32).
Logits are computed only at label positions, in chunks of `chunk` tokens, so memory is chunk × vocab × 4 B
(4096 × 32k → 0.5 GiB) instead of T × vocab.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtrain.errors import MissingDataError, PacktrainError
from packtrain.record_fields import MEMORY_ONLY, record_dict

if TYPE_CHECKING:
    from packtrain.config import EvalConfig
    from packtrain.evaluate.loading import Loaded

IGNORE_INDEX = -100
_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass
class EvalStats:
    """What `evaluate` measured: the evaluate stage's record (packtrain.stages.results.EvaluateResult) holds these
    fields, by inheritance, plus the lineage; the samples go to samples.json."""

    eval_loss: float              # nats per label token, token-mean over the whole split
    perplexity: float             # exp(eval_loss)
    n_label_tokens: int           # tokens that carry a loss (labels ≠ -100)
    n_real_tokens: int            # non-padding tokens fed to the model
    n_slot_tokens: int            # rows · budget · batches (incl. padding)
    n_segments: int               # document segments seen (a split long document counts per chunk)
    n_batches: int                # micro-batches evaluated
    n_batches_epoch: int          # micro-batches in one epoch over the eval packs
    complete: bool                # True when every eval pack was evaluated (no max_batches cap hit)
    seconds: float                # wall time of the forward passes (no generation)
    tokens_per_s: float           # n_real_tokens / seconds
    peak_memory_gib: float | None  # CUDA peak allocated during eval, or the process' max RSS on CPU
    memory_kind: str              # "cuda_peak_alloc" | "cpu_max_rss"
    device: str
    precision: str
    attention: str                # isolated attention backend: sdpa | eager | flex | varlen
    rows: int
    budget: int
    model_dir: str
    eval_split_dir: str
    timings: dict = field(default_factory=dict)         # load_s, warmup_s (CUDA), samples_s; the stage adds
                                                        # suites_s and total_s
    compiled: bool = False        # evaluate.compile: the decoder layers ran compiled (loading.compile_layers)
    samples: list[dict] = field(default_factory=list, metadata=MEMORY_ONLY)   # [{"prompt", "completion",
                                                                              # "n_new_tokens"}]: samples.json

    def to_dict(self) -> dict:
        return record_dict(self)


def batch_loss_sum(model, model_kwargs: dict, labels, chunk: int = 4096, index=None):
    """Σ cross-entropy over one packed batch (fp64 scalar tensor) and its label-token count.

    model_kwargs: `packtrain.model.attention.model_inputs(batch, backend)` — input_ids/position_ids as
    (rows, budget) for sdpa/eager or (1, T) plus the backend's mask/cu_seqlens, always use_cache=False.
    labels: int64 (1, T), HF-convention unshifted. Hidden states are flattened back to (1, T, H) (rows are
    contiguous in T; a row's first label is -100, so no target crosses a row). Only label positions go
    through the LM head: (N, H) → logits (≤ chunk, V). `index`: those positions in labels[0, 1:] (int64, on the
    model's device), found on the host before the batch was copied — the same rows as the boolean mask, without
    the device→host sync a mask's count costs.
    """
    import torch
    import torch.nn.functional as F

    from packtrain.train.loss import softcap_logits

    base, head = model.base_model, model.get_output_embeddings()
    if base is model or head is None:
        raise PacktrainError(f"{type(model).__name__} is not a causal LM with a separate LM head")
    hidden = base(**model_kwargs).last_hidden_state                  # (rows, L, H) or (1, T, H)
    hidden = hidden.reshape(1, -1, hidden.shape[-1])                  # (1, T, H)
    target = labels[:, 1:]                                            # (1, T-1)
    if index is None:
        keep = target != IGNORE_INDEX
        h, y = hidden[:, :-1][keep], target[keep]                     # (N, H), (N,)
    else:
        h, y = hidden[0, :-1].index_select(0, index), target[0].index_select(0, index)
    total = torch.zeros((), dtype=torch.float64, device=labels.device)
    cap = getattr(model.config, "final_logit_softcapping", None) or None   # Gemma2: as its own forward
    for i in range(0, y.numel(), chunk):
        logits = softcap_logits(head(h[i:i + chunk]).float(), cap)    # (≤chunk, V)
        total += F.cross_entropy(logits, y[i:i + chunk], reduction="sum").double()
    return total, int(y.numel())


def evaluate_batches(model, batches: Iterable, device, precision: str = "fp32", total: int | None = None,
                     backend: str = "sdpa", compiled: bool = False) -> dict[str, Any]:
    """Loss sums over PackedBatches (packtrain.packing.batches) with the isolated attention `backend`.

    Returns {"loss_sum", "n_label_tokens", "n_real_tokens", "n_slot_tokens", "n_segments", "n_batches",
    "seconds", "budget"}. Runs under torch.inference_mode(), autocast when precision is bf16/fp16; one
    device→host sync at the end (label positions are found on the host). `compiled`: the model's layers are
    compiled (loading.Loaded.compiled): cu_seqlens is marked dynamic.
    """
    import contextlib

    import torch
    from tqdm import tqdm

    from packtrain.model.attention import model_inputs

    amp = (torch.autocast(device.type, dtype=getattr(torch, _DTYPES[precision]))
           if precision in _DTYPES else contextlib.nullcontext())
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    out: dict[str, Any] = {"n_label_tokens": 0, "n_real_tokens": 0, "n_slot_tokens": 0, "n_segments": 0, "n_batches": 0,
           "budget": 0}
    t0 = time.perf_counter()
    with torch.inference_mode(), amp:
        for b in tqdm(batches, total=total, desc="evaluate", unit="batch", file=sys.stderr, leave=False):
            index = torch.nonzero(b.labels[0, 1:] != IGNORE_INDEX).squeeze(1)   # on the host: no sync
            b, index = b.to(device), index.to(device, non_blocking=True)
            s, n = batch_loss_sum(model, model_inputs(b, backend, compiled), b.labels, index=index)
            loss_sum += s
            out["n_label_tokens"] += n
            out["n_real_tokens"] += int(b.n_real_tokens)
            out["n_slot_tokens"] += int(b.input_ids.numel())
            out["n_segments"] += len(b.seq_lens)
            out["n_batches"] += 1
            out["budget"] = int(b.budget)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    out["seconds"] = time.perf_counter() - t0
    out["loss_sum"] = float(loss_sum.item())
    return out


def _peak_memory(device) -> tuple[float | None, str]:
    """CUDA peak allocated (GiB) since the last reset, or the process' peak RSS on CPU."""
    cuda_memory_stats: Callable[..., dict] | None
    try:
        from packtrain.telemetry.memory import cuda_memory_stats
    except ImportError:   # telemetry not in this build: the same two numbers straight from torch/resource
        cuda_memory_stats = None
    if device.type == "cuda":
        if cuda_memory_stats is not None:
            return cuda_memory_stats(device).get("peak_alloc_gib"), "cuda_peak_alloc"
        import torch

        return torch.cuda.max_memory_allocated(device) / 2**30, "cuda_peak_alloc"
    if cuda_memory_stats is not None:
        return cuda_memory_stats(device).get("cpu_peak_rss_gib"), "cpu_max_rss"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "cpu_max_rss"   # KiB → GiB


def open_eval_loader(eval_split_dir: Path, rows: int | str, seed: int, loss_on: str = "all",
                     device_type: str = "cpu"):
    """The packing room's PackedLoader over one epoch of the eval packs, keeping the last partial batch; with
    `loss_on` ≠ all, labels are -100 outside the loss mask (the tokens train.loss_on trained on). Position ids of
    split-document chunks follow the packs' own chunk_positions (meta.json; restart when absent), the policy the
    pack stage used for the train packs too. `rows` auto → packtrain.config.evaluate.forward_rows for
    `device_type` and the packs' budget (the loader's `.rows` is the number used)."""
    try:
        from packtrain.packing.batches import PackedLoader
        from packtrain.packing.store import PackStore
    except ImportError as e:
        raise PacktrainError(f"packtrain.packing.batches is not available in this build: {e}") from None
    from packtrain.config.evaluate import forward_rows

    if not Path(eval_split_dir).is_dir():
        raise MissingDataError(f"eval packs {eval_split_dir} do not exist: run `packtrain pack` first "
                               f"(it writes <packs>/eval) or pass --packs DIR")
    n_rows = forward_rows(rows, device_type, PackStore.open(eval_split_dir).budget) if rows == "auto" else int(rows)
    return PackedLoader(eval_split_dir, rows=n_rows, seed=seed, drop_last=False, epochs=1, loss_on=loss_on)


def evaluate(model_dir: str | Path, eval_split_dir: str | Path, cfg: EvalConfig, device: str | None = None,
             loss_on: str | None = None, loaded: Loaded | None = None) -> EvalStats:
    """Held-out loss/perplexity of the model in `model_dir` over one epoch of `eval_split_dir`'s packs,
    eval tokens/s and peak memory, plus greedy samples from `cfg.prompts`.

    `device` overrides `cfg.device` ('auto' | 'cpu' | 'cuda'). `loss_on` (all | assistant | completion): the
    tokens scored; None → the train.loss_on recorded in `model_dir` (an adapter directory loads as base +
    adapter merged). `loaded`: the model already loaded by `loading.load_for_eval` (the evaluate stage loads it
    once for this and the suites); it is left with its isolated backend after the samples.
    On CUDA one forward of the first batch runs before the timed epoch (kernel selection, allocator warm-up,
    the layers' compile under evaluate.compile): `warmup_s`; `load_s` is the model's load.
    """
    import torch

    from packtrain.config.evaluate import eval_precision
    from packtrain.evaluate.loading import load_for_eval, model_loss_on, resolve_device
    from packtrain.evaluate.samples import generate_samples
    from packtrain.model.attention import HF_NAMES, resolve_attention
    from packtrain.model.families import pick_attention

    dev = resolve_device(device or cfg.device)
    precision = eval_precision(cfg.precision, dev.type)
    # an explicit backend must run on this device: refused before any file is read
    resolve_attention(cfg.attention, dev, precision, training=False, key="evaluate.attention")
    eval_split_dir = Path(eval_split_dir)
    loss_on = loss_on or model_loss_on(model_dir)
    loader = open_eval_loader(eval_split_dir, cfg.rows, cfg.seed, loss_on, dev.type)
    n_epoch = len(loader)
    if n_epoch == 0:
        raise MissingDataError(f"eval packs {eval_split_dir} hold no documents (is tokenize.eval_fraction 0?)")
    n = n_epoch if cfg.max_batches is None else min(n_epoch, cfg.max_batches)
    t_load = time.perf_counter()
    if loaded is None:   # evaluate.attention for the model's family: auto → a backend it allows (Gemma2: eager)
        loaded = load_for_eval(Path(model_dir), cfg, dev)
    model, tokenizer, backend = loaded.model, loaded.tokenizer, loaded.backend
    load_s = time.perf_counter() - t_load
    warmup_s = 0.0
    if dev.type == "cuda":
        t_warm = time.perf_counter()
        warm = open_eval_loader(eval_split_dir, loader.rows, cfg.seed, loss_on, dev.type)   # (iterating `loader`
        evaluate_batches(model, itertools.islice(iter(warm), 1), dev, precision, total=1, backend=backend,
                         compiled=loaded.compiled)   # (resumes); with evaluate.compile also the layers' compile
        warmup_s = time.perf_counter() - t_warm
        torch.cuda.reset_peak_memory_stats(dev)
    sums = evaluate_batches(model, itertools.islice(iter(loader), n), dev, precision, total=n, backend=backend,
                            compiled=loaded.compiled)
    peak, kind = _peak_memory(dev)
    if sums["n_label_tokens"] == 0:
        raise MissingDataError(f"eval packs {eval_split_dir}: no label tokens in {sums['n_batches']} batches")
    loss = sums["loss_sum"] / sums["n_label_tokens"]
    t_samples = time.perf_counter()
    if backend not in ("sdpa", "eager"):   # flex/varlen need packed-batch kwargs; generation is plain causal:
        # sdpa, or eager for a family refused on sdpa (Gemma2) — the family's first of AUTO_ORDER["cpu"]
        model.set_attn_implementation(pick_attention("auto", "cpu", "fp32", model.config, training=False))
    try:
        with loaded.eager():   # a shape per generated token: no graph for each
            samples = generate_samples(model, tokenizer, cfg.prompts, cfg.sample_tokens, dev)
    finally:
        if backend not in ("sdpa", "eager"):
            model.set_attn_implementation(HF_NAMES[backend])
    samples_s = time.perf_counter() - t_samples
    return EvalStats(
        eval_loss=loss, perplexity=math.exp(min(loss, 700.0)),
        n_label_tokens=sums["n_label_tokens"], n_real_tokens=sums["n_real_tokens"],
        n_slot_tokens=sums["n_slot_tokens"], n_segments=sums["n_segments"], n_batches=sums["n_batches"],
        n_batches_epoch=n_epoch, complete=sums["n_batches"] == n_epoch, seconds=sums["seconds"],
        tokens_per_s=sums["n_real_tokens"] / max(sums["seconds"], 1e-9), peak_memory_gib=peak,
        memory_kind=kind, device=str(dev), precision=precision, attention=backend, rows=loader.rows,
        budget=sums["budget"], compiled=loaded.compiled, samples=samples, model_dir=str(model_dir), eval_split_dir=str(eval_split_dir),
        timings={"load_s": round(load_s, 3), "warmup_s": round(warmup_s, 3), "samples_s": round(samples_s, 3)},
    )
