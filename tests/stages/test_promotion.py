"""The promotion decision end to end: evaluate scores challenger and champion on the same suites, register
decides from the paired per-document differences (real MLflow sqlite registry, real tiny models trained here).

    v1  champion: trained on domain A (prose)
    v2  trained on from v1 only on domain B (counting, easier), forgets A   → NOT promoted (replay regresses)
    v1  the identical rerun of v1 (same seed, same data)                  → NOT promoted (Δ = 0, CI ∋ 0), and no new
                                                                            version: the same weights and lineage
                                                                            are registered once
    v3  v1 trained longer on domain A                                     → promoted
    seed-1 rerun of v1 (only train.seed differs) vs v1, in both roles    → NOT promoted (seed-spread margin)

The margins come from a seed-spread record of this recipe built here (packtrain.evaluate.seed_spread): three
more trainings of v1's recipe with seeds 2, 3, 4, each scored on the same suites.

Under the old rule (challenger's own held-out loss < champion's recorded loss) v2 would have been promoted:
its loss on the easy domain B is far below v1's recorded loss on A (asserted below).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from promotion_models import domain_a, domain_b, train_tiny, write_eval_packs, write_jsonl, write_train_result

from packtrain.cli import main
from packtrain.config import load_run_config
from packtrain.testing.tiny_model import build_tiny_model_dir

NAME = "promo-lm"


@pytest.fixture(scope="module")
def world(tmp_path_factory, seed_mlflow_store):
    root = tmp_path_factory.mktemp("promotion")
    seed_mlflow_store(root / "mlflow.db")   # the registry's store, empty (its creation: not the subject)
    a_train, a_held, b_train, b_held = domain_a(120, 0), domain_a(40, 1), domain_b(120, 2), domain_b(40, 3)
    base = build_tiny_model_dir(root / "init", a_train + b_train, vocab_size=300, hidden_size=32)
    m = {"v1": train_tiny(base, root / "m1", a_train, steps=50, lr=3e-3, seed=0)}
    m["rerun"] = train_tiny(base, root / "m1b", a_train, steps=50, lr=3e-3, seed=0)
    m["forget"] = train_tiny(m["v1"], root / "m2", b_train, steps=40, lr=3e-3, seed=1)
    m["longer"] = train_tiny(m["v1"], root / "m3", a_train, steps=60, lr=3e-3, seed=2)
    m["seed1"] = train_tiny(base, root / "m1s1", a_train, steps=50, lr=3e-3, seed=1)
    packs = {"a": root / "packs_a", "b": root / "packs_b"}
    write_eval_packs(packs["a"] / "eval", base, a_held)
    write_eval_packs(packs["b"] / "eval", base, b_held)
    replay = write_jsonl(root / "replay_a.jsonl", a_held)
    w = {"root": root, "models": m, "packs": packs, "replay": replay, "uri": f"sqlite:///{root / 'mlflow.db'}",
         "spread": root / "seed_spread.json"}
    w["spread"].write_text(json.dumps(_calibrate(w, base, a_train)))
    return w


def _calibrate(world, base, texts, seeds=(2, 3, 4)) -> dict:
    """The seed-spread record of v1's recipe: seeds 2..4 trained as v1 was, each scored alone on recent + replay."""
    from packtrain.evaluate.paired_scores import paired_evaluation
    from packtrain.evaluate.seed_record import spread_record

    cfg = _cfg(world, _replay(world), "tracking.enabled=false", "register.promotion.seed_spread=null")
    dirs = []
    for s in seeds:
        model = train_tiny(base, world["root"] / f"cal{s}", texts, steps=50, lr=3e-3, seed=s)
        paired_evaluation(cfg, model, "none", world["root"] / f"cal_ev{s}", recent_packs=world["packs"]["a"] / "eval")
        dirs.append(world["root"] / f"cal_ev{s}")
    return spread_record(cfg, list(seeds), dirs)


def _cfg(world, *extra):
    return load_run_config("tiny-cpu", [
        f"workdir={world['root'] / 'work'}", f"tracking.tracking_uri={world['uri']}", f"register.model_name={NAME}",
        "tracking.system_metrics=false", "evaluate.sample_tokens=2", "evaluate.prompts=['The ']",
        "evaluate.suite_budget=128", "register.promotion.resamples=500",
        f"register.promotion.seed_spread={world['spread']}", *extra])


def _replay(world) -> str:
    return f"evaluate.suites=[{{name: replay, role: regression, path: {world['replay']}}}]"


def _evaluate_and_register(world, key, packs, tag, *extra):
    from packtrain.stages.evaluate import run_evaluate
    from packtrain.stages.register import run_register

    cfg = _cfg(world, *extra)
    ev_dir = world["root"] / f"ev_{tag}"
    ev = run_evaluate(cfg, world["models"][key], world["packs"][packs], ev_dir)
    reg = run_register(cfg, world["models"][key], ev_dir, world["root"] / "no-train", world["root"] / f"reg_{tag}")
    return ev, reg, ev_dir


def _validation(reg) -> dict:
    """The verdict's suites by name, from the register run's validation/validation.json (not version tags)."""
    from mlflow import MlflowClient

    path = MlflowClient(reg.tracking_uri).download_artifacts(reg.run_id, "validation/validation.json")
    return {s["suite"]: s for s in json.loads(Path(path).read_text())["suites"]}


def _champion():
    import mlflow

    return str(mlflow.MlflowClient().get_model_version_by_alias(NAME, "champion").version)


@pytest.fixture(scope="module")
def history(world):
    """Register v1..v3 in order (each evaluated against the champion of its time)."""
    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(world["root"])
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        set_fluent_tracking_uri(world["uri"])
        out = {"v1": _evaluate_and_register(world, "v1", "a", "v1")}
        out["champion_after_v1"] = _champion()
        out["forget"] = _evaluate_and_register(world, "forget", "b", "forget", _replay(world))
        out["champion_after_forget"] = _champion()
        out["rerun"] = _evaluate_and_register(world, "rerun", "a", "rerun")
        out["champion_after_rerun"] = _champion()
        out["longer"] = _evaluate_and_register(world, "longer", "a", "longer", _replay(world))
        out["champion_after_longer"] = _champion()
    return out


def test_first_version_is_champion_scored_alone(history):
    _, reg, ev_dir = history["v1"]
    assert (reg.version, reg.decision, history["champion_after_v1"]) == ("1", "champion", "1")
    manifest = json.loads((ev_dir / "suites.json").read_text())
    assert manifest["against"] is None and "no champion yet" in manifest["note"]
    assert reg.reason.startswith("first champion")


def test_forgetting_challenger_is_not_promoted(history):
    ev1, _, _ = history["v1"]
    ev, reg, ev_dir = history["forget"]
    # today's rule would have promoted it: its own held-out loss (easy data) is below v1's recorded loss
    assert ev.eval_loss < ev1.eval_loss
    assert (reg.version, reg.decision, history["champion_after_forget"]) == ("2", "challenger", "1")
    assert "replay (regression) not non-inferior" in reg.reason and "upper bound" in reg.reason and "CI [" in reg.reason
    t = reg.version_tags
    assert t["validation"] == "keep" and t["validation_against"] == "v1"
    assert t["validation_failed"] == "replay,champion_domain"   # v1's own held-out packs guard its domain too
    assert not [k for k in t if k.startswith("suite.")]   # per-suite numbers: validation/validation.json
    v = _validation(reg)
    assert v["replay"]["passed"] is False and v["replay"]["delta"] > 0.05
    assert v["recent"]["passed"] is True and v["recent"]["delta"] < 0   # better on its new data
    assert v["replay"]["md5"] == json.loads((ev_dir / "suites.json").read_text())["suites"][1]["md5"]
    # both models scored on the same documents with the same byte counts
    s = pq.read_table(ev_dir / "suite_scores.parquet").to_pandas()
    for _, g in s.groupby("suite"):
        ch, cp = (g[g.model == m].set_index("doc_id") for m in ("challenger", "champion"))
        assert list(ch.index) == list(cp.index) and (ch["bytes"] == cp["bytes"]).all()


def test_identical_rerun_is_not_promoted(history):
    _, reg, _ = history["rerun"]
    assert (reg.version, reg.existing, history["champion_after_rerun"]) == ("1", True, "1")   # no new version
    assert reg.reason.startswith(f"already registered: {NAME} v1 holds these weights")
    v = _validation(reg)
    assert v["recent"]["delta"] == 0.0 and (v["recent"]["ci_low"], v["recent"]["ci_high"]) == (0.0, 0.0)
    assert "recent (primary) not improved" in reg.reason


def test_longer_training_on_the_same_data_is_promoted(world, history):
    from packtrain.evaluate.seed_spread import seed_margin

    _, reg, _ = history["longer"]
    assert (reg.version, reg.decision, history["champion_after_longer"]) == ("3", "champion", "3")
    t, v = reg.version_tags, _validation(reg)
    rec = json.loads(world["spread"].read_text())["suites"]
    assert t["validation"] == "promote" and t["validation_failed"] == "none"
    # the seed-spread margin applied, and cleared: the improvement is beyond what a seed rerun moves
    assert v["recent"]["margin"] == pytest.approx(seed_margin(rec["recent"]["sd"], 3, 0.95), rel=1e-6)
    assert v["recent"]["upper"] < -v["recent"]["margin"] < 0 and v["recent"]["mde"] > 0
    assert v["replay"]["passed"] is True
    assert reg.metric == "bits_per_byte:recent" and reg.champion_value > reg.candidate_value


@pytest.mark.parametrize("challenger, champion", [("seed1", "v1"), ("v1", "seed1")])
def test_seed_rerun_is_not_promoted_in_either_role(world, tmp_path, challenger, champion):
    """Two trainings that differ only in train.seed: one of them looks better on the documents (the bootstrap
    holds both weights fixed), but not by more than the recorded seed spread, so neither takes the alias."""
    from packtrain.config.evaluate import PromotionConfig
    from packtrain.evaluate.paired_scores import paired_evaluation, read_decision_input
    from packtrain.evaluate.promotion import decide_promotion
    from packtrain.evaluate.seed_spread import seed_margin
    from packtrain.registry.op import promotion_verdict

    cfg = _cfg(world, _replay(world), "tracking.enabled=false")
    paired_evaluation(cfg, world["models"][challenger], str(world["models"][champion]), tmp_path / "out",
                      recent_packs=world["packs"]["a"] / "eval")
    v = promotion_verdict(tmp_path / "out", cfg.register_)
    recent = v.suites[0]
    assert not v.promote and "recent (primary) not improved" in v.reason and "seed-spread margin" in v.reason
    assert recent.margin_source.startswith("seed spread (k 3") and recent.mde is not None and recent.n == 40
    assert "margins from the seed-spread record seed_spread.json (recipe tiny-cpu, k 3 seeds)" in v.note
    rec = json.loads(world["spread"].read_text())["suites"]
    assert recent.threshold == pytest.approx(-seed_margin(rec["recent"]["sd"], 3, 0.95), rel=1e-6)
    assert v.suites[1].threshold == pytest.approx(max(0.01, seed_margin(rec["replay"]["sd"], 3, 0.95)), rel=1e-6)
    # the same tables without a record: only the document noise and the configured margins, said so
    suites, _ = read_decision_input(tmp_path / "out")
    plain = decide_promotion(suites, PromotionConfig(resamples=500), "v", True)
    assert "configured margins are assumed — delta 0" in plain.note and plain.suites[0].threshold == 0.0
    print(f"{challenger} vs {champion}: recent Δ {recent.delta:+.4f} CI [{recent.ci_low:+.4f}, {recent.ci_high:+.4f}] "
          f"margin {recent.margin:.4f}; without the record: {'promote' if plain.promote else 'keep'}")


def test_validation_artifacts_on_the_register_run(world, history):
    import mlflow

    _, reg, _ = history["forget"]
    client = mlflow.MlflowClient(tracking_uri=None)
    names = {f.path for f in client.list_artifacts(reg.run_id, "validation")}
    assert names == {"validation/validation.md", "validation/validation.json"}
    # what `packtrain compare NAME@ALIAS` prints under its table
    from packtrain.commands.compare import validation_lines

    (line,) = validation_lines(world["uri"], [f"{NAME}@champion", f"models:/{NAME}/2", "0123abcd"])[:1]
    assert line.startswith(f"{NAME}@champion (v3): promote — promoted over v1: recent (primary")
    assert validation_lines(world["uri"], [f"models:/{NAME}/2"])[0].startswith(f"models:/{NAME}/2 (v2): keep")


def test_against_reproduces_every_number_and_registers_nothing(world, history, tmp_path, capsys):
    """`packtrain evaluate --against` twice on the same models and suites: bit-identical tables and verdicts;
    no version registered, the alias where it was."""
    import mlflow

    args = ["evaluate", "--model", str(world["models"]["longer"]), "--packs", str(world["packs"]["a"]),
            "--against", f"models:/{NAME}/1", "--set", f"workdir={world['root'] / 'work'}",
            "--set", f"tracking.tracking_uri={world['uri']}", "--set", f"register.model_name={NAME}",
            "--set", "evaluate.suite_budget=128", "--set", "register.promotion.resamples=500",
            "--set", f"register.promotion.seed_spread={world['spread']}", "--set", _replay(world)]
    n_before = len(mlflow.MlflowClient(tracking_uri=world["uri"]).search_model_versions(f"name = '{NAME}'"))
    outs = []
    for k in range(2):
        out = tmp_path / f"v{k}"
        assert main([*args, "--out", str(out)]) == 0   # would be promoted over v1
        outs.append(out)
    assert "PROMOTE" in capsys.readouterr().out
    a, b = (pq.read_table(o / "suite_scores.parquet") for o in outs)
    assert a.equals(b)
    assert (outs[0] / "validation.json").read_bytes() == (outs[1] / "validation.json").read_bytes()
    client = mlflow.MlflowClient(tracking_uri=world["uri"])
    assert len(client.search_model_versions(f"name = '{NAME}'")) == n_before
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "3"


def test_mixed_tokenizers_compare_bits_per_byte(world, tmp_path):
    from packtrain.evaluate.paired_scores import paired_evaluation
    from packtrain.registry.op import promotion_verdict

    other = build_tiny_model_dir(tmp_path / "other0", domain_a(60, 5), vocab_size=400, hidden_size=32, seed=3)
    other = train_tiny(other, tmp_path / "other", domain_a(60, 5), steps=40, lr=3e-3, seed=3)
    cfg = _cfg(world, _replay(world), "tracking.enabled=false")
    manifest, _ = paired_evaluation(cfg, world["models"]["v1"], str(other), tmp_path / "out",
                                    recent_packs=world["packs"]["a"] / "eval")
    assert manifest["tokenizers_match"] is False
    s = pq.read_table(tmp_path / "out" / "suite_scores.parquet").to_pandas()
    ch, cp = (s[s.model == m].set_index(["suite", "doc_id"]) for m in ("challenger", "champion"))
    assert (ch["bytes"] == cp["bytes"]).all() and (ch["tokens"] != cp["tokens"]).any()
    v = promotion_verdict(tmp_path / "out", cfg.register_)
    assert "bits per byte" in v.note and all(d.unit == "bits/byte" and not d.loss_per_token for d in v.suites)


@pytest.mark.parametrize("suite, code", [("nope.jsonl", 5), ("bad.yaml", 3)])
def test_bad_suite_registers_nothing_and_moves_no_alias(world, history, tmp_path, capsys, suite, code):
    import mlflow

    (tmp_path / "bad.yaml").write_text("task: x\ndataset_path: hellaswag\n")
    sets = ["--set", f"workdir={world['root'] / 'work'}", "--set", f"tracking.tracking_uri={world['uri']}",
            "--set", f"register.model_name={NAME}",
            "--set", f"evaluate.suites=[{{name: held, role: regression, path: {tmp_path / suite}}}]"]
    out = tmp_path / "ev"
    got = main(["evaluate", *sets, "--model", str(world["models"]["longer"]), "--packs", str(world["packs"]["a"]),
                "--out", str(out)])
    err = capsys.readouterr().err
    assert got == code and "evaluate.suites[0] ('held').path" in err and "Traceback" not in err
    assert main(["register", *sets[:6], "--model", str(world["models"]["longer"]), "--eval", str(out)]) == 5
    client = mlflow.MlflowClient(tracking_uri=world["uri"])
    assert len(client.search_model_versions(f"name = '{NAME}'")) == 3
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "3"
    assert not out.exists()


def test_seed_rerun_without_a_record_is_not_promoted_in_either_role(world, tmp_path):
    """No seed-spread record covers the config (seed_spread null) and the margins are thin (confidence 0.51): on the
    documents alone one of two seeds beats the other. The champion's version records its config hash and seed, so a
    challenger of the same config that differs only in train.seed is not promoted, in either role."""
    from packtrain.config.evaluate import PromotionConfig
    from packtrain.evaluate.paired_scores import read_decision_input
    from packtrain.evaluate.promotion import decide_promotion
    from packtrain.stages.evaluate import run_evaluate
    from packtrain.stages.register import run_register
    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    seeds, train = {"v1": 0, "seed1": 1}, write_train_result(tmp_path / "train")
    alone = []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(world["root"])
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        set_fluent_tracking_uri(world["uri"])
        for champion, challenger in (("v1", "seed1"), ("seed1", "v1")):
            regs = []
            for key in (champion, challenger):
                cfg = _cfg(world, "evaluate.suites=[]", f"register.model_name={NAME}-seeds-{champion}",
                           "register.promotion.seed_spread=null", "register.promotion.confidence=0.51",
                           f"train.seed={seeds[key]}")
                ev = tmp_path / f"ev-{champion}-{key}"
                run_evaluate(cfg, world["models"][key], world["packs"]["a"], ev)
                regs.append(run_register(cfg, world["models"][key], ev, train, tmp_path / f"reg-{champion}-{key}"))
            first, second = regs
            assert first.version_tags["packtrain.train_seed"] == str(seeds[champion])
            assert (first.decision, second.version, second.decision) == ("champion", "2", "challenger")
            assert second.version_tags["validation"] == "keep"
            suites, _ = read_decision_input(ev)
            alone.append(decide_promotion(suites, PromotionConfig(resamples=500, confidence=0.51), "v1", True).promote)
            if alone[-1]:   # the better seed: the suites alone would promote it, its lineage does not
                assert second.reason.startswith(
                    f"not promoted over v1: the challenger differs from v1 only in train.seed ({seeds[challenger]}, "
                    f"v1 {seeds[champion]}; config {first.version_tags['packtrain.config_hash']}, init scratch): a "
                    "seed rerun is not an improvement (the suites alone: promoted over v1: recent"), second.reason
    assert sorted(alone) == [False, True], "one seed beats the other on the documents alone"
