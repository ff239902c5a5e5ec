"""`pack_dataset`: token store (tokenize stage) → pack store per split (`dst/train`, `dst/eval`) + stats.

    dst/
      train/            pack store (packtrain.packing.store): tokens.bin, pack_offsets.npy, seg_offsets.npy,
      eval/                                                     segments.npy, meta.json
      pack_result.json   PackStats.to_dict()

Train and eval documents are packed separately (no eval token ever shares a pack with training). The whole
`dst` is built in a staging directory and published as one unit (packtrain.publish.staged_output): a crash or
a bad input leaves the previous output (or nothing) behind, never half of one. `write_packs` writes into a
directory the caller publishes (the pack stage adds its lineage first). Same token store + same PackConfig →
byte-identical output.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from packtrain.config.packing import PackConfig
from packtrain.data.token_store import SPLIT_EVAL, SPLIT_TRAIN, TokenStore
from packtrain.errors import InputDataError
from packtrain.packing.bins import PackPlan, l2_bound_packs, lower_bound_packs, pack_lengths
from packtrain.packing.pack_stats import PackStats, SplitPackStats
from packtrain.packing.store import write_pack_store
from packtrain.publish import staged_output, write_json

CHUNK_TOKENS = 1 << 22   # tokens gathered per write (32 MB of int64 indices)
STATS_FILE = "pack_result.json"
OUTPUTS = ("train", "eval", STATS_FILE)


def pack_dataset(src: Path, dst: Path, cfg: PackConfig) -> PackStats:
    """Pack the token store at `src` into `dst` (see module doc), published as one unit. Raises
    InputDataError/MissingDataError naming the file and value for: a missing or corrupt store, no documents,
    no training documents, zero-length documents, token ids ≥ vocab_size; ConfigError when `dst` holds
    files that are not pack output."""
    with staged_output(dst, OUTPUTS, "pack") as tmp:
        return write_packs(src, tmp, cfg)


def write_packs(src: Path, out: Path, cfg: PackConfig) -> PackStats:
    """Pack the token store at `src` into the new or empty directory `out` (train/, eval/, pack_result.json),
    in place: the caller publishes `out` (pack_dataset, the pack stage). Same errors as pack_dataset."""
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    ts = TokenStore.open(src)
    _check_store(ts, cfg.budget)
    out.mkdir(parents=True, exist_ok=True)
    stats = {}
    for name, code in (("train", SPLIT_TRAIN), ("eval", SPLIT_EVAL)):
        stats[name] = _pack_split(ts, code, name, out / name, cfg)
    if stats["train"].n_packs == 0:
        raise InputDataError(f"token store {src}: no training documents with ≥ {cfg.min_doc_tokens} "
                             f"tokens (split.npy marks {len(ts.select(SPLIT_TRAIN))} as train)")
    result = PackStats(cfg.budget, cfg.strategy, cfg.overlong, cfg.seed, stats["train"], stats["eval"],
                       round(time.perf_counter() - t0, 3))
    write_json(out / STATS_FILE, result.to_dict())
    return result


def _check_prompts(ts: TokenStore, budget: int) -> None:
    """A masked document whose first learned token lies at position ≥ budget would be split so that its answer
    lands in a pack without its prompt (tokenize refuses such records by name; this guards stores made
    otherwise). Names the doc_ids."""
    lengths = ts.lengths()
    long = np.flatnonzero(lengths > budget)
    bad = [int(ts.doc_ids[i]) for i in long
           if not ts.doc_mask(int(i))[:budget].any() and ts.doc_mask(int(i)).any()]
    if bad:
        raise InputDataError(
            f"token store {ts.root}: {len(bad)} record(s) whose prompt (tokens before the first learned one) does "
            f"not fit pack.budget {budget}: doc_ids {bad[:10]}{' ...' if len(bad) > 10 else ''}; raise "
            "pack.budget or shorten those prompts (tokenize names their source rows)")


def _check_records(ts: TokenStore, budget: int) -> None:
    """A record (a document with masked tokens: a prompt, template markup) longer than the budget would be cut
    into chunks whose continuations have no prompt: tokenize fits records to pack.budget
    (tokenize.long_records), so such a document means the store was made for another budget. Names doc_ids."""
    lengths = ts.lengths()
    bad = [int(ts.doc_ids[i]) for i in np.flatnonzero(lengths > budget) if not ts.doc_mask(int(i)).all()]
    if bad:
        made = ts.meta.get("record_budget")
        raise InputDataError(
            f"token store {ts.root}: {len(bad)} chat / prompt-completion record(s) longer than pack.budget {budget}: "
            f"doc_ids {bad[:10]}{' ...' if len(bad) > 10 else ''}; split here, their continuation chunks would be "
            f"trained without their prompt. The store was tokenized for "
            + (f"pack.budget {made}" if made else "no pack budget (or before tokenize.long_records existed)")
            + f": re-run `packtrain tokenize` with pack.budget={budget} (tokenize.long_records decides what "
            "happens to records longer than it)")


def _check_store(ts: TokenStore, budget: int | None = None) -> None:
    if ts.n_docs == 0:
        raise InputDataError(f"token store {ts.root} holds no documents (offsets.npy is empty)")
    lengths = ts.lengths()
    zero = np.flatnonzero(lengths == 0)
    if len(zero):
        raise InputDataError(
            f"token store {ts.root}: {len(zero)} zero-length documents (doc_ids {ts.doc_ids[zero[:5]].tolist()}"
            f"{' ...' if len(zero) > 5 else ''}); every document needs ≥ 1 token — re-run `packtrain tokenize`")
    vocab = ts.vocab_size
    if budget is not None and ts.loss_mask is not None:
        _check_prompts(ts, budget)
        _check_records(ts, budget)
    for a in range(0, len(ts.tokens), 1 << 24):
        block = ts.tokens[a: a + (1 << 24)]
        if block.max() >= vocab:
            pos = a + int(np.argmax(block >= vocab))
            doc = int(np.searchsorted(ts.offsets, pos, side="right")) - 1
            raise InputDataError(
                f"token store {ts.root / 'tokens.bin'}: token id {int(ts.tokens[pos])} at position {pos} "
                f"(doc_id {int(ts.doc_ids[doc])}) is ≥ vocab_size {vocab} from meta.json; allowed 0..{vocab - 1}")


def _pack_split(ts: TokenStore, code: int, name: str, out: Path, cfg: PackConfig) -> SplitPackStats:
    t0 = time.perf_counter()
    idx = ts.select(code)
    lengths = ts.lengths()[idx]
    keep = lengths >= cfg.min_doc_tokens
    idx, lengths = idx[keep], lengths[keep]
    plan = pack_lengths(lengths, cfg.budget, cfg.strategy, cfg.window, cfg.overlong)
    t_plan = time.perf_counter() - t0
    # Shuffle the order of packs (not their content) with the seed, so e.g. the full chunks of split
    # documents do not all come first. Per split: rng([seed, split code]).
    perm = np.random.default_rng([cfg.seed, code]).permutation(plan.n_packs)
    n_seg = np.diff(plan.pack_offsets)[perm]
    seg_order = _ranges(plan.pack_offsets[:-1][perm], n_seg)
    g = idx[plan.seg_doc[seg_order]]                         # token store document index per segment
    seg_len = plan.seg_len[seg_order]
    src_start = ts.offsets[g] + plan.seg_start[seg_order]   # first token of each segment in tokens.bin
    segments = np.stack([ts.doc_ids[g], plan.seg_start[seg_order], seg_len], axis=1)
    seg_offsets = np.concatenate([[0], np.cumsum(n_seg)])
    tok_cum = np.concatenate([[0], np.cumsum(seg_len)])
    pack_offsets = tok_cum[seg_offsets]
    meta = {"split": name, "budget": cfg.budget, "strategy": cfg.strategy, "overlong": cfg.overlong,
            "chunk_positions": cfg.chunk_positions, "seed": cfg.seed, "vocab_size": ts.vocab_size, "pad_id": ts.meta.get("pad_id"),
            "eos_id": ts.meta.get("eos_id")}
    # The mask is gathered with the very same (start, length) segments as the tokens: aligned by construction,
    # whatever the strategy, the overlong split or the pack shuffle.
    learned = [0]
    masks = None if ts.loss_mask is None else _counted(
        _gather(ts.loss_mask, src_start, seg_len, f"pack {name} mask"), learned)
    write_pack_store(out, _gather(ts.tokens, src_start, seg_len, f"pack {name}"), pack_offsets, seg_offsets,
                     segments, meta, mask_chunks=masks)
    stats = _split_stats(plan, lengths, int((~keep).sum()), len(keep), t_plan, time.perf_counter() - t0)
    stats.loss_tokens = learned[0] if masks is not None else None
    return stats


def _counted(chunks: Iterator[np.ndarray], total: list[int]) -> Iterator[np.ndarray]:
    """`chunks` unchanged, adding their sum (the learned tokens of mask chunks) to total[0]."""
    for c in chunks:
        total[0] += int(c.sum(dtype=np.int64))
        yield c


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n): int64 [Σ n], vectorized."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    first = np.concatenate([[0], np.cumsum(lens)[:-1]])
    return np.repeat(starts - first, lens) + np.arange(total, dtype=np.int64)


def _gather(tokens: np.ndarray, starts: np.ndarray, lens: np.ndarray, desc: str) -> Iterator[np.ndarray]:
    """Yield the tokens of segments (starts, lens) in order, ~CHUNK_TOKENS at a time, with a progress bar."""
    from tqdm import tqdm

    cum = np.concatenate([[0], np.cumsum(lens)])
    with tqdm(total=int(cum[-1]), desc=desc, unit="tok", unit_scale=True, file=sys.stderr,
              disable=None, mininterval=1.0) as bar:
        a = 0
        while a < len(lens):
            b = max(a + 1, int(np.searchsorted(cum, cum[a] + CHUNK_TOKENS, side="right")) - 1)
            yield tokens[_ranges(starts[a:b], lens[a:b])]
            bar.update(int(cum[b] - cum[a]))
            a = b


def _split_stats(plan: PackPlan, lengths: np.ndarray, dropped: int, n_docs: int, t_plan: float,
                 seconds: float) -> SplitPackStats:
    n, B = plan.n_packs, plan.budget
    per_pack = plan.docs_per_pack()
    packed = lengths if plan.overlong == "split" else np.minimum(lengths, B)
    l2, lb = l2_bound_packs(packed, B), lower_bound_packs(packed, B)
    return SplitPackStats(
        n_docs=n_docs, dropped_short_docs=dropped, n_tokens=plan.n_tokens, n_packs=n,
        lower_bound_packs=lb, l2_bound_packs=l2,
        fill=round(plan.fill, 6), fill_vs_bound=round(l2 / n, 6) if n else 0.0,
        padding_tokens=n * B - plan.n_tokens, padding_fraction=round(1 - plan.fill, 6) if n else 0.0,
        docs_per_pack_mean=round(float(per_pack.mean()), 3) if n else 0.0,
        docs_per_pack_max=int(per_pack.max()) if n else 0,
        truncated_tokens=plan.truncated_tokens, split_docs=plan.split_docs, split_tokens=plan.split_tokens,
        seconds_plan=round(t_plan, 3), seconds=round(seconds, 3))
