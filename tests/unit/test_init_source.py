"""`model.init_from` from the Model Registry (packtrain.registry.source): resolution, the local cache,
the champion fallback and every refusal; the tokenizer hash (packtrain.data.tokenizer_files) and the BOS/EOS
rule read off a tokenizer (packtrain.data.tokenizer_setup.special_tokens_rule).

A real MLflow registry on sqlite in tmp holds model `lm`: v1 logged with the transformers flavor, v2 (lower
eval loss → champion) with the pytorch flavor, so both download paths run.
"""

from __future__ import annotations

import json
import shutil
import socket

import pytest
import torch

from packtrain.config import ModelConfig, RegisterConfig, load_run_config
from packtrain.data.tokenizer_files import tokenizer_hash
from packtrain.errors import ConfigError, MissingDataError
from packtrain.model.init_from import resolve_init_source
from packtrain.registry.source import SOURCE_FILE, cache_identity, resolve_init
from packtrain.testing.tiny_families import BOS, EOS, build_tiny_family_dir

V = 97


def _promoted_over(version: str):
    """A real paired verdict (packtrain.evaluate.promotion): 3 nats better on each of 20 documents."""
    import numpy as np

    from packtrain.config.evaluate import PromotionConfig
    from packtrain.evaluate.promotion import decide_promotion

    nll = 500 + np.arange(20.0)
    cols = {m: {"nll": nll - d, "tokens": np.full(20, 90), "bytes": np.full(20, 400), "acc": np.full(20, np.nan)}
            for m, d in (("challenger", 3.0), ("champion", 0.0))}
    return decide_promotion([{"suite": "recent", "role": "primary", "kind": "text", "md5": "m", **cols,
                              "same_tokenizer": True}], PromotionConfig(resamples=200), version, True)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    from registry_helpers import register_model_dir as register_model

    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    root = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    dirs = {1: build_tiny_family_dir(root / "v1", "llama", vocab_size=V, seed=0),
            2: build_tiny_family_dir(root / "v2", "llama", vocab_size=V, seed=1)}
    with pytest.MonkeyPatch.context() as mp:   # module scope: the autouse isolation is not active yet
        mp.chdir(root)                          # a new experiment's artifacts go under ./mlruns
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        set_fluent_tracking_uri(uri)
        r1 = register_model(dirs[1], {"eval_loss": 3.0, "perplexity": 20.1}, None,
                            RegisterConfig(model_name="lm", flavor="transformers"))
        r2 = register_model(dirs[2], {"eval_loss": 2.0, "perplexity": 7.4}, None,
                            RegisterConfig(model_name="lm", flavor="pytorch"), verdict=_promoted_over("v1"))
    assert (r1.version, r1.flavor, r2.version, r2.flavor, r2.decision) == ("1", "transformers", "2", "pytorch",
                                                                          "champion")
    return {"root": root, "uri": uri, "dirs": dirs}


def _cfg(wd, uri, init_from, *extra):
    return load_run_config("tiny-cpu", [f"workdir={wd}", f"tracking.tracking_uri={uri}", "register.model_name=lm",
                                        f"model.init_from={init_from}", *extra])


def _logits(path):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.tensor([[BOS, 5, 9, 12, 40]]), use_cache=False).logits


def test_champion_and_versions_download_once_into_the_workdir_cache(registry, tmp_path, capsys):
    wd = tmp_path / "wd"
    champ = resolve_init(_cfg(wd, registry["uri"], "champion"))
    assert (champ.kind, champ.name, champ.version, champ.uri) == ("registry", "lm", "2", "models:/lm/2")
    assert champ.path == wd / "models" / "lm" / "v2" and champ.reason is None
    assert "model.init_from=champion → models:/lm/2 (downloaded in" in capsys.readouterr().err
    # the pytorch-flavor version comes back as a save_pretrained directory with its tokenizer
    info = json.loads((champ.path / SOURCE_FILE).read_text())
    assert (info["flavor"], info["uri"], info["tokenizer_hash"]) == ("pytorch", "models:/lm/2",
                                                                    tokenizer_hash(registry["dirs"][2]))
    assert torch.allclose(_logits(champ.path), _logits(registry["dirs"][2]), atol=0, rtol=0)
    v1 = resolve_init(_cfg(wd, registry["uri"], "models:/lm/1"))
    assert v1.path == wd / "models" / "lm" / "v1" and json.loads((v1.path / SOURCE_FILE).read_text())[
        "flavor"] == "transformers"
    assert torch.allclose(_logits(v1.path), _logits(registry["dirs"][1]), atol=0, rtol=0)
    assert tokenizer_hash(v1.path) == tokenizer_hash(registry["dirs"][1])   # same after the MLflow round trip
    assert resolve_init(_cfg(wd, registry["uri"], "models:/lm@champion")).path == champ.path
    # a complete cached version is reused, not downloaded again
    stamp = (champ.path / SOURCE_FILE).stat().st_mtime_ns
    capsys.readouterr()
    again = resolve_init(_cfg(wd, registry["uri"], "champion"))
    assert again == champ and (champ.path / SOURCE_FILE).stat().st_mtime_ns == stamp
    assert "(cached in" in capsys.readouterr().err
    assert sorted(p.name for p in (wd / "models" / "lm").iterdir() if not p.name.endswith(".lock")) == ["v1", "v2"]
    # consumers that only see a ModelConfig get the directory; without the run config a registry value is refused
    assert resolve_init_source(champ.model_config(ModelConfig(init_from="champion"))) == champ.path
    assert resolve_init(_cfg(wd, registry["uri"], "scratch"), ModelConfig(init_from="champion")).path == champ.path
    with pytest.raises(ConfigError, match="a registry source is resolved with the run config"):
        resolve_init_source(ModelConfig(init_from="models:/lm/1"))
    # the train run's tags (copied onto the next registered version by the register stage)
    assert champ.tags() == {"packtrain.init_from": "champion", "packtrain.init_resolved": "models:/lm/2",
                            "packtrain.parent_model_version": "2", "packtrain.parent_model": "models:/lm/2"}


def test_registry_sources_that_do_not_exist_are_clear_errors(registry, tmp_path):
    wd = tmp_path / "wd"
    cases = {
        "models:/lm@nope": "model.init_from 'models:/lm@nope': registered model 'lm' has no alias 'nope' in "
                           f"{registry['uri']} (versions 1, 2; aliases champion → v2)",
        "models:/lm/9": "registered model 'lm' has no version 9 in",
        "models:/other/1": f"model.init_from 'models:/other/1': no registered model 'other' in {registry['uri']} "
                           "(registered models there: lm)",
    }
    for value, words in cases.items():
        with pytest.raises(MissingDataError) as e:
            resolve_init(_cfg(wd, registry["uri"], value))
        assert words in str(e.value) and e.value.exit_code == 5, str(e.value)
    assert not (wd / "models").exists()   # nothing downloaded, nothing written


def test_champion_without_one_falls_back_and_says_so(registry, tmp_path, capsys):
    wd = tmp_path / "wd"
    first = resolve_init(_cfg(wd, registry["uri"], "champion", "register.model_name=brand-new"))
    assert (first.path, first.kind, first.resolved) == (None, "scratch", "scratch")
    assert first.reason == (f"no champion yet: no registered model 'brand-new' in {registry['uri']} (registered "
                            "models there: lm)")
    assert first.tags()["packtrain.init_fallback_reason"] == first.reason
    err = capsys.readouterr().err
    assert "[packtrain] model.init_from=champion: no registered model 'brand-new'" in err
    assert "starting from model.init_fallback=scratch instead" in err
    # the fallback may be a directory; a missing one is the usual missing-directory error
    d = registry["dirs"][1]
    to_dir = resolve_init(_cfg(wd, registry["uri"], "champion", "register.model_name=brand-new",
                               f"model.init_fallback={d}"))
    assert (to_dir.path, to_dir.kind) == (d, "dir") and to_dir.reason.startswith("no champion yet")
    with pytest.raises(MissingDataError, match="no such directory"):
        resolve_init(_cfg(wd, registry["uri"], "champion", "register.model_name=brand-new",
                          f"model.init_fallback={tmp_path / 'gone'}"))
    # only champion falls back: the fallback itself cannot be a registry source
    with pytest.raises(ConfigError, match="model.init_fallback: 'champion' is not allowed: must be 'scratch' or a "
                                          "local save_pretrained directory"):
        _cfg(wd, registry["uri"], "champion", "model.init_fallback=champion")


def test_unreachable_registry_names_the_cached_copies(registry, tmp_path):
    wd = tmp_path / "wd"
    resolve_init(_cfg(wd, registry["uri"], "models:/lm/1"))   # cached while the store was up
    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MissingDataError) as e:
        resolve_init(_cfg(wd, f"http://127.0.0.1:{port}", "champion"))
    msg = str(e.value)
    assert f"model.init_from 'champion': the model registry at http://127.0.0.1:{port} cannot be read" in msg
    assert f"model.init_from={wd / 'models' / 'lm' / 'v1'} (cached: v1)" in msg and "or scratch" in msg


def test_stage_cache_identity_follows_the_champion(registry, tmp_path):
    wd = tmp_path / "wd"
    assert cache_identity(_cfg(wd, registry["uri"], "scratch"), "train") is None
    champ = _cfg(wd, registry["uri"], "champion")
    assert cache_identity(champ, "train") == {"init": "models:/lm/2"}
    assert cache_identity(champ, "tokenize") == {"tokenizer_hash": tokenizer_hash(registry["dirs"][2])}
    fallback = cache_identity(_cfg(wd, registry["uri"], "champion", "register.model_name=brand-new"), "train")
    assert fallback == {"init": "scratch"}
    d = tmp_path / "d"
    shutil.copytree(registry["dirs"][1], d)
    before = cache_identity(_cfg(wd, registry["uri"], str(d)), "train")
    (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes() + b"\0")   # weights changed
    assert before["init"].startswith("dir:") and cache_identity(_cfg(wd, registry["uri"], str(d)), "train") != before


def test_tokenizer_hash_is_what_decides_the_ids(tmp_path):
    d = build_tiny_family_dir(tmp_path / "q", "qwen2", vocab_size=V)
    h = tokenizer_hash(d)
    assert h.startswith("sha256:") and len(h) == 71
    # MLflow's transformers flavor rewrites tokenizer_config.json (is_local, local_files_only): same tokenizer
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "is_local": True, "local_files_only": False},
                                                        indent=4))
    assert tokenizer_hash(d) == h
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "add_bos_token": True}))
    assert tokenizer_hash(d) != h
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["model"]["vocab"]["t5"], tj["model"]["vocab"]["t6"] = 6, 5   # two ids swapped
    (d / "tokenizer.json").write_text(json.dumps(tj))
    assert tokenizer_hash(d) not in (h, None)
    assert tokenizer_hash(tmp_path / "empty") is None


@pytest.mark.parametrize("family,prefix", [("llama", [BOS]), ("gemma2", [BOS]), ("qwen3", []), ("mistral", [BOS])])
def test_special_tokens_rule_follows_the_tokenizer(tmp_path, family, prefix):
    from packtrain.data.tokenizer_setup import _document_ids, load_tokenizer, special_tokens_rule

    d = build_tiny_family_dir(tmp_path / family, family, vocab_size=V)
    tok = load_tokenizer(d)
    assert special_tokens_rule(tok) == (prefix, [])
    wrap = _document_ids(prefix, [], EOS, append_eos=True)
    assert wrap([5, 6]) == [*prefix, 5, 6, EOS] == tok("t5 t6")["input_ids"] + [EOS]
    # a tokenizer whose own rule already ends a text with EOS gets no second one
    assert _document_ids([BOS], [EOS], EOS, append_eos=True)([5]) == [BOS, 5, EOS]
    assert _document_ids([], [], EOS, append_eos=False)([5]) == [5]
