"""`packtrain train --set train.precision=fp8` on a machine without FP8 tensor cores (this CPU): exit 2 with a message
naming what FP8 needs and the alternative, before any output — the --out directory and the inputs are left exactly as they were."""

from __future__ import annotations

import hashlib
from pathlib import Path

from packtrain.cli import main


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(p.relative_to(root).as_posix().encode() + (p.read_bytes() if p.is_file() else b"/"))
    return h.hexdigest()


def test_fp8_train_on_cpu_exits_2_and_leaves_out_untouched(tmp_path, capsys):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    tokens, packs = make_synthetic_inputs(tmp_path / "data", n_docs=24, vocab_size=64, budget=32, seed=0)
    out = tmp_path / "out"
    (out / "model").mkdir(parents=True)
    (out / "model" / "config.json").write_text('{"someone": "else\'s model"}')   # an earlier run's output
    before = _tree_digest(out), _tree_digest(tmp_path / "data")
    sets = ["train.precision=fp8", "train.fp8.recipe=rowwise", "train.device=auto", "model.hidden_size=32",
            "model.intermediate_size=64", "model.num_heads=2", f"workdir={tmp_path / 'work'}",
            "tracking.enabled=false"]
    rc = main(["train", "--packs", str(packs), "--tokens", str(tokens), "--out", str(out),
               *[x for s in sets for x in ("--set", s)]])
    err = capsys.readouterr().err
    assert rc == 2
    assert "train.precision=fp8" in err and "compute capability ≥ 8.9" in err and "train.precision=bf16" in err
    assert (_tree_digest(out), _tree_digest(tmp_path / "data")) == before   # nothing written, nothing removed
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == [".packtrain.lock"]   # only the CLI's lock
