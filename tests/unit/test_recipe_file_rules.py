"""A recipe file says one thing: a key given twice (at any depth) and an empty file are refused at load time,
exit 2, naming the file, the dotted key and both lines — before, YAML kept the last value silently and a 0-byte
recipe ran on built-in defaults. Shipped recipes are unaffected (tests/unit/test_config.py loads them all)."""

from __future__ import annotations

import hashlib

import pytest

from packtrain.cli import main as cli_main
from packtrain.config import load_run_config
from packtrain.errors import ConfigError


@pytest.mark.parametrize("text, key, lines", [
    ("train:\n  lr: 0.001\n  max_steps: 3\n  lr: 0.01\n", "train.lr", (2, 4)),
    ("train:\n  lr: 0.001\npack:\n  budget: 64\ntrain:\n  max_steps: 2\n", "train", (1, 5)),
    ("name: a\nname: b\n", "name", (1, 2)),
    ("evaluate:\n  suites:\n    - name: a\n      name: b\n", "evaluate.suites[0].name", (3, 4)),
])
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path, text, key, lines):
    recipe = tmp_path / "dup.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_run_config(recipe)
    msg = str(e.value)
    assert f"key {key!r} is given twice (line {lines[0]} and line {lines[1]})" in msg
    assert str(recipe) in msg


@pytest.mark.parametrize("text, what", [("", "0 bytes"), ("# a comment\n\n", "only comments or blank lines")])
def test_an_empty_recipe_is_refused(tmp_path, text, what):
    recipe = tmp_path / "empty.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=rf"recipe .*empty.yaml is empty \({what}\)"):
        load_run_config(recipe)


def test_the_cli_exits_2_and_writes_nothing(tmp_path, capsys):
    recipe = tmp_path / "dup.yaml"
    recipe.write_text(f"workdir: {tmp_path / 'wd'}\ntrain:\n  lr: 0.001\n  lr: 0.01\n")
    before = hashlib.md5(recipe.read_bytes()).hexdigest()
    assert cli_main(["ingest", "--recipe", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: recipe ") and "'train.lr' is given twice (line 3 and line 4)" in err
    assert not (tmp_path / "wd").exists()
    assert hashlib.md5(recipe.read_bytes()).hexdigest() == before


def test_the_same_key_in_different_sections_still_loads(tmp_path):
    recipe = tmp_path / "ok.yaml"
    recipe.write_text("train:\n  seed: 3\n  max_steps: 3\npack:\n  budget: 64\n  seed: 5\n")
    cfg = load_run_config(recipe)
    assert (cfg.train.max_steps, cfg.pack.budget) == (3, 64)
