"""The prefetch thread hands out the loader's batches in order, and its state resumes exactly where the loop
stopped consuming (not where the thread got to)."""

from __future__ import annotations

import numpy as np
import pytest

from packtrain.config import PackConfig
from packtrain.packing.batches import PackedLoader
from packtrain.packing.dataset import pack_dataset
from packtrain.testing.synthetic_lengths import write_random_token_store
from packtrain.train.prefetch import Prefetcher


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefetch")
    write_random_token_store(root / "tok", np.random.default_rng(3).integers(1, 90, 300), vocab_size=97)
    pack_dataset(root / "tok", root / "pack", PackConfig(budget=64))
    return root / "pack" / "train"


@pytest.mark.parametrize("consume", [0, 1, 5, 17])
def test_prefetch_order_and_resume_state(split_dir, consume):
    plain = PackedLoader(split_dir, rows=2, seed=1)
    expected = [b.input_ids.clone() for _, b in zip(range(consume + 3), plain, strict=False)]

    pre = Prefetcher(PackedLoader(split_dir, rows=2, seed=1), depth=3)
    got = [next(pre).input_ids for _ in range(consume)]
    for a, b in zip(got, expected[:consume], strict=True):
        assert np.array_equal(a.numpy(), b.numpy())
    state = pre.state_dict()
    pre.close()

    resumed = PackedLoader(split_dir, rows=2, seed=1)
    resumed.load_state_dict(state)
    nxt = next(iter(resumed)).input_ids
    assert np.array_equal(nxt.numpy(), expected[consume].numpy())
