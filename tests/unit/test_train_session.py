"""`TrainSession` and its parts declare every attribute (slots): the loop cannot grow undeclared state, and a
failed or finished session leaves torch's thread count as it found it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from packtrain.config import ModelConfig, PackConfig, TelemetryConfig, TrainConfig
from packtrain.train.loop import StepDone
from packtrain.train.parts import DataParts, ModelParts, Telemetry
from packtrain.train.resume import Checkpointing
from packtrain.train.session import TrainSession

TINY = ModelConfig(hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("session_data")
    make_synthetic_inputs(root, n_docs=40, vocab_size=64, budget=64, seed=3)
    return root


def _session(data, out, **train):
    cfg = TrainConfig(device="cpu", max_steps=2, warmup_steps=0, threads=1, **train)
    return TrainSession(TINY, cfg, PackConfig(budget=64), TelemetryConfig(interval_s=5), data / "pack",
                        data / "tokenize", out)


@pytest.mark.parametrize("cls", [TrainSession, DataParts, ModelParts, Telemetry, Checkpointing, StepDone])
def test_every_class_the_loop_touches_declares_its_attributes(cls):
    assert "__slots__" in vars(cls) and "__dict__" not in {n for c in cls.__mro__ for n in vars(c).get("__slots__", ())}


def test_a_built_session_rejects_undeclared_attributes_and_closes_cleanly(data, tmp_path):
    before = torch.get_num_threads()
    s = _session(data, tmp_path / "train")
    try:
        assert torch.get_num_threads() == 1
        parts = [s, s.data, s.parts, s.telemetry, s.checkpoints]
        assert not any(hasattr(p, "__dict__") for p in parts)
        for p in parts:
            with pytest.raises(AttributeError):
                p.last_step_end = 0.0   # what the old loop set on the session without declaring it
        declared = {f.name for f in dataclasses.fields(TrainSession)}
        assert {"data", "parts", "telemetry", "checkpoints"} <= declared
        assert s.model is s.parts.model and s.data.shape.rows == 4 and s.checkpoints.start_step == 0
    finally:
        s.close()
    s.close()   # idempotent
    assert torch.get_num_threads() == before


def test_a_failed_setup_restores_the_thread_count(data, tmp_path):
    from packtrain.errors import PacktrainError

    before = torch.get_num_threads()
    with pytest.raises((PacktrainError, OSError)):
        TrainSession(TINY, TrainConfig(device="cpu", threads=1), PackConfig(budget=64), TelemetryConfig(),
                     tmp_path / "no-packs", data / "tokenize", tmp_path / "train")
    assert torch.get_num_threads() == before


def test_the_loop_runs_on_declared_attributes_only(data, tmp_path):
    """Two steps with a checkpoint each: every attribute the loop, record, save and resume set is a slot (an
    undeclared one raises AttributeError), and the resumed run finishes with the same history."""
    from packtrain.train.loop import train

    cfg = TrainConfig(device="cpu", max_steps=2, warmup_steps=0, threads=1, checkpoint={"every_steps": 1})
    args = (TINY, cfg, PackConfig(budget=64), TelemetryConfig(interval_s=5), data / "pack", data / "tokenize")
    first = train(*args, tmp_path / "a")
    assert first.steps == 2 and first.checkpoint and first.checkpoint.endswith("step_000002")
    again = train(*args, tmp_path / "a", resume=True)
    assert again.start_step == 2 and again.loss_curve == first.loss_curve
