"""`packtrain pack` end to end on small real token stores, and its bad inputs through the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packtrain.cli import main
from packtrain.data.token_store import TokenStore, write_token_store
from packtrain.packing.batches import PackedLoader
from packtrain.packing.store import PackStore
from packtrain.testing.synthetic_lengths import write_random_token_store

NO_TRACKING = ["--set", "tracking.enabled=false"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path_factory, monkeypatch):
    """Run from a temporary directory (not tmp_path, whose contents tests check): a `packtrain pack` without --set workdir takes its lock under the recipe's relative
    workdir (data/.packtrain.lock), which must not land in the checkout."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def store(tmp_path):
    lengths = np.clip(np.round(np.random.default_rng(1).lognormal(np.log(40), 1.0, 400)), 1, 400).astype(int)
    write_random_token_store(tmp_path / "tok", lengths, vocab_size=300, eval_fraction=0.1, seed=1)
    return tmp_path / "tok"


def _without_seconds(d):
    if isinstance(d, dict):
        return {k: _without_seconds(v) for k, v in d.items() if not k.startswith("seconds") and k != "output"}
    return d


def _pack(tok, out, *extra) -> int:
    return main(["pack", "--tokens", str(tok), "--out", str(out), "--set", "pack.budget=128", *NO_TRACKING, *extra])


def test_pack_cli_every_token_once_and_deterministic(store, tmp_path, capsys):
    before = _digest(store)
    assert _pack(store, tmp_path / "a") == 0
    assert "packs, fill" in capsys.readouterr().out
    stats = json.loads((tmp_path / "a" / "pack_result.json").read_text())
    ts = TokenStore.open(store)
    for name, code in (("train", 0), ("eval", 1)):
        ps = PackStore.open(tmp_path / "a" / name, verify=True)
        s = stats[name]
        assert s["n_packs"] == ps.n_packs and s["n_tokens"] == len(ps.tokens)
        assert s["l2_bound_packs"] <= s["n_packs"] and s["fill_vs_bound"] >= 0.99
        assert s["padding_tokens"] == ps.n_packs * 128 - len(ps.tokens)
        assert s["docs_per_pack_max"] == int(np.diff(ps.seg_offsets).max())
        # rebuild every document from its segments: every token exactly once, in order
        pos = np.concatenate([[0], np.cumsum(ps.segments[:, 2])])
        got: dict[int, list] = {}
        for i, (doc_id, start, n) in enumerate(ps.segments.tolist()):
            got.setdefault(doc_id, []).append((start, ps.tokens[pos[i]: pos[i] + n]))
        ids = ts.doc_ids[ts.select(code)]
        assert sorted(got) == sorted(ids.tolist())
        for j in ts.select(code):
            parts = sorted(got[int(ts.doc_ids[j])], key=lambda x: x[0])
            assert np.array_equal(np.concatenate([p for _, p in parts]), ts.doc(j))
    assert stats["train"]["split_docs"] > 0 and stats["fill"] == stats["train"]["fill"]
    # same input + config → byte-identical packs and identical stats but for timings; input untouched
    assert _pack(store, tmp_path / "b") == 0
    a_files, b_files = _digest(tmp_path / "a"), _digest(tmp_path / "b")
    assert {k: v for k, v in a_files.items() if k != "pack_result.json"} == \
        {k: v for k, v in b_files.items() if k != "pack_result.json"}
    b_stats = json.loads((tmp_path / "b" / "pack_result.json").read_text())
    assert _without_seconds(stats) == _without_seconds(b_stats)
    assert _digest(store) == before
    # a different seed shuffles the packs' order, not their content
    assert _pack(store, tmp_path / "c", "--set", "pack.seed=1") == 0
    a, c = PackStore.open(tmp_path / "a" / "train"), PackStore.open(tmp_path / "c" / "train")
    assert not np.array_equal(a.pack_offsets, c.pack_offsets) or not np.array_equal(a.segments, c.segments)
    assert sorted(map(tuple, a.segments.tolist())) == sorted(map(tuple, c.segments.tolist()))


def test_pack_stage_logs_to_mlflow(store, tmp_path):
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlflow.db"
    code = main(["pack", "--tokens", str(store), "--out", str(tmp_path / "p"), "--set", "pack.budget=128",
                 "--set", f"workdir={tmp_path}", "--set", f"tracking.tracking_uri=sqlite:///{db}",
                 "--set", "tracking.system_metrics=false"])
    assert code == 0
    client = MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    run = next(r for r in runs if r.info.run_name == "pack")
    stats = json.loads((tmp_path / "p" / "pack_result.json").read_text())
    assert run.data.metrics["train.fill"] == pytest.approx(stats["train"]["fill"])
    assert run.data.params["pack.budget"] == "128"


def test_packs_feed_the_loader(store, tmp_path):
    assert _pack(store, tmp_path / "p") == 0
    loader = PackedLoader(tmp_path / "p" / "train", rows=2, epochs=1)
    batches = list(loader)
    assert len(batches) == len(loader) > 0
    assert {tuple(b.input_ids.shape) for b in batches} == {(1, 256)}


def _run_cli(*args, cwd=None):
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    exe = Path(sys.executable).with_name("packtrain")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def _bad_store(root: Path, kind: str) -> Path:
    meta = {"vocab_size": 50, "eos_id": 1, "pad_id": 0}
    if kind == "empty":
        return write_token_store(root, [], np.zeros(0, np.int64), np.zeros(0, np.uint8), meta).root
    if kind == "zero-length":
        docs = [np.array([5, 6]), np.array([], np.int64), np.array([7])]
        return write_token_store(root, docs, np.array([10, 11, 12]), np.zeros(3, np.uint8), meta).root
    if kind == "vocab":
        docs = [np.array([5, 6]), np.array([7, 50, 8])]
        return write_token_store(root, docs, np.array([10, 11]), np.zeros(2, np.uint8), meta).root
    if kind == "eval-only":
        return write_token_store(root, [np.array([5, 6])], np.array([10]), np.ones(1, np.uint8), meta).root
    raise ValueError(kind)


@pytest.mark.parametrize("kind,code,message", [
    ("empty", 3, "holds no documents"),
    ("zero-length", 3, "1 zero-length documents (doc_ids [11])"),
    ("vocab", 3, "token id 50 at position 3 (doc_id 11) is ≥ vocab_size 50"),
    ("eval-only", 3, "no training documents"),
])
def test_bad_token_stores_fail_cleanly(tmp_path, kind, code, message):
    tok = _bad_store(tmp_path / "tok", kind)
    before = _digest(tok)
    out = tmp_path / "out"
    (out / "train").mkdir(parents=True)   # stands for an earlier pack output: it stays byte-identical
    (out / "pack_result.json").write_text("an earlier output stays intact")
    (out / "train" / "tokens.bin").write_bytes(b"\x01\x02")
    previous = _digest(out)
    r = _run_cli("pack", "--tokens", str(tok), "--out", str(out), *NO_TRACKING)
    assert r.returncode == code, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert _digest(tok) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tok"]      # no temp dir left behind
    assert _digest(out) == previous and sorted(p.name for p in out.iterdir()) == ["pack_result.json", "train"]


def test_bad_budget_and_missing_store(tmp_path, store, capsys):
    assert main(["pack", "--tokens", str(store), "--out", str(tmp_path / "o"), "--set", "pack.budget=1",
                 *NO_TRACKING]) == 2
    assert "pack.budget" in capsys.readouterr().err
    assert main(["pack", "--tokens", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), *NO_TRACKING]) == 5
    assert "run `packtrain tokenize` first" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_verify_names_a_corrupted_pack_file(store, tmp_path, capsys):
    assert _pack(store, tmp_path / "p") == 0
    assert main(["pack", "--verify", str(tmp_path / "p"), *NO_TRACKING]) == 0
    assert "ok" in capsys.readouterr().out
    seg = tmp_path / "p" / "eval" / "segments.npy"
    seg.write_bytes(seg.read_bytes()[:-3] + b"\x01\x02\x03")
    r = _run_cli("pack", "--verify", str(tmp_path / "p"), *NO_TRACKING)
    assert r.returncode == 3
    assert f"pack store {seg} is corrupt" in r.stderr
