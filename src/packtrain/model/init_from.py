"""Where the model's weights come from: `model.init_from` → a local save_pretrained directory, or None.

    init_from                          resolve_init_source(model_cfg)
    scratch (default)                  None: random init from the config's sizes (a Llama-style model)
    /path/to/dir (save_pretrained)     Path('/path/to/dir') after checking it holds config.json
    models:/NAME@ALIAS                 the registered version's files, downloaded once from the run's tracking
    models:/NAME/VERSION               store into <workdir>/models/<name>/v<version>/ by
    champion                           packtrain.registry.source.resolve_init(run_cfg) (champion without
                                       one yet → model.init_fallback); here a ConfigError

The config checks only the syntax (packtrain.config.model.InitFrom); this module checks that the source exists.
Every consumer (the model builder, the memory planner) calls `resolve_init_source`; the stages that hold the run
config (tokenize, train) resolve a registry source first and hand the others a ModelConfig whose init_from is
the downloaded directory (`InitSource.model_config`), so the rest of packtrain loads it like any local checkpoint.
This module is the lower one: packtrain.registry.source imports it, never the other way.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from packtrain.errors import ConfigError, MissingDataError

if TYPE_CHECKING:
    # from the module that defines it: packtrain.config's loader calls this module (config.preflight)
    from packtrain.config.model import ModelConfig


def init_from_value(model_cfg: ModelConfig) -> str:
    """model.init_from, with the deprecated model.pretrained_dir honoured (a model_copy skips the config's
    own migration of it)."""
    value = model_cfg.init_from
    if value == "scratch" and getattr(model_cfg, "pretrained_dir", None):
        return str(model_cfg.pretrained_dir)
    return value


def is_registry_source(value: str) -> bool:
    return value == "champion" or value.startswith("models:/")


def resolve_init_source(model_cfg: ModelConfig) -> Path | None:
    """None for `scratch`; else the local directory to load (config.json checked). Errors name the field.

    A registry source is resolved with the run config (tracking URI, workdir, register.model_name) by
    packtrain.registry.source.resolve_init; here a ConfigError names the directory to pass instead.

    >>> from packtrain.config import ModelConfig
    >>> resolve_init_source(ModelConfig()) is None
    True
    """
    value = init_from_value(model_cfg)
    if value == "scratch":
        return None
    if is_registry_source(value):
        raise ConfigError(f"model.init_from {value!r}: a registry source is resolved with the run config "
                          "(tracking URI, workdir, register.model_name) by the tokenize and train stages; "
                          "here pass the directory they download it to (<workdir>/models/<name>/v<version>/), "
                          "another local save_pretrained directory, or 'scratch'")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise MissingDataError(f"model.init_from {value!r}: no such directory; a local save_pretrained directory "
                               "is needed (nothing is downloaded from a hub: save the model with "
                               "save_pretrained first), or 'scratch'")
    if not (path / "config.json").is_file():
        raise MissingDataError(f"model.init_from {path}: no config.json (a save_pretrained directory is needed)")
    return path


def init_checkpoint_config(model_cfg: ModelConfig) -> dict | None:
    """config.json (a dict) of a local `model.init_from` directory, the family the stages pick attention for
    (packtrain.model.families.pick_attention); None for scratch (a Llama-style model), a registry source (its
    download is read once resolved), a directory without a readable config.json or of an unsupported
    model_type (the loader names those)."""
    from packtrain.model.families import checkpoint_config

    value = init_from_value(model_cfg)
    if value == "scratch" or is_registry_source(value):
        return None
    return checkpoint_config(Path(value).expanduser())
