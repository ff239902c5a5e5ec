"""Recipes load against the schema; bad keys and values fail at load time naming field, value, allowed."""

from __future__ import annotations

import pytest

from packtrain.config import list_recipes, load_run_config
from packtrain.errors import ConfigError


@pytest.mark.parametrize("path", list_recipes(), ids=lambda p: p.stem)
def test_every_recipe_loads(path):
    cfg = load_run_config(path)
    assert cfg.name == path.stem
    assert cfg.pack.budget >= 2


def test_override_changes_value_and_type_is_checked():
    cfg = load_run_config("tiny-cpu", ["pack.budget=1024", "train.precision=bf16", "validate.min_rows=3"])
    assert (cfg.pack.budget, cfg.train.precision, cfg.validate_.min_rows) == (1024, "bf16", 3)
    assert cfg.to_dict()["validate"]["min_rows"] == 3


def test_typo_key_names_field_and_allowed_keys():
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", ["pack.budgett=4096"])
    assert "pack.budgett" in str(e.value) and "budget" in str(e.value) and "unknown key" in str(e.value)


@pytest.mark.parametrize("override, line", [
    # an unknown section set by --set: the --set is named (not the recipe), and the key meant is suggested
    ("trian.lr=1", "--set trian.lr=1: trian: unknown key — did you mean train.lr? (allowed: evaluate, ingest,"),
    ("train.lrr=1", "--set train.lrr=1: train.lrr: unknown key — did you mean train.lr? (allowed: ac_count,"),
    ("zzz.qq=1", "--set zzz.qq=1: zzz: unknown key (allowed: evaluate,"),   # nothing near: no guess
])
def test_unknown_key_of_an_override_names_the_override_and_the_key_meant(override, line):
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", [override])
    assert str(e.value).startswith(line) and "recipe tiny-cpu.yaml" not in str(e.value), str(e.value)


def test_unknown_key_in_a_recipe_file_names_the_file_and_the_key_meant(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("pack:\n  budgett: 64\n")
    with pytest.raises(ConfigError, match=r"^recipe r\.yaml: pack\.budgett: unknown key — did you mean pack\.budget\?"):
        load_run_config(recipe)


def test_wrong_type_names_field_and_value():
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", ["pack.budget=abc"])
    assert "pack.budget" in str(e.value) and "'abc'" in str(e.value)


def test_bad_choice_lists_allowed_values():
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", ["pack.strategy=best"])
    msg = str(e.value)
    assert "pack.strategy" in msg and "'bfd'" in msg and "'sequential'" in msg


def test_recipe_file_with_typo_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pack:\n  budget: 512\ntrian:\n  max_steps: 3\n")
    with pytest.raises(ConfigError) as e:
        load_run_config(bad)
    assert "trian" in str(e.value) and "train" in str(e.value)


def test_unknown_recipe_lists_available():
    with pytest.raises(ConfigError) as e:
        load_run_config("no-such-recipe")
    assert "tiny-cpu" in str(e.value)


def test_malformed_override():
    with pytest.raises(ConfigError):
        load_run_config("tiny-cpu", ["pack.budget"])


def test_cross_field_rule():
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", ["model.hidden_size=65"])
    assert "divisible" in str(e.value)


def test_options_of_an_unused_engine_or_precision_are_warned_about():
    import warnings

    from packtrain.config.train import UnusedSettingWarning

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        load_run_config("tiny-cpu", ["train.fsdp.reduce_dtype=bf16", "train.fp8.recipe=rowwise"])
        load_run_config("tiny-cpu", ["train.engine=deepspeed", "train.deepspeed.zero_stage=3"])   # used: quiet
    lines = sorted(str(w.message) for w in seen if w.category is UnusedSettingWarning)
    assert lines == ["train.fp8 is set but ignored: train.precision is not fp8 (train.precision=fp32, train.engine=torch)",
                     "train.fsdp is set but ignored: train.engine is not fsdp2 (train.precision=fp32, train.engine=torch)"]
