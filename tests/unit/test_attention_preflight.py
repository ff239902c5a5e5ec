"""Attention backend × model family, decided once for every stage: `auto` picks a backend the family allows
(Gemma2's soft-cap: never sdpa), an explicit refused pair fails at config load — before any stage writes
anything — naming the setting, the value, the family and the allowed values, and registration loads a Gemma2
model without refusal."""

from __future__ import annotations

import json

import pytest

from packtrain.cli import main
from packtrain.config import load_run_config
from packtrain.errors import ConfigError
from packtrain.model.families import allowed_backends, pick_attention
from packtrain.testing.tiny_families import build_tiny_family_dir, tiny_family_config

V = 97


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    return build_tiny_family_dir(tmp_path_factory.mktemp("gemma2") / "gemma2", "gemma2", V)


def test_auto_picks_a_backend_the_family_allows():
    gemma2 = tiny_family_config("gemma2").to_dict()
    for training in (True, False):
        assert pick_attention("auto", "cpu", "fp32", gemma2, training) == "eager"   # sdpa has no soft-cap
        assert pick_attention("auto", "cpu", "fp32", tiny_family_config("llama").to_dict(), training) == "sdpa"
        assert pick_attention("auto", "cpu", "fp32", None, training) == "sdpa"      # scratch: Llama-style
    assert allowed_backends(gemma2) == ["eager", "flex"]
    assert pick_attention("eager", "cpu", "fp32", gemma2) == "eager"
    with pytest.raises(ConfigError, match=r"family Gemma2 \(gemma2\) with evaluate.attention=sdpa is refused: .*"
                                          r"\(allowed for Gemma2: auto, eager, flex\)"):
        pick_attention("sdpa", "cpu", "fp32", gemma2, training=False)


@pytest.mark.parametrize("setting", ["train.attention", "evaluate.attention"])
def test_refused_pair_fails_at_config_load(gemma2, setting):
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", [f"model.init_from={gemma2}", f"{setting}=sdpa"])
    msg = str(e.value)
    assert f"model.init_from {gemma2}: family Gemma2 (gemma2) with {setting}=sdpa is refused" in msg, msg
    assert "soft-capping (2) cannot run on sdpa" in msg and "(allowed for Gemma2: auto, eager, flex)" in msg, msg
    cfg = load_run_config("tiny-cpu", [f"model.init_from={gemma2}", "train.attention=eager"])
    assert cfg.evaluate.attention == "auto"        # train.attention=eager alone is enough: evaluate's auto follows
    from packtrain.config.preflight import check_attention_settings

    assert check_attention_settings(cfg) == {"train.attention": ["eager", "flex"],
                                             "evaluate.attention": ["eager", "flex"],
                                             "register (export load)": ["eager", "flex"]}


def test_refused_pair_exits_2_before_ingest_writes_anything(gemma2, tmp_path, capsys):
    src = tmp_path / "in" / "d.jsonl"
    src.parent.mkdir()
    src.write_text(json.dumps({"text": "t5 t6 t7"}) + "\n", encoding="utf-8")
    before = src.read_bytes()
    work = tmp_path / "work"
    code = main(["ingest", "--source", str(src.parent), "--set", f"workdir={work}", "--set", "tracking.enabled=false",
                 "--set", f"model.init_from={gemma2}", "--set", "train.attention=sdpa"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "family Gemma2 (gemma2) with train.attention=sdpa is refused" in err, err
    assert not work.exists(), sorted(p.name for p in work.rglob("*"))
    assert src.read_bytes() == before


def test_registration_load_of_a_gemma2_model_is_not_refused(gemma2):
    """load_model_dir's default (what registration calls): the family's first allowed backend on the CPU."""
    from packtrain.evaluate.loading import load_model_dir

    model, tok = load_model_dir(gemma2, "cpu")
    assert model.config.model_type == "gemma2" and model.config._attn_implementation == "eager"
    assert len(tok) == V
