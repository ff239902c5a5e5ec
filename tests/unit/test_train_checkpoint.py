"""Checkpoints: atomic write, manifest checksums, keep-last-K, corrupt/partial ones skipped, exact state."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from packtrain.config import ModelConfig, TrainConfig
from packtrain.model.build import build_model
from packtrain.train import checkpoint as ck
from packtrain.train import checkpoint_manifest as cm
from packtrain.train.techniques import build_optimizer

MODEL = ModelConfig(hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2)


def _model_and_opt():
    torch.manual_seed(0)
    model = build_model(MODEL, 50)
    opt = build_optimizer(model, TrainConfig(), "cpu")
    model(input_ids=torch.arange(10)[None], use_cache=False).logits.sum().backward()
    opt.step()
    return model, opt


def _save(root, step, model, opt, keep=2, extra=None):
    return ck.save_checkpoint(root, step, {"history": [], **(extra or {})}, ck.torch_payload_writer(model, opt), keep)


def test_save_verify_and_round_trip(tmp_path):
    model, opt = _model_and_opt()
    path = _save(tmp_path, 3, model, opt, extra={"loader": {"epoch": 0, "step": 7}})
    assert path.name == "step_000003" and cm.verify_checkpoint(path) is None
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.safetensors", "optimizer.pt", "rng.pt", "state.json"}
    assert not list(tmp_path.glob(".tmp-*"))

    fresh = build_model(MODEL, 50)
    fresh_opt = build_optimizer(fresh, TrainConfig(), "cpu")
    ck.load_torch_payload(path, fresh, fresh_opt, "cpu")
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight   # still tied after loading
    sa, sb = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert all(torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) for i in sa)
    assert ck.read_state(path)["loader"] == {"epoch": 0, "step": 7}


def test_rng_states_restore_exactly(tmp_path):
    model, opt = _model_and_opt()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    path = _save(tmp_path, 1, model, opt)
    expect = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    ck.read_state(path)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expect[0] and got[1] == expect[1] and torch.equal(got[2], expect[2])


def test_keep_last_k_and_leftovers_are_pruned(tmp_path):
    model, opt = _model_and_opt()
    (tmp_path / ".tmp-step_000099").mkdir(parents=True)   # a crash mid-write leaves this
    for step in (2, 4, 6, 8):
        _save(tmp_path, step, model, opt, keep=2)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [8, 6]
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize("damage, reason", [
    (lambda p: (p / "manifest.json").unlink(), "manifest.json is missing"),
    (lambda p: (p / "manifest.json").write_text("{"), "not valid JSON"),
    (lambda p: (p / "optimizer.pt").unlink(), "optimizer.pt is missing"),
    (lambda p: (p / "model.safetensors").write_bytes(b"xx"), "model.safetensors has 2 bytes"),
    (lambda p: _flip_byte(p / "model.safetensors"), "model.safetensors fails its sha256"),
    (lambda p: _flip_byte(p / "state.json"), "state.json fails its sha256"),
])
def test_corrupt_newest_checkpoint_is_skipped_with_a_warning(tmp_path, damage, reason):
    model, opt = _model_and_opt()
    _save(tmp_path, 5, model, opt)
    newest = _save(tmp_path, 10, model, opt)
    damage(newest)
    assert reason in cm.verify_checkpoint(newest)
    with pytest.warns(RuntimeWarning, match=f"step 10.*{reason}"):
        assert ck.find_latest_checkpoint(tmp_path).name == "step_000005"


def test_no_checkpoint_at_all(tmp_path):
    assert ck.find_latest_checkpoint(tmp_path / "missing") is None
    (tmp_path / "step_000001").mkdir()
    with pytest.warns(RuntimeWarning, match="partial"):
        assert ck.find_latest_checkpoint(tmp_path) is None


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_sha256_tree_is_the_hash_of_the_piece_hashes(tmp_path):
    import hashlib

    data = np.random.default_rng(0).bytes(10_000)
    f = tmp_path / "blob"
    f.write_bytes(data)
    pieces = [hashlib.sha256(data[i: i + 4096]).digest() for i in range(0, len(data), 4096)]
    expect = hashlib.sha256(b"".join(pieces)).hexdigest()
    assert cm.sha256_tree_file(f, 4096) == cm.sha256_tree_file(f, 4096, workers=1) == expect
    (tmp_path / "empty").write_bytes(b"")
    assert cm.sha256_tree_file(tmp_path / "empty") == hashlib.sha256(hashlib.sha256(b"").digest()).hexdigest()


def test_version_1_manifest_still_verifies(tmp_path):
    """A checkpoint written before the checksum tree (whole-file sha256) verifies, and a flipped byte in it is
    still caught."""
    model, opt = _model_and_opt()
    path = _save(tmp_path, 4, model, opt)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["version"] == 2 and all("sha256_tree" in v for v in manifest["files"].values())
    manifest["version"] = 1
    manifest["files"] = {rel: {"bytes": v["bytes"], "sha256": cm.sha256_file(path / rel)}
                         for rel, v in manifest["files"].items()}
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert cm.verify_checkpoint(path) is None
    _flip_byte(path / "model.safetensors")
    assert "model.safetensors fails its sha256" in cm.verify_checkpoint(path)
