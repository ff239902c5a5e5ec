"""Warm start through the real CLI stages: the init model's tokenizer travels into tokenize (its BOS/EOS rules,
its hash in the store), train measures the step-0 held-out loss with the evaluate stage's code and refuses a
store the model cannot read; every bad source exits non-zero with the inputs untouched.

Corpus: 40 documents of the tiny family tokenizers' words (t4 … t96), so Llama's tokenizer (prepends BOS) and
Qwen3's (adds nothing) both encode them without training anything.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtrain.cli import main
from packtrain.data.token_store import TokenStore
from packtrain.data.tokenizer_files import tokenizer_hash
from packtrain.testing.tiny_families import BOS, EOS, build_tiny_family_dir

V = 97
COMMON = ["tokenize.eval_fraction=0.25", "tokenize.workers=1", "pack.budget=32", "train.rows=2",
          "train.max_steps=2", "train.warmup_steps=1", "train.threads=1", "evaluate.rows=2",
          "evaluate.max_batches=null", "evaluate.sample_tokens=2", "telemetry.interval_s=5",
          "tracking.system_metrics=false"]


def _sets(*sets: str) -> list[str]:
    return [x for s in sets for x in ("--set", s)]


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """docs/documents.parquet, a Llama and a Qwen3 tiny checkpoint, and the Llama-tokenized store + packs."""
    root = tmp_path_factory.mktemp("warm")
    rng = random.Random(0)
    texts = [" ".join(f"t{rng.randrange(4, V)}" for _ in range(rng.randrange(5, 40))) for _ in range(40)]
    (root / "docs").mkdir()
    pq.write_table(pa.table({"doc_id": pa.array(range(40), pa.int64()), "text": texts}),
                   root / "docs" / "documents.parquet")
    llama = build_tiny_family_dir(root / "llama", "llama", vocab_size=V, seed=3)
    qwen3 = build_tiny_family_dir(root / "qwen3", "qwen3", vocab_size=V, seed=4)
    wd = root / "wd"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("PACKTRAIN_PARENT_RUN_ID", raising=False)
        assert main(["tokenize", "--docs", str(root / "docs"), "--out", str(root / "tok"),
                     *_sets(f"workdir={wd}", "tracking.enabled=false", *COMMON, f"model.init_from={llama}")]) == 0
        assert main(["pack", "--tokens", str(root / "tok"), "--out", str(root / "pack"),
                     *_sets(f"workdir={wd}", "tracking.enabled=false", *COMMON)]) == 0
    return {"root": root, "texts": texts, "llama": llama, "qwen3": qwen3, "wd": wd}


def test_tokenize_uses_the_init_models_tokenizer_and_its_bos_rule(world, tmp_path):
    from transformers import AutoTokenizer

    root, texts = world["root"], world["texts"]
    store = TokenStore.open(root / "tok")
    tok = AutoTokenizer.from_pretrained(str(world["llama"]))
    for i in range(store.n_docs):   # BOS by the Llama tokenizer's own rule, EOS appended
        assert store.doc(i).tolist() == tok(texts[i])["input_ids"] + [EOS] and store.doc(i)[0] == BOS
    meta, stats = store.meta, json.loads((root / "tok" / "tokenize_result.json").read_text())
    h = tokenizer_hash(world["llama"])
    assert meta["tokenizer_hash"] == stats["tokenizer_hash"] == tokenizer_hash(root / "tok" / "tokenizer") == h
    assert (meta["tokenizer"], meta["tokenizer_from"]) == (str(world["llama"].resolve()), str(world["llama"]))
    assert (meta["special_prefix"], meta["special_suffix"], meta["bos_id"]) == ([BOS], [], BOS)
    assert meta["max_token_id"] == int(store.tokens.max()) < V
    # a family that adds no BOS: documents are the text's ids + EOS
    out = tmp_path / "qtok"
    assert main(["tokenize", "--docs", str(root / "docs"), "--out", str(out),
                 *_sets(f"workdir={tmp_path}", "tracking.enabled=false", *COMMON,
                        f"model.init_from={world['qwen3']}")]) == 0
    q = TokenStore.open(out)
    assert q.doc(0).tolist() == [int(w[1:]) for w in texts[0].split()] + [EOS]
    assert q.meta["special_prefix"] == [] and q.meta["tokenizer_hash"] == tokenizer_hash(world["qwen3"])


def test_tokenize_refuses_a_tokenizer_dir_that_is_not_the_models(world, tmp_path, capsys):
    root = world["root"]
    before = (_digest(root / "docs"), _digest(world["llama"]), _digest(world["qwen3"]))
    out = tmp_path / "tok"
    assert main(["tokenize", "--docs", str(root / "docs"), "--out", str(out),
                 *_sets(f"workdir={tmp_path}", "tracking.enabled=false", *COMMON, f"model.init_from={world['llama']}",
                        f"tokenize.tokenizer_dir={world['qwen3']}")]) == 2
    err = capsys.readouterr().err
    assert f"tokenize.tokenizer_dir {world['qwen3']} (tokenizer {tokenizer_hash(world['qwen3'])}) is not the " \
           f"tokenizer of model.init_from '{world['llama']}'" in err and "Traceback" not in err
    assert not out.exists() and (_digest(root / "docs"), _digest(world["llama"]), _digest(world["qwen3"])) == before
    # the same tokenizer given both ways is fine
    assert main(["tokenize", "--docs", str(root / "docs"), "--out", str(out),
                 *_sets(f"workdir={tmp_path}", "tracking.enabled=false", *COMMON, f"model.init_from={world['llama']}",
                        f"tokenize.tokenizer_dir={world['llama']}")]) == 0
    assert (out / "tokens.bin").read_bytes() == (root / "tok" / "tokens.bin").read_bytes()


def test_train_step0_loss_is_the_evaluate_stages_loss_of_the_init_model(world, tmp_path, seed_mlflow_store):
    """Warm start from a directory: the train stage's step-0 held-out loss is what `packtrain evaluate` reports
    for the same weights on the same eval packs (same code, same batches)."""
    import mlflow

    root = world["root"]
    seed_mlflow_store(tmp_path / "mlflow.db")   # the workdir's store, empty (its creation: not the subject)
    sets = _sets(f"workdir={tmp_path}", *COMMON, f"model.init_from={world['llama']}")
    assert main(["evaluate", "--model", str(world["llama"]), "--packs", str(root / "pack"), "--out",
                 str(tmp_path / "ev"), *sets]) == 0
    expected = json.loads((tmp_path / "ev" / "evaluate_result.json").read_text())
    assert main(["train", "--packs", str(root / "pack"), "--tokens", str(root / "tok"), "--out",
                 str(tmp_path / "train"), *sets]) == 0
    result = json.loads((tmp_path / "train" / "train_result.json").read_text())
    assert result["init_eval_loss"] == pytest.approx(expected["eval_loss"], abs=1e-6)
    ev = result["init"]["eval"]
    assert (ev["n_label_tokens"], ev["n_batches"], ev["complete"]) == (expected["n_label_tokens"],
                                                                      expected["n_batches"], True)
    assert result["init"]["kind"] == "dir" and result["init"]["tokenizer_check"]["model_tokenizer_hash"] == \
        result["init"]["tokenizer_check"]["store_tokenizer_hash"] == tokenizer_hash(world["llama"])
    assert json.loads((tmp_path / "train" / "init_eval.json").read_text())["eval_loss"] == result["init_eval_loss"]
    # the trained model ships the init model's tokenizer: the next warm start from it needs no re-tokenizing
    assert tokenizer_hash(tmp_path / "train" / "model") == tokenizer_hash(world["llama"])
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = [r for r in client.search_runs([client.get_experiment_by_name("packtrain").experiment_id])
              if r.info.run_name == "train"]
    assert run.data.metrics["init_eval_loss"] == pytest.approx(expected["eval_loss"], abs=1e-6)
    assert run.data.tags["packtrain.init_from"] == run.data.tags["packtrain.init_resolved"] == str(world["llama"])


def test_train_refuses_what_the_model_cannot_read_and_touches_nothing(world, tmp_path, capsys):
    root = world["root"]
    small = build_tiny_family_dir(tmp_path / "small", "llama", vocab_size=50)
    for f in ("tokenizer.json", "tokenizer_config.json"):   # a bare checkpoint: only its vocabulary is checked
        (small / f).unlink()
    alien = tmp_path / "alien"
    alien.mkdir()
    (alien / "config.json").write_text(json.dumps({"model_type": "not_a_model", "hidden_size": 8}))
    top = TokenStore.open(root / "tok").max_token_id
    inputs = [root / "tok", root / "pack", world["qwen3"], small, alien]
    before = [_digest(p) for p in inputs]
    cases = [  # init_from, exit code, words
        (world["qwen3"], 2, [f"token store {root / 'tok'} was made by tokenizer {tokenizer_hash(world['llama'])[:23]}… "
                             f"({world['llama']}), but model.init_from '{world['qwen3']}' ships tokenizer "
                             f"{tokenizer_hash(world['qwen3'])[:23]}…", "Re-run `packtrain tokenize` with the same "
                             "model.init_from"]),
        (small, 2, [f"model.init_from '{small}': vocab_size 50 < the tokenizer's {V}: token store {root / 'tok'} "
                    f"holds token id {top} (needs ≥ {top + 1})"]),
        (alien, 2, [f"model.init_from {alien}: config.json cannot be read by transformers"]),
        (tmp_path / "missing", 5, ["no such directory"]),
        ("models:/nope/1", 5, ["model.init_from 'models:/nope/1': no registered model 'nope' in sqlite:///"]),
        ("models:/nope@champion", 5, ["no registered model 'nope'"]),
    ]
    for i, (init, code, words) in enumerate(cases):
        out = tmp_path / f"train{i}"
        got = main(["train", "--packs", str(root / "pack"), "--tokens", str(root / "tok"), "--out", str(out),
                    *_sets(f"workdir={tmp_path / 'wd'}", "tracking.enabled=false", *COMMON, f"model.init_from={init}")])
        err = capsys.readouterr().err
        assert got == code and all(w in err for w in words) and "Traceback" not in err, (init, got, err)
        assert not out.exists()
    assert [_digest(p) for p in inputs] == before
    assert not (tmp_path / "wd" / "models").exists()
    # the explicit opt-out compares the vocabulary only: a Qwen3 checkpoint of the same size then trains
    assert main(["train", "--packs", str(root / "pack"), "--tokens", str(root / "tok"), "--out", str(tmp_path / "ok"),
                 *_sets(f"workdir={tmp_path / 'wd'}", "tracking.enabled=false", *COMMON,
                        f"model.init_from={world['qwen3']}", "model.tokenizer_check=vocab")]) == 0
    check = json.loads((tmp_path / "ok" / "train_result.json").read_text())["init"]["tokenizer_check"]
    assert check["mode"] == "vocab" and check["model_vocab_size"] == V
