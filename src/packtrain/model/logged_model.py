"""The Hugging Face files inside a downloaded MLflow model, read without unpickling anything.

Unpickling a model runs whatever code the pickle names, so a registry model is read from its safetensors
files; a pickle is loaded only when the run opts in with `model.allow_pickle: true`. Where the files are, per
flavor the register stage logs (packtrain.registry.model):

    transformers    <local>/model/ (MLmodel `model_binary`)     config.json, model.safetensors, ...
                    <local>/components/tokenizer/               tokenizer files
                    (register.flavor files and transformers alike: files logs the exported files as they are)
    pytorch         <local>/data/model.pth                      the pickled nn.Module: never read by default
                    <local>/extra_files/                        config.json, model.safetensors, tokenizer files
                                                                (the save_pretrained copy logged next to it)

    hf_files(local, "models:/lm/3")  → HFFiles(flavor="pytorch", model_dir=<local>/extra_files,
                                                tokenizer_dir=<local>/extra_files, pickle_only=False)

A pytorch-flavor model without the safetensors copy (logged by hand, or by packtrain before it logged the
copy) is `pickle_only`: `require_pickle_opt_in` refuses it (PickleRefused, exit 3, naming model.allow_pickle)
unless the setting is on; `load_pickled` is then the one call of `mlflow.pytorch.load_model` in packtrain
(tests/unit/test_no_pickle.py checks that no other module unpickles).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packtrain.errors import InputDataError

ALLOW_PICKLE = "model.allow_pickle"
"""The setting that lets a pickled model be loaded (packtrain.config.ModelConfig.allow_pickle)."""


class PickleRefused(InputDataError):
    """A registry model that exists only as a pickle, without the `model.allow_pickle` opt-in (exit 3)."""


@dataclass(frozen=True)
class HFFiles:
    flavor: str                   # transformers | pytorch
    model_dir: Path | None        # config.json + *.safetensors; None: pickle only
    tokenizer_dir: Path | None

    @property
    def pickle_only(self) -> bool:
        return self.model_dir is None


def _is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def hf_files(local: str | Path, what: str) -> HFFiles:
    """Where the safetensors model and the tokenizer are in the downloaded MLflow model `local` (module doc).
    `what` names the model in errors (e.g. 'models:/lm/3'). Reads MLmodel (YAML) only."""
    from mlflow.models import Model

    local = Path(local)
    flavors = Model.load(str(local)).flavors
    if "transformers" in flavors:
        conf = flavors["transformers"]
        comps = local / "components" / "tokenizer"
        return HFFiles("transformers", local / conf.get("model_binary", "model"), comps if comps.is_dir() else None)
    if "pytorch" in flavors:
        extra = local / "extra_files"
        return HFFiles("pytorch", extra if _is_hf_dir(extra) else None, extra if extra.is_dir() else None)
    raise InputDataError(f"{what}: the logged model has flavors {sorted(flavors)}; packtrain loads models logged "
                         "with the transformers or pytorch flavor (its register stage)")


def require_pickle_opt_in(files: HFFiles, what: str, allow_pickle: bool) -> None:
    """PickleRefused when `files` is pickle-only and the run did not set model.allow_pickle."""
    if files.pickle_only and not allow_pickle:
        raise PickleRefused(
            f"{what}: this {files.flavor}-flavor model holds its weights only as a pickle (data/model.pth, no "
            f"config.json + *.safetensors in extra_files/); unpickling runs any code the file names, so it is "
            f"refused. Set {ALLOW_PICKLE}=true to load it anyway (only for a registry you trust), or register "
            f"the model again with this packtrain (register.flavor=transformers, or pytorch, which now logs a "
            f"safetensors copy)")


def load_pickled(local: str | Path, what: str, allow_pickle: bool):
    """The nn.Module of a pickle-only pytorch-flavor model (full unpickling: model.allow_pickle only)."""
    files = hf_files(local, what)
    require_pickle_opt_in(files, what, allow_pickle)
    import mlflow

    return mlflow.pytorch.load_model(str(local), map_location="cpu")


def load_hf(files: HFFiles):
    """(model in fp32, tokenizer) from safetensors/tokenizer files only (transformers refuses a pickled
    pytorch_model.bin here: use_safetensors=True). fp32 whatever the files hold: a version logged as the exported
    bf16 files (register.flavor=files) loads as the fp32 re-save of the in-memory flavors did."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert files.model_dir is not None, "pickle-only: see load_pickled"
    model = AutoModelForCausalLM.from_pretrained(str(files.model_dir), use_safetensors=True, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(files.tokenizer_dir or files.model_dir))
    return model.eval(), tok
