"""Logging an exported model directory to MLflow as it is: its files copied, the weights never loaded or re-saved.

    log_model_files(model_dir, pip_requirements, card_text, model_id=..., run_id=...) -> ModelInfo

What gets logged is MLflow's own transformers flavor, laid out as `mlflow.transformers.log_model` lays out a
*local checkpoint path* (which mlflow 3.17.2 cannot do itself: packtrain.registry.model's module doc):

    MLmodel                  transformers: task text-generation, instance_type TextGenerationPipeline,
                                           pipeline_model_type = config.json architectures[0],
                                           tokenizer_type AutoTokenizer, torch_dtype torch.float32,
                                           model_binary model, components [tokenizer]
                             python_function: loader_module mlflow.transformers
                             signature: string → string (MLflow's default for text-generation)
    model/                   the model's files of the exported directory, byte for byte: config.json,
                             generation_config.json, *.safetensors (+ model.safetensors.index.json), tokenizer
                             files (`model_files`: anything else there, a log or a stray file, stays out)
    components/tokenizer/    the tokenizer files (packtrain.data.tokenizer_files), byte for byte
    model_card.md, requirements.txt, conda.yaml, python_env.yaml

So a version logged this way is, to every reader, a transformers-flavor version:
- `mlflow.pyfunc.load_model(uri).predict(["def "])` is MLflow's text-generation wrapper, the contract of a
  version logged from in-memory components: a prompt, a list of prompts or a one-column DataFrame → a list of
  generated texts, each starting with its prompt; fp32 weights (torch_dtype), as the in-memory path re-saved them;
- packtrain reads `model/` and `components/tokenizer/` (packtrain.model.logged_model.hf_files), safetensors and
  tokenizer files only.

Subdirectories are left out too (a LoRA model/ registers its merged/ instead: packtrain.registry.adapter).
The staging copy MLflow logs from is hard-linked to the exported files when they share a file system (else
copied): the artifact store's copy is then the only full copy made. A 350M-parameter Llama saved in bf16
(652 MiB), on the 2-core CPU machine into a sqlite store: 0.40 s, against 6.7 s to load it and let
mlflow.transformers re-save it in fp32 (1,304 MiB; bench/results/register_speed.json).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from packtrain.errors import InputDataError

MODEL_BINARY = "model"
"""The logged model's directory of weights (MLmodel `model_binary`), as MLflow names it."""
TOKENIZER_COMPONENT = Path("components") / "tokenizer"


def check_exported_dir(model_dir: Path) -> None:
    """InputDataError naming `model_dir` unless it holds config.json (with `architectures`) and *.safetensors."""
    if not (model_dir / "config.json").is_file() or not any(model_dir.glob("*.safetensors")):
        raise InputDataError(f"model directory {model_dir}: register.flavor=files logs config.json + *.safetensors "
                             "as they are; this directory has no such pair (register.flavor=auto loads and "
                             "re-saves it)")
    try:
        arch = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("architectures")
    except (OSError, ValueError) as e:
        raise InputDataError(f"model directory {model_dir}: config.json cannot be read ({e})") from None
    if not arch or not isinstance(arch, list):
        raise InputDataError(f"model directory {model_dir}: config.json has no `architectures` (which model "
                             "class loads it); save the model with save_pretrained")


def model_files(model_dir: Path) -> list[Path]:
    """The files of `model_dir` a version holds: config.json, generation_config.json, *.safetensors and their
    index, the tokenizer files (packtrain.data.tokenizer_files.TOKENIZER_FILES); sorted by name."""
    from packtrain.data.tokenizer_files import TOKENIZER_FILES

    names = {"config.json", "generation_config.json", "model.safetensors.index.json", *TOKENIZER_FILES}
    return sorted(p for p in model_dir.iterdir() if p.is_file() and (p.name in names or p.suffix == ".safetensors"))


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)   # the staging copy costs nothing; MLflow only reads it
    except OSError:         # another file system, or links not allowed
        shutil.copy2(src, dst)


def _flavor_config(model_dir: Path) -> dict:
    """The transformers flavor config of `model_dir`: what mlflow.transformers writes for a local checkpoint,
    read from config.json alone (neither torch nor transformers imported: a cold import costs ~9 s here).
    `tokenizer_type` AutoTokenizer: MLflow loads the tokenizer with `transformers.AutoTokenizer.from_pretrained`,
    which picks the class tokenizer_config.json names, as packtrain's own loaders do."""
    from importlib.metadata import version

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return {"task": "text-generation", "instance_type": "TextGenerationPipeline",
            "pipeline_model_type": config["architectures"][0], "source_model_name": str(model_dir),
            "model_binary": MODEL_BINARY, "torch_dtype": "torch.float32", "tokenizer_type": "AutoTokenizer",
            "components": ["tokenizer"], "transformers_version": version("transformers"), "code": None}


def save_model(path: str, mlflow_model, model_dir: str, pip_requirements: list[str], card_text: str = "") -> None:
    """Write the MLflow model of `model_dir` into `path` (module doc). Called by `mlflow.models.Model.log`,
    which then logs `path` into the logged model."""
    import yaml
    from mlflow import pyfunc
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ColSpec, Schema
    from mlflow.utils.environment import _process_pip_requirements, _PythonEnv

    from packtrain.data.tokenizer_files import TOKENIZER_FILES

    out, src = Path(path), Path(model_dir)
    flavor = _flavor_config(src)
    (out / MODEL_BINARY).mkdir(parents=True)
    (out / TOKENIZER_COMPONENT).mkdir(parents=True)
    for f in model_files(src):
        _link_or_copy(f, out / MODEL_BINARY / f.name)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            _link_or_copy(src / name, out / TOKENIZER_COMPONENT / name)
    if card_text:
        (out / "model_card.md").write_text(card_text + "\n", encoding="utf-8")

    mlflow_model.add_flavor("transformers", **flavor)
    mlflow_model.signature = ModelSignature(inputs=Schema([ColSpec("string")]), outputs=Schema([ColSpec("string")]))
    pyfunc.add_to_model(mlflow_model, loader_module="mlflow.transformers", conda_env="conda.yaml",
                        python_env="python_env.yaml")
    mlflow_model.model_size_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    mlflow_model.save(str(out / "MLmodel"))
    conda_env, reqs, constraints = _process_pip_requirements([], list(pip_requirements))   # as every flavor
    with open(out / "conda.yaml", "w", encoding="utf-8") as fh:
        yaml.safe_dump(conda_env, fh, default_flow_style=False)
    if constraints:
        (out / "constraints.txt").write_text("\n".join(constraints), encoding="utf-8")
    (out / "requirements.txt").write_text("\n".join(reqs), encoding="utf-8")
    _PythonEnv.current().to_yaml(str(out / "python_env.yaml"))


def log_model_files(model_dir: Path, pip_requirements: list[str], card_text: str = "", name: str = "model",
                    model_id: str | None = None, run_id: str | None = None, step: int = 0):
    """Log `model_dir` as it is (module doc) into run `run_id` (default: the active run), as its output at
    `step`; with `model_id`, into that existing logged model (its artifacts overwritten). Returns MLflow's
    ModelInfo."""
    from types import SimpleNamespace

    from mlflow.models import Model

    model_dir = Path(model_dir)
    check_exported_dir(model_dir)
    return Model.log(artifact_path=None, name=name, flavor=SimpleNamespace(save_model=save_model),
                     flavor_name="transformers", model_dir=str(model_dir), pip_requirements=pip_requirements,
                     card_text=card_text, model_id=model_id, run_id=run_id, step=step)
