"""Logging a model to MLflow in one of three ways, and loading a registered version back.

    log_model_dir(model_dir, flavor, pip_requirements, card, model_id=..., run_id=...)
        → (ModelInfo, flavor used, note on the choice, seconds from the directory to the logged model)

Flavor (RegisterConfig.flavor, measured with mlflow 3.17.2 + transformers 5.24, docs/evaluate.md):
- files (default): the exported directory's files copied as they are into MLflow's transformers flavor
  (packtrain.registry.files): nothing loaded, nothing re-saved; bf16 weights stay bf16 on disk. A
  350M-parameter Llama saved in bf16, on the 2-core CPU machine: 0.40 s and 652 MiB logged, where load +
  transformers re-save takes 6.7 s and logs 1,304 MiB (bench/results/register_speed.json; the register stage
  took 39.8 s on a GPU host the old way). A directory without config.json + *.safetensors (a pickled
  pytorch_model.bin) goes the `auto` way, said in the note.
- transformers, from the in-memory {"model", "tokenizer"} (task text-generation): loads the directory (fp32)
  and re-saves every weight. Logging the *local checkpoint path* instead fails in mlflow 3.17.2
  (`flavor_config.build_flavor_config_from_local_checkpoint` calls `.__name__` on the pipeline class, which
  transformers 5 stores as a string: AttributeError); `files` writes that flavor config itself.
- pytorch (fallback): `mlflow.pytorch.log_model(serialization_format="pickle")` (mlflow's default "pt2"
  needs an input example to trace) with, as `extra_files`, the model's save_pretrained files (config.json,
  model.safetensors) and the tokenizer files: a directory packtrain loads without unpickling.
`auto` tries transformers and falls back to pytorch on any exception, recording the reason.

Loading (`load_registered`, `load_champion`) reads only safetensors and tokenizer files
(packtrain.model.logged_model), in fp32 whatever the flavor; a pickle-only model (a pytorch-flavor version
logged without the safetensors copy) is refused unless `allow_pickle` (the run's `model.allow_pickle`) is true.

`pip_requirements` are always explicit: MLflow's inference takes ~7.5 s and pins `torch==2.13.0+cpu`.
"""

from __future__ import annotations

import time
from importlib import metadata
from pathlib import Path

from packtrain.model.saving import no_deepspeed_probe, save_pretrained

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "chat_template.jinja")
ARTIFACT_NAME = "model"


def default_pip_requirements() -> list[str]:
    """Installed versions pinned without local suffixes, e.g. ['torch==2.13.0', 'transformers==5.24.0', ...]."""
    reqs = []
    for pkg in ("torch", "transformers", "tokenizers", "safetensors", "mlflow"):
        try:
            reqs.append(f"{pkg}=={metadata.version(pkg).split('+')[0]}")
        except metadata.PackageNotFoundError:
            reqs.append(pkg)
    return reqs


def _model_card(text: str):
    try:
        from huggingface_hub import ModelCard

        return ModelCard(f"---\nlicense: other\nlibrary_name: transformers\n---\n{text}\n")
    except Exception:   # an optional nicety; logging must not depend on it
        return None


def log_model(model, tokenizer, model_dir: Path, flavor: str, pip_requirements: list[str],
              card_text: str = "", model_id: str | None = None, run_id: str | None = None, step: int = 0
              ) -> tuple[object, str, str, float]:
    """Log into run `run_id` (default: the active MLflow run) as its output at `step` (MLflow links the run's
    metrics of that step to the model). With `model_id`, into that existing logged model (its artifacts are
    overwritten: how a registration repeated after a crash logs nothing twice).
    Returns (ModelInfo, flavor used, note on the choice, seconds)."""
    import mlflow

    note = ""
    t0 = time.perf_counter()
    where: dict[str, str | int | None] = {"model_id": model_id, "run_id": run_id} if model_id or run_id else {}
    where["step"] = step
    if flavor in ("auto", "transformers"):
        try:
            with no_deepspeed_probe():   # the flavor save_pretrained's the in-memory model
                info = mlflow.transformers.log_model(
                    transformers_model={"model": model, "tokenizer": tokenizer}, name=ARTIFACT_NAME,
                    task="text-generation", pip_requirements=pip_requirements, model_card=_model_card(card_text),
                    **where)
            return info, "transformers", "transformers flavor from in-memory components", \
                time.perf_counter() - t0
        except Exception as e:   # auto: any rejection of the installed versions → pytorch flavor
            if flavor == "transformers":
                raise
            note = f"transformers flavor failed ({type(e).__name__}: {str(e)[:300]}); pytorch flavor used"
    import tempfile

    with tempfile.TemporaryDirectory(prefix="packtrain-hf-") as hf:
        # the safetensors copy every loader reads (packtrain.model.logged_model); the pickle is MLflow's own
        save_pretrained(model, hf, safe_serialization=True)
        extra = [str(p) for p in sorted(Path(hf).iterdir()) if p.is_file()]
        extra += [str(model_dir / f) for f in TOKENIZER_FILES if (model_dir / f).is_file()]
        info = mlflow.pytorch.log_model(model, name=ARTIFACT_NAME, pip_requirements=pip_requirements,
                                        extra_files=extra, serialization_format="pickle", **where)
    return info, "pytorch", note or "pytorch flavor requested", time.perf_counter() - t0


def log_model_dir(model_dir: Path, flavor: str, pip_requirements: list[str], card_text: str = "",
                  model_id: str | None = None, run_id: str | None = None, step: int = 0
                  ) -> tuple[object, str, str, float]:
    """Log the exported directory `model_dir` (a save_pretrained directory with its tokenizer) with `flavor`
    (module doc) into run `run_id` (its output at `step`), or into the existing logged model `model_id`.
    Returns (ModelInfo, flavor used, note on the choice, seconds: the whole step, the load included for the
    in-memory flavors)."""
    from packtrain.errors import InputDataError

    t0 = time.perf_counter()
    model_dir, note = Path(model_dir), ""
    if flavor == "files":
        from packtrain.registry.files import check_exported_dir, log_model_files

        try:
            check_exported_dir(model_dir)
        except InputDataError as e:   # e.g. only a pytorch_model.bin: loaded and re-saved as safetensors
            note, flavor = f"files flavor not possible ({e})", "auto"
        else:
            info = log_model_files(model_dir, pip_requirements, card_text, name=ARTIFACT_NAME, model_id=model_id,
                                   run_id=run_id, step=step)
            return info, "files", "the exported files as they are, in MLflow's transformers flavor", \
                time.perf_counter() - t0
    from packtrain.evaluate.loading import load_model_dir

    model, tokenizer = load_model_dir(model_dir, "cpu")
    info, used, why, _ = log_model(model, tokenizer, model_dir, flavor, pip_requirements, card_text,
                                   model_id=model_id, run_id=run_id, step=step)
    return info, used, "; ".join(x for x in (note, why) if x), time.perf_counter() - t0


def load_registered(model_uri: str, tracking_uri: str | None = None, allow_pickle: bool = False):
    """(model, tokenizer) of a logged/registered model, e.g. 'models:/packtrain-lm@champion', either flavor,
    from its safetensors files. A pickle-only model raises PickleRefused naming model.allow_pickle unless
    `allow_pickle` (packtrain.model.logged_model)."""
    import mlflow

    from packtrain.model.logged_model import hf_files, load_hf, load_pickled
    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    # MLflow 3.17 resolves `models:/name@alias` through the *global* registry URI whatever download_artifacts
    # is given, so the store is made global for the download and the previous one restored after (also
    # MLFLOW_TRACKING_URI, which mlflow.set_tracking_uri would otherwise leave pinned in os.environ)
    before = mlflow.get_tracking_uri()
    if tracking_uri:
        set_fluent_tracking_uri(tracking_uri)
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, tracking_uri=tracking_uri,
                                                         registry_uri=tracking_uri))
    finally:
        if tracking_uri:
            set_fluent_tracking_uri(before)
    files = hf_files(local, model_uri)
    if not files.pickle_only:
        return load_hf(files)
    from transformers import AutoTokenizer

    model = load_pickled(local, model_uri, allow_pickle)
    return model.eval(), AutoTokenizer.from_pretrained(str(local / "extra_files"))


def load_champion(name: str, tracking_uri: str | None = None, allow_pickle: bool = False):
    """(model, tokenizer) of `models:/<name>@champion`.

    >>> model, tok = load_champion("packtrain-lm", "sqlite:///data/mlflow.db")   # doctest: +SKIP
    >>> tok.decode(model.generate(**tok("def ", return_tensors="pt"), max_new_tokens=8)[0])  # doctest: +SKIP
    """
    from mlflow.exceptions import MlflowException

    from packtrain.errors import MissingDataError

    try:
        return load_registered(f"models:/{name}@champion", tracking_uri, allow_pickle)
    except MlflowException as e:
        from packtrain.secrets import redact_text, redact_uri

        where = redact_uri(tracking_uri) or "the current tracking store"
        raise MissingDataError(f"registered model {name!r} has no champion in {where}: "
                               f"{redact_text(str(e))[:200]}") from None
