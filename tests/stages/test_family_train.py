"""`packtrain train` through the real CLI, continuing tiny checkpoints of other families (model.init_from=<dir>)
on synthetic packs: the run trains the checkpoint's own architecture from its own weights, reports MFU with the
family's shape, saves a model plain transformers loads; refused and missing sources exit non-zero with the
inputs untouched."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from packtrain.cli import main
from packtrain.testing.tiny_families import build_tiny_family_dir

V = 97
SETS = ["train.rows=2", "train.max_steps=6", "train.warmup_steps=1", "train.lr=1e-2", "train.threads=1",
        "telemetry.interval_s=5", "telemetry.warmup_steps=1", "tracking.enabled=false",
        "model.tokenizer_check=vocab"]   # synthetic packs: the family fixtures' tokenizers did not make them


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("family_train_data")
    make_synthetic_inputs(root, n_docs=120, vocab_size=V, budget=64, seed=2)
    return root


def _args(data: Path, out: Path, *sets: str) -> list[str]:
    every = [*SETS, f"workdir={data / 'work'}", *sets]
    return ["train", "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out", str(out),
            *[x for s in every for x in ("--set", s)]]


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("family,attention", [("qwen2", "sdpa"), ("mistral", "eager"), ("gemma3_text", "sdpa")])
def test_family_train_continues_a_checkpoint(data, tmp_path, family, attention):
    from transformers import AutoModelForCausalLM

    src = build_tiny_family_dir(tmp_path / "src", family, V, seed=1)
    before = _digest(src)
    out = tmp_path / "train"
    assert main(_args(data, out, f"model.init_from={src}", f"train.attention={attention}")) == 0
    result = json.loads((out / "train_result.json").read_text())
    assert result["steps"] == 6 and result["setup"]["attention"] == attention
    assert all(torch.isfinite(torch.tensor(result["loss_curve"])))
    assert _digest(src) == before                                     # the source checkpoint is read only
    init = AutoModelForCausalLM.from_pretrained(str(src))
    trained = AutoModelForCausalLM.from_pretrained(str(out / "model"))
    assert type(trained).__name__ == type(init).__name__ and trained.config.model_type == family
    assert trained.config.sliding_window == init.config.sliding_window == 4
    changed = [k for k, v in trained.state_dict().items() if not torch.equal(v, init.state_dict()[k])]
    assert changed and len(changed) >= len(init.state_dict()) // 2   # trained from the checkpoint's weights
    # the checkpoint's architecture, not the recipe's sizes (tiny-cpu's scratch Llama has 362,816 parameters)
    assert result["params"]["total"] == sum(p.numel() for p in init.parameters())


def test_family_train_refusals_leave_inputs_untouched(data, tmp_path, capsys):
    gemma2 = build_tiny_family_dir(tmp_path / "gemma2", "gemma2", V)
    before = (_digest(data / "pack"), _digest(gemma2))
    assert main(_args(data, tmp_path / "a", f"model.init_from={gemma2}", "train.attention=sdpa")) == 2
    assert "family Gemma2 (gemma2) with train.attention=sdpa is refused: attention logit soft-capping (2) " \
           "cannot run on sdpa" in capsys.readouterr().err
    assert main(_args(data, tmp_path / "b", f"model.init_from={gemma2}", "train.attention=varlen")) == 2
    assert "with train.attention=varlen is refused: attention logit soft-capping" in capsys.readouterr().err
    assert main(_args(data, tmp_path / "b", "train.attention=varlen")) == 2   # any family: not on this device
    assert "train.attention: 'varlen' is not available on cpu" in capsys.readouterr().err
    assert main(_args(data, tmp_path / "c", f"model.init_from={tmp_path / 'missing'}")) == 5
    assert "no such directory" in capsys.readouterr().err
    assert main(_args(data, tmp_path / "d", "model.init_from=models:/lm")) == 2
    assert "model.init_from: 'models:/lm' is not allowed" in capsys.readouterr().err
    small = build_tiny_family_dir(tmp_path / "small", "qwen3", vocab_size=50)
    assert main(_args(data, tmp_path / "e", f"model.init_from={small}")) == 2
    assert f"vocab_size 50 < the tokenizer's {V}" in capsys.readouterr().err
    assert (_digest(data / "pack"), _digest(gemma2)) == before
    assert not any((tmp_path / x / "model").exists() for x in "abcde")
