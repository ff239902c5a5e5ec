"""The challenger's recipe (config hash, train.seed, init) comes from what its train stage recorded beside the model,
so a seed rerun evaluated by a command without `--set train.seed=…` is still recognised (stage-by-stage runs)."""

from __future__ import annotations

import json

from packtrain.config import load_run_config
from packtrain.evaluate.recipe_identity import challenger_identity, recipe_identity, seed_rerun_line


def _manifest(challenger: dict) -> dict:
    return {"challenger": {"recipe": challenger}, "champion_domain": {"status": "recent"},
            "against": {"label": "v1", "recipe": {"config_hash": challenger["config_hash"], "train_seed": 0}}}


def test_the_train_stage_record_beside_the_model_wins_over_the_evaluate_config(tmp_path):
    evaluate_cfg = load_run_config("tiny-cpu")   # train.seed 0: the command that evaluates forgot the seed
    trained = recipe_identity(load_run_config("tiny-cpu", ["train.seed=1"]))
    model = tmp_path / "train" / "model"
    model.mkdir(parents=True)
    (model.parent / "train_result.json").write_text(json.dumps({"steps": 30, "recipe": trained}))
    got = challenger_identity(evaluate_cfg, model)
    assert got == trained and got["train_seed"] == 1
    line = seed_rerun_line(_manifest(got))
    assert line is not None and line.startswith("the challenger differs from v1 only in train.seed (1, v1 0;")
    # what the evaluate config alone said: seed 0 like v1, so no seed rerun was seen
    assert seed_rerun_line(_manifest(recipe_identity(evaluate_cfg))) is None


def test_without_a_record_the_evaluate_config_is_the_recipe(tmp_path):
    cfg = load_run_config("tiny-cpu", ["train.seed=3"])
    (tmp_path / "model").mkdir()
    assert challenger_identity(cfg, tmp_path / "model") == recipe_identity(cfg)
    (tmp_path / "train_result.json").write_text(json.dumps({"steps": 30}))   # written before the field existed
    assert challenger_identity(cfg, tmp_path / "model")["train_seed"] == 3


def test_the_version_tags_carry_the_split_settings_apart_from_the_recipe():
    """packtrain.split_hash (ingest, validate, tokenize) stays when only the model or training changes: the
    contamination check then knows the champion held out this run's split (champion_domain.same_split)."""
    from packtrain.evaluate.recipe_identity import CONFIG_TAG, SPLIT_TAG, identity_tags

    base, longer = (recipe_identity(load_run_config("tiny-cpu", s)) for s in ([], ["train.max_steps=99"]))
    other_split = recipe_identity(load_run_config("tiny-cpu", ["tokenize.eval_fraction=0.2"]))
    assert base["split_hash"] == longer["split_hash"] != other_split["split_hash"]
    assert base["config_hash"] != longer["config_hash"]
    tags = identity_tags({"challenger": {"recipe": base}})
    assert tags[SPLIT_TAG] == base["split_hash"] and tags[CONFIG_TAG] == base["config_hash"]
    old = {k: v for k, v in base.items() if k != "split_hash"}   # a train record from before the field
    assert SPLIT_TAG not in identity_tags({"challenger": {"recipe": old}})
