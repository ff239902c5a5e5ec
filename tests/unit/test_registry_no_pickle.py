"""Registry models load from safetensors, never by unpickling, unless the run opts in (model.allow_pickle).

A real MLflow registry on sqlite in tmp holds model `lm`: v1 registered with the transformers flavor, v2 with
the pytorch flavor (which now logs a save_pretrained copy next to MLflow's pickle), v3 a pytorch-flavor model
logged by hand as a pickle only (what packtrain used to log, or anyone can), v4 with the default flavor (files:
the exported directory as it is). Every pickle load is seen by a
Python audit hook on `pickle.find_class` (raised by every Unpickler that resolves a class, torch.load's
included; torch's weights_only loader and safetensors never raise it).
"""

from __future__ import annotations

import sys

import pytest
import torch

from packtrain.config import RegisterConfig, load_run_config
from packtrain.model.logged_model import PickleRefused
from packtrain.registry.source import resolve_init
from packtrain.testing.tiny_families import BOS, build_tiny_family_dir

V = 97
_seen: list[tuple[str, str]] = []
_watching: list[bool] = []


def _audit(event: str, args) -> None:
    if event == "pickle.find_class" and _watching:
        _seen.append((str(args[0]), str(args[1])))


sys.addaudithook(_audit)   # hooks cannot be removed: it records only while a test watches


class unpickled:
    """`with unpickled() as seen:` → the (module, name) pairs any unpickler resolved inside the block."""

    def __enter__(self) -> list:
        _seen.clear()
        _watching.append(True)
        return _seen

    def __exit__(self, *exc) -> None:
        _watching.clear()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    import mlflow
    from registry_helpers import register_model_dir as register_model
    from transformers import AutoModelForCausalLM

    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    root = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    dirs = {v: build_tiny_family_dir(root / f"v{v}", "llama", vocab_size=V, seed=v) for v in (1, 2, 3, 4)}
    with pytest.MonkeyPatch.context() as mp:   # module scope: the autouse isolation is not active yet
        mp.chdir(root)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        set_fluent_tracking_uri(uri)
        r1 = register_model(dirs[1], {"eval_loss": 3.0, "perplexity": 20.1}, None,
                            RegisterConfig(model_name="lm", flavor="transformers"))
        r2 = register_model(dirs[2], {"eval_loss": 2.0, "perplexity": 7.4}, None,
                            RegisterConfig(model_name="lm", flavor="pytorch"))
        with mlflow.start_run(run_name="by-hand", experiment_id="0"):   # Default: registry_helpers says why
            model = AutoModelForCausalLM.from_pretrained(str(dirs[3]))
            info = mlflow.pytorch.log_model(model, name="model", serialization_format="pickle",
                                            extra_files=[str(dirs[3] / "tokenizer.json"),
                                                         str(dirs[3] / "tokenizer_config.json")],
                                            pip_requirements=["torch"])
        v3 = mlflow.register_model(info.model_uri, "lm")
        r4 = register_model(dirs[4], {"eval_loss": 2.5, "perplexity": 12.2}, None, RegisterConfig(model_name="lm"))
        set_fluent_tracking_uri("")
    assert (r1.flavor, r2.flavor, str(v3.version), r4.version, r4.flavor) == ("transformers", "pytorch", "3", "4",
                                                                              "files")
    return {"uri": uri, "dirs": dirs}


def _logits(model):
    with torch.no_grad():
        return model.float().eval()(torch.tensor([[BOS, 5, 9, 12, 40]]), use_cache=False).logits


def _dir_logits(path):
    from transformers import AutoModelForCausalLM

    return _logits(AutoModelForCausalLM.from_pretrained(str(path), use_safetensors=True))


def _cfg(wd, uri, init_from, *extra):
    return load_run_config("tiny-cpu", [f"workdir={wd}", f"tracking.tracking_uri={uri}", "register.model_name=lm",
                                        f"model.init_from={init_from}", *extra])


def test_registered_versions_load_without_unpickling(registry, tmp_path):
    from packtrain.registry.model import load_registered

    for v in (1, 2, 4):
        with unpickled() as seen:
            src = resolve_init(_cfg(tmp_path / "wd", registry["uri"], f"models:/lm/{v}"), announce=False)
            model, tok = load_registered(f"models:/lm/{v}", registry["uri"])
        assert seen == [], f"v{v} unpickled {seen[:5]}"
        want = _dir_logits(registry["dirs"][v])
        assert torch.equal(_dir_logits(src.path), want) and torch.equal(_logits(model), want)
        assert tok.convert_tokens_to_ids(tok.eos_token) is not None


def test_a_pickle_only_version_is_refused_unless_allow_pickle(registry, tmp_path):
    from packtrain.registry.model import load_registered

    wd = tmp_path / "wd"
    with unpickled() as seen:
        with pytest.raises(PickleRefused) as err:
            resolve_init(_cfg(wd, registry["uri"], "models:/lm/3"), announce=False)
        with pytest.raises(PickleRefused):
            load_registered("models:/lm/3", registry["uri"])
    assert seen == []
    msg = str(err.value)
    assert err.value.exit_code == 3 and "models:/lm/3" in msg and "model.allow_pickle=true" in msg, msg
    assert not (wd / "models" / "lm" / "v3").exists()   # nothing half-made left behind
    # opted in: loaded by unpickling (the hook sees it), saved as safetensors, same weights
    with unpickled() as seen:
        src = resolve_init(_cfg(wd, registry["uri"], "models:/lm/3", "model.allow_pickle=true"), announce=False)
    assert seen, "the audit hook saw no unpickling: the refusal above proves nothing"
    assert torch.equal(_dir_logits(src.path), _dir_logits(registry["dirs"][3]))
