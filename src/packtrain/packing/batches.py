"""Packed micro-batches of one fixed shape, sharded over ranks, resumable; the window-invariant loss.

A micro-batch is `rows` packs, each padded at its tail to `budget`, flattened to (1, T), T = rows * budget.
The shape never changes (no recompiles, no allocator churn). One pack, budget 8, documents a (3 tokens) and
b (4 tokens), one padding slot::

    slot           0     1     2     3     4     5     6     7
    input_ids      a0    a1    a2    b0    b1    b2    b3    pad
    position_ids   0     1     2     0     1     2     3     0      restart per document and per padding tail
    labels        -100   a1    a2   -100   b1    b2    b3   -100    unshifted (HF); -100 at each document's
                                                                    first token and on padding
    segment_ids    0     0     0     1     1     1     1     2      unique per segment within the batch
    cu_seqlens    [0, 3, 7, 8]   max_seqlen 4   seq_lens [3, 4]   n_real_tokens 7   n_label_tokens 5

    block-diagonal causal mask (row = query, column = key, 1 = may attend)
            a0 a1 a2 b0 b1 b2 b3 pd
        a0 [ 1  .  .  .  .  .  .  . ]
        a1 [ 1  1  .  .  .  .  .  . ]
        a2 [ 1  1  1  .  .  .  .  . ]
        b0 [ .  .  .  1  .  .  .  . ]
        b1 [ .  .  .  1  1  .  .  . ]
        b2 [ .  .  .  1  1  1  .  . ]
        b3 [ .  .  .  1  1  1  1  . ]
        pd [ .  .  .  .  .  .  .  1 ]

Loss mask (chat / prompt-completion records, `loss_on="assistant"` or `"completion"`): a label is also -100
where the pack store's loss_mask is 0 (system/user turns, prompts, template markup), so only learned tokens
count — in `labels` and in `n_label_tokens`, for every row of the batch. Document a = prompt p0 p1 + answer
r0 r1 (mask 0 0 1 1), b = plain text (mask 1 1 1), budget 8::

    slot           0     1     2     3     4     5     6     7
    input_ids      p0    p1    r0    r1    b0    b1    b2    pad
    loss_mask      0     0     1     1     1     1     1     -
    labels        -100  -100   r0    r1   -100   b1    b2   -100   n_label_tokens 4 (loss_on="all": 5)

transformers (SDPA/eager/flex) builds exactly this mask from `position_ids` when `attention_mask is None`
and `use_cache=False`; varlen attention takes `cu_seqlens`/`max_seqlen`; FlexAttention takes `segment_ids`.

Chunks of a document longer than the budget (pack.overlong=split) are segments of their own, isolated like any
document; their first token's label is -100 (its context is in another pack). Their position ids follow the
store's `chunk_positions` (meta.json; docs/long-context.md): `restart` (default) counts from 0 like a document,
`continue` from the chunk's offset in its document. Document d (20 tokens) at budget 8 → chunks at 0, 8, 16::

    pack               0 (d[0:8])            1 (d[8:16])            2 (d[16:20] + e, 3 tokens)
    restart positions  0 1 2 3 4 5 6 7       0 1 2 3 4 5 6 7        0 1 2 3  0 1 2  0
    continue positions 0 1 2 3 4 5 6 7       8 9 10 11 12 13 14 15  16 17 18 19  0 1 2  0

transformers' packed-row detection (sdpa/eager) splits rows where consecutive position ids do not step by 1, so
`continue` stays isolated: a chunk starts at a multiple of the budget and no segment before it in a pack ends one
position earlier (`build_batch` checks every boundary and refuses a batch where one would).

Loss: the model's logits at position i predict labels[i+1]. Sum the token losses of every micro-batch of an
accumulation window and divide by the window's label-token count (`token_mean_loss`): the result does not
depend on how documents were packed, padded or split into micro-batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from packtrain.errors import ConfigError, InputDataError
from packtrain.packing.store import PackStore

if TYPE_CHECKING:
    import torch

IGNORE = -100


@dataclass
class PackedBatch:
    input_ids: torch.Tensor     # int64 (1, T), T = rows * budget
    position_ids: torch.Tensor  # int64 (1, T), restart at 0 per document and per padding segment (chunks of a
                                #   split document: their start offset under chunk_positions=continue)
    labels: torch.Tensor        # int64 (1, T), input_ids with -100 at document starts and on padding
    cu_seqlens: torch.Tensor    # int32 (n_segments + 1,), over the flattened T; row ends are segment ends
    max_seqlen: int
    segment_ids: torch.Tensor   # int32 (1, T), segment index unique within the batch
    seq_lens: list[int]         # lengths of the real (non-padding) segments
    n_real_tokens: int
    n_label_tokens: int
    rows: int
    budget: int

    def as_rows(self) -> dict:
        """input_ids/position_ids/labels as (rows, budget) views (same storage)."""
        return {k: getattr(self, k).view(self.rows, self.budget)
                for k in ("input_ids", "position_ids", "labels")}

    def to(self, device, non_blocking: bool = True) -> PackedBatch:
        kw = {}
        for f in fields(self):
            v = getattr(self, f.name)
            kw[f.name] = v.to(device, non_blocking=non_blocking) if hasattr(v, "to") else v
        return PackedBatch(**kw)

    def pin_memory(self) -> PackedBatch:
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        for k in ("input_ids", "position_ids", "labels", "cu_seqlens", "segment_ids"):
            kw[k] = kw[k].pin_memory()
        return PackedBatch(**kw)


CHUNK_POSITIONS = ("restart", "continue")
"""Position ids of split-document chunks (pack.chunk_positions): from 0, or from the chunk's offset."""

LOSS_ON = ("all", "assistant", "completion")
"""What the loss covers: every token (the mask ignored), or the learned tokens of the loss mask — "assistant"
and "completion" read the same mask (assistant turns of chat records, the completion of prompt/completion
records; plain-text documents are all learned)."""


def build_batch(rows_tokens: Sequence[np.ndarray], rows_seg_lens: Sequence[np.ndarray], budget: int,
                pad_id: int = 0, rows_masks: Sequence[np.ndarray | None] | None = None,
                rows_seg_starts: Sequence[np.ndarray] | None = None) -> PackedBatch:
    """Collate packs into one PackedBatch. Row i holds `rows_tokens[i]` (≤ budget tokens) made of segments
    `rows_seg_lens[i]` (summing to its length); an empty row is all padding. `rows_masks[i]` (uint8, same
    length as row i, or None = all learned): labels are also -100 where it is 0. `rows_seg_starts[i]` (one
    per segment, or None = all 0): the first position id of each segment (chunk_positions=continue).

    >>> b = build_batch([np.array([5, 6, 7, 8, 9])], [np.array([3, 2])], budget=6, rows_seg_starts=[np.array([8, 0])])
    >>> b.position_ids.tolist(), b.labels.tolist()
    ([[8, 9, 10, 0, 1, 0]], [[-100, 6, 7, -100, 9, -100]])

    >>> b = build_batch([np.array([5, 6, 7, 8, 9])], [np.array([5])], budget=6, rows_masks=[np.array([0, 0, 1, 1, 0])])
    >>> b.labels.tolist(), b.n_label_tokens
    ([[-100, -100, 7, 8, -100, -100]], 2)

    >>> b = build_batch([np.array([5, 6, 7, 8, 9])], [np.array([2, 3])], budget=6, pad_id=0)
    >>> b.input_ids.tolist(), b.position_ids.tolist(), b.labels.tolist(), b.cu_seqlens.tolist()
    ([[5, 6, 7, 8, 9, 0]], [[0, 1, 0, 1, 2, 0]], [[-100, 6, -100, 8, 9, -100]], [0, 2, 5, 6])
    """
    import torch

    n_rows = len(rows_tokens)
    T = n_rows * budget
    ids = np.full(T, pad_id, dtype=np.int64)
    learned = np.ones(T, dtype=bool)
    seg_lens, is_pad, seg_starts = [], [], []
    for r, (tok, sl) in enumerate(zip(rows_tokens, rows_seg_lens, strict=True)):
        n = len(tok)
        if n > budget:
            raise ValueError(f"row {r} holds {n} tokens > budget {budget}")
        ids[r * budget: r * budget + n] = tok
        m = rows_masks[r] if rows_masks is not None else None
        if m is not None:
            if len(m) != n:
                raise ValueError(f"row {r}: loss mask of {len(m)} values for {n} tokens")
            learned[r * budget: r * budget + n] = np.asarray(m) != 0
        sl = np.asarray(sl, dtype=np.int64)
        if int(sl.sum()) != n:
            raise ValueError(f"row {r}: segment lengths sum to {int(sl.sum())}, row holds {n} tokens")
        seg_lens.append(sl)
        is_pad.append(np.zeros(len(sl), bool))
        st = rows_seg_starts[r] if rows_seg_starts is not None else None
        if st is not None and len(st) != len(sl):
            raise ValueError(f"row {r}: {len(st)} segment starts for {len(sl)} segments")
        seg_starts.append(np.zeros(len(sl), np.int64) if st is None else np.asarray(st, np.int64))
        if n < budget:
            seg_lens.append(np.array([budget - n], np.int64))
            is_pad.append(np.ones(1, bool))
            seg_starts.append(np.zeros(1, np.int64))
    lens = np.concatenate(seg_lens)                      # (n_segments,)
    pad_seg = np.concatenate(is_pad)
    cu = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=cu[1:])
    seg_ids = np.repeat(np.arange(len(lens), dtype=np.int32), lens)   # (T,)
    pos = np.arange(T, dtype=np.int64) - cu[:-1][seg_ids]
    if rows_seg_starts is not None:
        starts = np.concatenate(seg_starts)
        pos += starts[seg_ids]
        _check_boundaries(pos, cu, budget)
    labels = ids.copy()
    labels[cu[:-1]] = IGNORE
    labels[pad_seg[seg_ids]] = IGNORE
    labels[~learned] = IGNORE
    real = lens[~pad_seg]
    return PackedBatch(
        input_ids=torch.from_numpy(ids).view(1, T),
        position_ids=torch.from_numpy(pos).view(1, T),
        labels=torch.from_numpy(labels).view(1, T),
        cu_seqlens=torch.from_numpy(cu.astype(np.int32)),
        max_seqlen=int(lens.max()),
        segment_ids=torch.from_numpy(seg_ids).view(1, T),
        seq_lens=[int(x) for x in real],
        n_real_tokens=int(real.sum()),
        n_label_tokens=int((labels != IGNORE).sum()),
        rows=n_rows,
        budget=budget,
    )


def _check_boundaries(pos: np.ndarray, cu: np.ndarray, budget: int) -> None:
    """Refuse position ids that hide a segment boundary inside a row: transformers' sdpa/eager packing detection
    starts a new document only where position ids do not step by +1 (never the case for packtrain's chunks)."""
    b = cu[1:-1]
    inner = b[b % budget != 0]   # boundaries that are not row starts
    bad = inner[pos[inner] == pos[inner - 1] + 1]
    if len(bad):
        raise ValueError(f"segment starting at flat index {int(bad[0])} has position {int(pos[bad[0]])}, one more "
                         "than the token before it in another segment: sdpa/eager would merge the two documents "
                         "(chunk starts must be multiples of the budget, as the pack stage writes them)")


class PackedLoader:
    """Iterable of PackedBatch of shape (1, rows * budget), forever (or `epochs` epochs), from one split.

    Sharding: epoch e shuffles pack ids with `np.random.default_rng([seed, e])` (same on every rank), then
    global step s gives rank r the packs order[(s*W + r)*rows : (s*W + r + 1)*rows], W = world_size. Every
    rank gets whole packs, all micro-batches have the same shape, and within an epoch no pack goes to two
    ranks or two steps.

    drop_last=True: `len = n_packs // (rows*W)` steps; the `n_packs % (rows*W)` packs left over are skipped
    this epoch (a different random set each epoch, since the order is reshuffled). drop_last=False:
    `len = ceil(n_packs / (rows*W))`; the last step is topped up with all-padding rows (n_label_tokens 0)
    so every pack is used exactly once and every rank still runs the same number of steps.

    `state_dict()` after receiving batch k resumes at batch k+1: `load_state_dict` on a fresh loader yields
    exactly the batches the old one would have yielded next. Iterating again continues where it stopped.
    `pin_memory=True` pins batches in page-locked memory when CUDA is available (a no-op on CPU).
    `loss_on` (LOSS_ON): "all" ignores the store's loss mask; "assistant"/"completion" set labels to -100 where
    it is 0 (a store without a mask: every token is learned, as for plain text).
    `chunk_positions` (restart | continue | None = the store's meta.json, restart for stores written before the
    key existed): position ids of split-document chunks (module doc).
    """

    def __init__(self, split_dir, rows: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 pin_memory: bool = False, drop_last: bool = True, epochs: int | None = None,
                 shuffle: bool = True, loss_on: str = "all", chunk_positions: str | None = None):
        if loss_on not in LOSS_ON:
            raise ConfigError(f"PackedLoader loss_on={loss_on!r}: allowed {', '.join(LOSS_ON)}")
        self.loss_on = loss_on
        if rows < 1:
            raise ConfigError(f"PackedLoader rows={rows}: must be ≥ 1")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"PackedLoader rank={rank}, world_size={world_size}: need 0 ≤ rank < world_size")
        if epochs is not None and epochs < 1:
            raise ConfigError(f"PackedLoader epochs={epochs}: must be ≥ 1 or None (forever)")
        self.store = PackStore.open(Path(split_dir))
        self.rows, self.seed, self.rank, self.world_size = rows, seed, rank, world_size
        self.pin_memory, self.drop_last, self.epochs, self.shuffle = pin_memory, drop_last, epochs, shuffle
        self.budget = self.store.budget
        n, per_step = self.store.n_packs, rows * world_size
        if n == 0:
            raise InputDataError(f"pack store {self.store.root} holds no packs")
        if drop_last and n < per_step:
            raise InputDataError(
                f"pack store {self.store.root} holds {n} packs < rows*world_size = {per_step}: with "
                "drop_last=True no step is possible; use fewer rows or drop_last=False")
        self._epoch, self._step = 0, 0
        self._order: tuple[int, np.ndarray] | None = None
        self._seg_lens = self.store.segments[:, 2]
        self.chunk_positions = chunk_positions or self.store.chunk_positions
        if self.chunk_positions not in CHUNK_POSITIONS:
            raise ConfigError(f"PackedLoader chunk_positions={self.chunk_positions!r}: allowed "
                              f"{', '.join(CHUNK_POSITIONS)}")
        self._seg_starts = self.store.segments[:, 1] if self.chunk_positions == "continue" else None
        if self._seg_starts is not None:
            odd = np.flatnonzero(self._seg_starts % self.budget)
            if len(odd):   # checked once here, not mid-training in build_batch
                i = int(odd[0])
                raise InputDataError(
                    f"{self.store.root / 'segments.npy'}: segment {i} starts at token {int(self._seg_starts[i])} "
                    f"of its document, not a multiple of the budget {self.budget}: with chunk_positions=continue "
                    "its position ids could merge it with its neighbour under sdpa/eager (the pack stage writes "
                    "chunk starts at multiples of the budget; re-run `packtrain pack`)")

    def __len__(self) -> int:
        n, per_step = self.store.n_packs, self.rows * self.world_size
        return n // per_step if self.drop_last else -(-n // per_step)

    @property
    def epoch(self) -> int:
        return self._epoch

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Pack ids of one epoch for all ranks, int64 [len * rows * world_size], -1 = all-padding row."""
        if self._order is not None and self._order[0] == epoch:
            return self._order[1]
        n = self.store.n_packs
        order = (np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle
                 else np.arange(n, dtype=np.int64))
        want = len(self) * self.rows * self.world_size
        order = order[:want] if want <= n else np.concatenate([order, np.full(want - n, -1, np.int64)])
        self._order = (epoch, order)
        return order

    def rank_packs(self, epoch: int, step: int) -> np.ndarray:
        """The pack ids (rows,) this rank gets at `step` of `epoch`."""
        base = (step * self.world_size + self.rank) * self.rows
        return self.epoch_order(epoch)[base: base + self.rows]

    def collate(self, pack_ids: np.ndarray) -> PackedBatch:
        st = self.store
        toks: list[np.ndarray] = []
        segs: list[np.ndarray] = []
        starts: list[np.ndarray] = []
        masks: list[np.ndarray | None] = []
        use_mask = self.loss_on != "all" and st.loss_mask is not None
        for p in pack_ids:
            if p < 0:
                toks.append(np.zeros(0, np.uint32))
                segs.append(np.zeros(0, np.int64))
                starts.append(np.zeros(0, np.int64))
                masks.append(None)
            else:
                toks.append(st.pack_tokens(int(p)))
                segs.append(self._seg_lens[st.seg_offsets[p]: st.seg_offsets[p + 1]])
                if self._seg_starts is not None:
                    starts.append(self._seg_starts[st.seg_offsets[p]: st.seg_offsets[p + 1]])
                masks.append(st.pack_mask(int(p)) if use_mask else None)
        batch = build_batch(toks, segs, self.budget, st.pad_id, masks if use_mask else None,
                            starts if self._seg_starts is not None else None)
        if self.pin_memory:
            import torch

            if torch.cuda.is_available():
                batch = batch.pin_memory()
        return batch

    def __iter__(self) -> Iterator[PackedBatch]:
        steps = len(self)
        while self.epochs is None or self._epoch < self.epochs:
            while self._step < steps:
                ids = self.rank_packs(self._epoch, self._step)
                self._step += 1
                yield self.collate(ids)
            self._epoch, self._step = self._epoch + 1, 0

    def state_dict(self) -> dict:
        return {"version": 1, "epoch": self._epoch, "step": self._step, "seed": self.seed, "rows": self.rows,
                "world_size": self.world_size, "rank": self.rank, "n_packs": self.store.n_packs,
                "drop_last": self.drop_last, "shuffle": self.shuffle}

    def load_state_dict(self, d: dict) -> None:
        """Resume exactly; the data and sharding must match the saved state (rank may differ)."""
        for key in ("seed", "rows", "world_size", "n_packs", "drop_last", "shuffle"):
            mine = self.state_dict()[key]
            if key in d and d[key] != mine:
                raise ConfigError(f"loader state: {key}={d[key]!r} was saved, this loader has {mine!r}; "
                                  "exact resume needs the same packs, rows, world size and seed")
        self._epoch, self._step = int(d["epoch"]), int(d["step"])


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropies. logits (B, T, V), labels (B, T) unshifted with -100 → scalar.

    Position i's logits score labels[i+1]; -100 targets (document starts, padding) are skipped, so the
    number of terms is `(labels[:, 1:] != -100).sum()` = the batch's `n_label_tokens`.
    """
    import torch.nn.functional as F

    logits = logits[:, :-1, :].float()
    target = labels[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


def token_mean_loss(loss_sum: torch.Tensor, n_label_tokens_in_window: float) -> torch.Tensor:
    """Loss of one micro-batch scaled for a gradient-accumulation window: loss_sum / window label tokens.

    Call once per micro-batch with `n_label_tokens_in_window` = Σ n_label_tokens over all micro-batches of
    the optimizer step (summed over all ranks when gradients are summed; when the engine averages them over
    W ranks, as DDP/DeepSpeed do, pass global_count / W). The sum of these terms over the window is the
    token-mean loss, identical for packed, padded or differently accumulated layouts of the same documents.
    A window without label tokens gives 0 (with a graph, so backward still works).
    """
    if n_label_tokens_in_window <= 0:
        return loss_sum * 0.0
    return loss_sum / float(n_label_tokens_in_window)
