"""Collator, loader sharding with simulated ranks, exact resume, and the pack store's validation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packtrain.config import PackConfig
from packtrain.errors import ConfigError, InputDataError, MissingDataError
from packtrain.packing.batches import PackedLoader, build_batch, token_mean_loss
from packtrain.packing.dataset import pack_dataset
from packtrain.packing.store import PackStore, write_pack_store
from packtrain.testing.synthetic_lengths import write_random_token_store


def test_build_batch_matches_the_docstring_picture():
    a, b = [11, 12, 13], [21, 22, 23, 24]
    batch = build_batch([np.array(a + b)], [np.array([3, 4])], budget=8, pad_id=0)
    assert batch.input_ids.tolist() == [[11, 12, 13, 21, 22, 23, 24, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0]]
    assert batch.labels.tolist() == [[-100, 12, 13, -100, 22, 23, 24, -100]]
    assert batch.segment_ids.tolist() == [[0, 0, 0, 1, 1, 1, 1, 2]]
    assert batch.cu_seqlens.tolist() == [0, 3, 7, 8]
    assert (batch.max_seqlen, batch.seq_lens, batch.n_real_tokens, batch.n_label_tokens) == (4, [3, 4], 7, 5)
    assert batch.input_ids.dtype == torch.int64 and batch.position_ids.dtype == torch.int64
    assert batch.cu_seqlens.dtype == torch.int32 and batch.segment_ids.dtype == torch.int32
    moved = batch.to("cpu", non_blocking=False)
    assert torch.equal(moved.labels, batch.labels) and moved.seq_lens == batch.seq_lens and moved.rows == 1


def test_build_batch_rows_full_row_and_empty_row():
    batch = build_batch([np.array([1, 2, 3, 4]), np.array([], np.uint32), np.array([5, 6])],
                        [np.array([4]), np.array([], np.int64), np.array([1, 1])], budget=4, pad_id=9)
    assert batch.input_ids.shape == (1, 12)
    rows = batch.as_rows()
    assert rows["input_ids"].tolist() == [[1, 2, 3, 4], [9, 9, 9, 9], [5, 6, 9, 9]]
    assert rows["position_ids"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 0, 0, 1]]
    assert rows["labels"].tolist() == [[-100, 2, 3, 4], [-100] * 4, [-100, -100, -100, -100]]
    # a full row has no padding segment; every row boundary (4, 8) is a segment boundary
    assert batch.cu_seqlens.tolist() == [0, 4, 8, 9, 10, 12]
    assert (batch.seq_lens, batch.n_real_tokens, batch.n_label_tokens, batch.rows) == ([4, 1, 1], 6, 3, 3)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(1, 6), max_size=4), min_size=1, max_size=4))
def test_collator_invariants(rows_seg_lens):
    budget = 12
    rows_seg_lens = [[s for s in r][: budget] for r in rows_seg_lens]
    rows_seg_lens = [r if sum(r) <= budget else r[:1] for r in rows_seg_lens]
    toks = [np.arange(1, sum(r) + 1, dtype=np.uint32) for r in rows_seg_lens]
    b = build_batch(toks, [np.array(r, np.int64) for r in rows_seg_lens], budget, pad_id=0)
    T = len(rows_seg_lens) * budget
    cu = b.cu_seqlens.tolist()
    assert cu[0] == 0 and cu[-1] == T and b.input_ids.shape == (1, T)
    assert all(r * budget in cu for r in range(len(rows_seg_lens) + 1))
    pos = b.position_ids[0].tolist()
    for s, e in zip(cu[:-1], cu[1:], strict=True):
        assert pos[s:e] == list(range(e - s))
        assert b.labels[0, s] == -100
        assert len(set(b.segment_ids[0, s:e].tolist())) == 1
    assert b.n_label_tokens == int((b.labels != -100).sum())
    assert b.n_real_tokens == sum(map(sum, rows_seg_lens)) == sum(b.seq_lens)
    assert b.max_seqlen == max(e - s for s, e in zip(cu[:-1], cu[1:], strict=True))


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """A real pack store: 300 random documents, budget 64 → train/ and eval/."""
    root = tmp_path_factory.mktemp("packs")
    lengths = np.random.default_rng(3).integers(1, 90, 300)
    write_random_token_store(root / "tok", lengths, vocab_size=500, eval_fraction=0.2)
    pack_dataset(root / "tok", root / "pack", PackConfig(budget=64))
    return root / "pack"


def _pack_ids_seen(loader: PackedLoader, epoch: int) -> list[int]:
    return [int(p) for s in range(len(loader)) for p in loader.rank_packs(epoch, s)]


@pytest.mark.parametrize("world_size,rows,drop_last", [(1, 3, True), (2, 3, True), (3, 2, False), (4, 5, False),
                                                       (2, 1, True)])
def test_sharding_whole_packs_none_duplicated_or_dropped(packs, world_size, rows, drop_last):
    split = packs / "train"
    loaders = [PackedLoader(split, rows, seed=5, rank=r, world_size=world_size, drop_last=drop_last, epochs=1)
               for r in range(world_size)]
    n = loaders[0].store.n_packs
    assert len({len(ld) for ld in loaders}) == 1          # every rank runs the same number of steps
    for epoch in (0, 1):
        seen = [p for ld in loaders for p in _pack_ids_seen(ld, epoch)]
        real = [p for p in seen if p >= 0]
        assert len(real) == len(set(real))               # no pack twice in an epoch, across all ranks
        if drop_last:
            assert len(real) == n // (rows * world_size) * rows * world_size
            assert len(seen) == len(real)
        else:
            assert sorted(real) == list(range(n))        # every pack exactly once
    # the batches carry exactly those packs' tokens, in one fixed shape
    store = PackStore.open(split)
    for ld in loaders:
        for step, batch in enumerate(ld):
            assert batch.input_ids.shape == (1, rows * store.budget)
            rows_ids = batch.as_rows()["input_ids"]
            for r, p in enumerate(ld.rank_packs(0, step)):
                want = store.pack_tokens(int(p)) if p >= 0 else np.zeros(0)
                assert rows_ids[r, : len(want)].tolist() == want.tolist()


def test_shuffle_is_deterministic_per_epoch(packs):
    a = PackedLoader(packs / "train", 2, seed=1)
    b = PackedLoader(packs / "train", 2, seed=1)
    c = PackedLoader(packs / "train", 2, seed=2)
    assert np.array_equal(a.epoch_order(0), b.epoch_order(0))
    assert not np.array_equal(a.epoch_order(0), a.epoch_order(1))
    assert not np.array_equal(a.epoch_order(0), c.epoch_order(0))


def _take(it, k):
    return [next(it) for _ in range(k)]


@pytest.mark.parametrize("stop", [0, 3, 7, 12])
def test_exact_resume_across_epochs(packs, stop):
    ref = PackedLoader(packs / "train", rows=2, seed=7, world_size=2, rank=1)
    steps = len(ref)
    want = _take(iter(ref), stop + steps + 2)              # runs into the next epoch
    first = PackedLoader(packs / "train", rows=2, seed=7, world_size=2, rank=1)
    it = iter(first)
    _take(it, stop)
    state = json.loads(json.dumps(first.state_dict()))   # survives a JSON checkpoint
    resumed = PackedLoader(packs / "train", rows=2, seed=7, world_size=2, rank=1)
    resumed.load_state_dict(state)
    got = _take(iter(resumed), steps + 2)
    for w, g in zip(want[stop:], got, strict=True):
        assert torch.equal(w.input_ids, g.input_ids) and torch.equal(w.labels, g.labels)


def test_resume_state_mismatch_is_an_error(packs):
    a = PackedLoader(packs / "train", rows=2, seed=7)
    b = PackedLoader(packs / "train", rows=3, seed=7)
    with pytest.raises(ConfigError, match="rows=2 was saved"):
        b.load_state_dict(a.state_dict())


def test_epochs_limit_and_eval_keeps_every_pack(packs):
    ld = PackedLoader(packs / "eval", rows=4, drop_last=False, epochs=1, shuffle=False)
    batches = list(ld)
    assert len(batches) == len(ld) == -(-ld.store.n_packs // 4)
    assert sum(b.n_real_tokens for b in batches) == int(ld.store.pack_lengths().sum())


def test_loader_argument_errors(packs):
    with pytest.raises(ConfigError, match="rank=2"):
        PackedLoader(packs / "train", rows=1, rank=2, world_size=2)
    with pytest.raises(InputDataError, match="drop_last"):
        PackedLoader(packs / "eval", rows=10_000)
    with pytest.raises(MissingDataError, match="packtrain pack"):
        PackedLoader(packs / "nope", rows=1)


def test_token_mean_loss():
    s = torch.tensor(12.0, requires_grad=True)
    assert token_mean_loss(s, 4).item() == 3.0
    zero = token_mean_loss(s, 0)
    zero.backward()
    assert zero.item() == 0.0 and s.grad.item() == 0.0


# -- the pack store's validation -------------------------------------------------------------------------------
def _small_store(path):
    return write_pack_store(path, [np.arange(1, 14, dtype=np.uint32)], np.array([0, 7, 13]), np.array([0, 2, 3]),
                            np.array([[7, 0, 5], [9, 0, 2], [4, 0, 6]]), {"budget": 8, "vocab_size": 20})


def test_store_roundtrip(tmp_path):
    store = PackStore.open(_small_store(tmp_path / "s"), verify=True)
    assert store.n_packs == 2 and store.pack_tokens(1).tolist() == [8, 9, 10, 11, 12, 13]
    assert store.pack_segments(0).tolist() == [[7, 0, 5], [9, 0, 2]]
    assert not (tmp_path / ".s.tmp").exists()


@pytest.mark.parametrize("name,corrupt,match", [
    ("segments.npy", lambda p: p.write_bytes(p.read_bytes()[:-8] + b"\x07" * 8), "segments.npy is corrupt"),
    ("pack_offsets.npy", lambda p: p.write_bytes(b"garbage"), "pack_offsets.npy is corrupt"),
    ("tokens.bin", lambda p: p.write_bytes(p.read_bytes()[:-4]), "tokens.bin is corrupt"),
    ("tokens.bin", lambda p: p.write_bytes(b"\xff" + p.read_bytes()[1:]), "tokens.bin is corrupt: crc32"),
    ("meta.json", lambda p: p.write_text("{not json"), "meta.json is corrupt"),
    ("meta.json", lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "budget": 4})),
     "> budget 4"),
])
def test_corrupt_store_is_named(tmp_path, name, corrupt, match):
    root = _small_store(tmp_path / "s")
    corrupt(root / name)
    with pytest.raises(InputDataError, match=match) as e:
        PackStore.open(root, verify=True)
    assert str(root) in str(e.value)


def test_missing_file_is_named(tmp_path):
    root = _small_store(tmp_path / "s")
    (root / "seg_offsets.npy").unlink()
    with pytest.raises(MissingDataError, match="missing seg_offsets.npy"):
        PackStore.open(root)
