"""evaluate → register through the real CLI on a real sqlite MLflow registry in tmp_path.

Three tiny models with different init scales are evaluated on the same eval packs; their real losses order
them. Registered in the order middle, worst, best, each evaluated against the champion of the moment (paired,
docs/validation.md): v1 → champion (first), v2 → challenger (champion stays v1), v3 → champion (moves). `models:/<name>@champion` then loads back as v3's weights and generates.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from packtrain.cli import main
from packtrain.stages.lineage import Lineage
from packtrain.stages.results import TrainResult
from packtrain.testing.tiny_model import build_tiny_model_dir, write_tiny_packs

TEXTS = ["def area(r):\n    return 3.14159 * r * r\n", "import os\nimport sys\nprint(sys.argv)\n",
         "The quick brown fox jumps over the lazy dog. " * 3] * 8
NAME = "tiny-lm"
LINEAGE = Lineage(git_sha="abc123", code_version="0.1.0", input_md5={"packs": "p"},
                  data_version="5d41402abc4b2a76b9719d911017c592", tokenizer_hash=None)


@pytest.fixture
def setup(tmp_path, monkeypatch, seed_mlflow_store):
    monkeypatch.chdir(tmp_path)   # MLflow puts artifacts of a new experiment under ./mlruns
    seed_mlflow_store(tmp_path / "run" / "mlflow.db")   # the workdir's store, empty (its creation: not the subject)
    models = {s: build_tiny_model_dir(tmp_path / f"model-{s}", TEXTS, init_std=s) for s in (0.02, 0.3, 1.0)}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models[0.02]))
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, len(tok), size=int(n)) for n in rng.integers(8, 60, size=12)]
    packs = tmp_path / "packs"
    write_tiny_packs(packs / "eval", docs, budget=64, pad_id=tok.eos_token_id, vocab_size=len(tok))
    (packs / "pack_result.json").write_text(json.dumps({"lineage": LINEAGE.to_dict()}))   # evaluate reads the chain
    work = tmp_path / "run"
    sets = ["--set", f"workdir={work}", "--set", "evaluate.max_batches=null", "--set", "evaluate.rows=2",
            "--set", "evaluate.sample_tokens=4", "--set", f"register.model_name={NAME}",
            "--set", "tracking.system_metrics=false",
            "--set", "evaluate.suites=[]"]   # judged on the held-out documents alone (task suites: test_local_task)
    return tmp_path, models, packs, work, sets


def _json(path):
    return json.loads(path.read_text())


@pytest.mark.slow
def test_champion_challenger_and_load_back(setup, capsys):
    tmp, models, packs, work, sets = setup
    losses = {}
    for s, d in models.items():
        assert main(["evaluate", *sets, "--model", str(d), "--packs", str(packs), "--out", str(tmp / f"ev-{s}")]) == 0
        ev = _json(tmp / f"ev-{s}" / "evaluate_result.json")
        assert ev["complete"] and ev["lineage"]["data_version"].startswith("5d41")
        assert len(_json(tmp / f"ev-{s}" / "samples.json")) == 3
        losses[s] = ev["eval_loss"]
    best, mid, worst = sorted(losses, key=losses.get)
    assert losses[best] < losses[mid] * 0.99 and losses[mid] < losses[worst]

    train = tmp / "train-mid"
    train.mkdir()
    TrainResult(
        steps=2, start_step=0, tokens=10, label_tokens=9, slot_tokens=12, final_loss=3.0, loss_curve=[3.5, 3.0],
        lr_curve=[1e-3, 1e-3], skipped_steps=0, compiles=None, recompiles=None, timings={},
        throughput={"useful_mfu": 0.42, "real_tokens_per_s": 1234.0}, memory={"peak_alloc_gib": 3.5}, system={},
        violations=[], telemetry_files=[], setup={}, params={}, model_dir=None, checkpoint=None, packing_fill=0.991,
        lineage=LINEAGE).write(train)

    def register(s, train_dir, out, *extra):   # evaluated against the champion of the moment, then registered
        ev = tmp / f"evc-{out}"
        assert main(["evaluate", *sets, "--model", str(models[s]), "--packs", str(packs), "--out", str(ev)]) == 0
        assert main(["register", *sets, *extra, "--model", str(models[s]), "--eval", str(ev),
                     "--train", str(train_dir), "--out", str(tmp / out)]) == 0
        return _json(tmp / out / "register_result.json")

    r1 = register(mid, train, "reg1")
    assert (r1["version"], r1["decision"], r1["champion_version"]) == ("1", "champion", "1")
    assert r1["champion_value"] is None and r1["metric"] == "bits_per_byte:recent"
    t = r1["version_tags"]
    assert t["mfu"] == "0.42" and t["peak_memory_gib"] == "3.5" and t["packing_fill"] == "0.991"
    assert t["dataset_md5"].startswith("5d41")
    assert (t.get("git_sha"), t["missing_tags"]) != (None, "none")   # a sha, or listed as missing (no .git)
    print(f"log_model {r1['flavor']}: {r1['log_model_s']:.2f} s")

    r2 = register(worst, tmp / "no-train", "reg2")
    assert (r2["version"], r2["decision"], r2["champion_version"]) == ("2", "challenger", "1")
    assert r2["champion_value"] < r2["candidate_value"]   # bits/byte of both, on the same documents
    assert "recent (primary) not improved" in r2["reason"]
    assert set(r2["missing_tags"]) - {"git_sha"} == {"mfu", "peak_memory_gib", "packing_fill"}   # no train result

    r3 = register(best, tmp / "no-train", "reg3")
    assert (r3["version"], r3["decision"], r3["champion_version"]) == ("3", "champion", "3")
    assert r3["previous_champion_version"] == "1" and r3["champion_value"] > r3["candidate_value"]

    import mlflow
    from mlflow import MlflowClient

    uri = r3["tracking_uri"]
    assert uri == f"sqlite:///{(work / 'mlflow.db').resolve()}"
    client = MlflowClient(tracking_uri=uri)
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "3"
    assert str(client.get_model_version_by_alias(NAME, "challenger").version) == "2"
    v2 = client.get_model_version(NAME, "2")
    assert v2.tags["decision"] == "challenger" and float(v2.tags["eval_loss"]) == pytest.approx(losses[worst])
    run = client.get_run(r2["run_id"])
    assert run.data.tags["packtrain.decision"] == "challenger" and run.info.run_name == "register"
    assert run.data.metrics["candidate_value"] == pytest.approx(r2["candidate_value"])
    assert run.data.metrics["champion_value"] == pytest.approx(r2["champion_value"])
    assert "register_result.json" in {f.path for f in client.list_artifacts(r2["run_id"])}

    from packtrain.evaluate.loading import load_model_dir
    from packtrain.registry.model import load_champion

    before = mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")
    model, tok = load_champion(NAME, uri)
    assert (mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")) == before   # no global change
    ref, _ = load_model_dir(models[best], "cpu")
    for (k, a), (_, b) in zip(sorted(model.state_dict().items()), sorted(ref.state_dict().items()), strict=True):
        assert torch.equal(a.float(), b), k
    x = tok("def ", return_tensors="pt")
    out = model.generate(**x, max_new_tokens=6, do_sample=False, pad_token_id=tok.eos_token_id)
    assert out.shape[1] > x["input_ids"].shape[1] and isinstance(tok.decode(out[0]), str)

    # the same weights and lineage again: no new version, v2 is pointed at (whatever the flavor asked)
    again = register(worst, tmp / "no-train", "reg4", "--set", "register.flavor=pytorch")
    assert (again["version"], again["existing"], again["champion_version"]) == ("2", True, "3")
    assert again["reason"].startswith(f"already registered: {NAME} v2 holds these weights")
    assert len(client.search_model_versions(f"name = '{NAME}'")) == 3
    # the pytorch flavor loads back too (tokenizer shipped as extra files), registered under another name
    r4 = register(worst, tmp / "no-train", "reg5", "--set", "register.flavor=pytorch",
                  "--set", f"register.model_name={NAME}-pt")
    assert (r4["flavor"], r4["version"], r4["existing"]) == ("pytorch", "1", False)
    from packtrain.registry.model import load_registered

    m4, tok4 = load_registered(f"models:/{NAME}-pt/1", uri)
    ref4, _ = load_model_dir(models[worst], "cpu")
    assert torch.equal(m4.get_input_embeddings().weight, ref4.get_input_embeddings().weight)
    y = m4.generate(**tok4("The ", return_tensors="pt"), max_new_tokens=4, do_sample=False,
                    pad_token_id=tok4.eos_token_id)
    assert y.shape[1] > 1
    assert "champion" in capsys.readouterr().out


def _better_than(version: str):
    """A real verdict (packtrain.evaluate.promotion) of a challenger 0.01 bits/byte better on every document."""
    from packtrain.config.evaluate import PromotionConfig
    from packtrain.evaluate.promotion import decide_promotion

    nll = 500 + np.arange(20.0)
    cols = {m: {"nll": nll - d, "tokens": np.full(20, 90), "bytes": np.full(20, 400), "acc": np.full(20, np.nan)}
            for m, d in (("challenger", 3.0), ("champion", 0.0))}
    v = decide_promotion([{"suite": "recent", "role": "primary", "kind": "text", "md5": "m", **cols,
                           "same_tokenizer": True}], PromotionConfig(resamples=200), version, True)
    assert v.promote
    return v


def test_champion_alias_moves_only_by_compare_and_set(tmp_path, monkeypatch, seed_mlflow_store):
    """Another registration moves the champion between this one's decision and its alias write (done here by
    a real second MlflowClient in the `before_alias` hook): the alias stays where the other put it and the
    new version becomes challenger, with a reason naming both versions. Without interference it moves."""
    import mlflow
    from mlflow import MlflowClient
    from registry_helpers import register_model_dir as register_model

    from packtrain.config.evaluate import RegisterConfig
    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    monkeypatch.chdir(tmp_path)
    model = build_tiny_model_dir(tmp_path / "model", TEXTS)
    uri = f"sqlite:///{seed_mlflow_store(tmp_path / 'mlflow.db')}"
    before = mlflow.get_tracking_uri()
    set_fluent_tracking_uri(uri)
    try:
        cfg = RegisterConfig(model_name=NAME, pip_requirements=["torch", "transformers"])
        r1 = register_model(model, {"eval_loss": 4.0}, None, cfg)
        r2 = register_model(model, {"eval_loss": 5.0}, None, cfg)   # no paired evaluation: never moves it
        assert (r1.decision, r2.decision, r2.champion_version) == ("champion", "challenger", "1")
        assert "no paired evaluation" in r2.reason

        moved = []

        def another_registration_wins(version: str) -> None:   # after v3 was gated against v1
            MlflowClient(uri).set_registered_model_alias(NAME, "champion", "2")
            moved.append(version)

        r3 = register_model(model, {"eval_loss": 3.0}, None, cfg, before_alias=another_registration_wins,
                            verdict=_better_than("v1"))
        assert moved == ["3"]
        assert (r3.version, r3.decision, r3.previous_champion_version, r3.champion_version) == \
            ("3", "challenger", "1", "2")
        assert r3.reason.startswith("champion moved from v1 to v2 while v3 was being registered (gated against v1)")
        assert r3.version_tags["decision"] == "challenger" and r3.version_tags["previous_champion_version"] == "1"
        client = MlflowClient(uri)
        assert str(client.get_model_version_by_alias(NAME, "champion").version) == "2"
        assert str(client.get_model_version_by_alias(NAME, "challenger").version) == "3"
        v3 = client.get_model_version(NAME, "3")
        assert v3.tags["decision"] == "challenger" and v3.tags["packtrain.alias_set"] == "challenger"
        run = client.get_run(r3.run_id)
        assert run.data.tags["packtrain.decision"] == "challenger" and run.data.metrics["promoted"] == 0.0

        # nobody interferes: judged against v2, the alias moves v2 → v4
        r4 = register_model(model, {"eval_loss": 3.5}, None, cfg, before_alias=lambda v: None,
                            verdict=_better_than("v2"))
        assert (r4.version, r4.decision, r4.previous_champion_version, r4.champion_version) == \
            ("4", "champion", "2", "4")
        assert str(client.get_model_version_by_alias(NAME, "champion").version) == "4"
    finally:
        set_fluent_tracking_uri(before)
