"""Where the model's weights come from: `model.init_from` → a local save_pretrained directory, or None.

    init_from                          resolve_init_source(model_cfg)
    scratch (default)                  None: random init from the config's sizes (a Llama-style model)
    /path/to/dir (save_pretrained)     Path('/path/to/dir') after checking it holds config.json
    models:/NAME@ALIAS                 the registered version's files, downloaded from the tracking store into
    models:/NAME/VERSION               a local directory (registry resolution: the warm-start part of the
    champion                           work; until it is in, a ConfigError says so)

The config checks only the syntax (packtrain.config.train.InitFrom); this module checks that the source exists.
Every consumer (the model builder, the memory planner) calls `resolve_init_source`, so a registry resolver only
has to return a directory here for the rest of packtrain to load it like any local checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from packtrain.errors import ConfigError, MissingDataError

if TYPE_CHECKING:
    from packtrain.config import ModelConfig


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

    >>> from packtrain.config import ModelConfig
    >>> resolve_init_source(ModelConfig()) is None
    True
    """
    value = init_from_value(model_cfg)
    if value == "scratch":
        return None
    if is_registry_source(value):
        raise ConfigError(f"model.init_from {value!r}: loading from the model registry is not supported yet; "
                          "use a local save_pretrained directory (model.init_from=/path/to/dir) or 'scratch'")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise MissingDataError(f"model.init_from {value!r}: no such directory; a local save_pretrained directory "
                               "is needed (nothing is downloaded from a hub: save the model with "
                               "save_pretrained first), or 'scratch'")
    if not (path / "config.json").is_file():
        raise MissingDataError(f"model.init_from {path}: no config.json (a save_pretrained directory is needed)")
    return path
