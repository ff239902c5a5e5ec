"""Config of the model: its source (scratch, a checkpoint directory, a registered model) and its sizes."""

from __future__ import annotations

import re
import warnings
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

from packtrain.config.base import Float, Int, PathStr, PositiveFloat, PositiveInt, StrictModel
from packtrain.config.messages import Allowed

REGISTRY_URI = re.compile(r"^models:/(?P<name>[^/@\s]+)(?:@(?P<alias>[A-Za-z0-9_-]+)|/(?P<version>[1-9][0-9]*))$")
"""models:/NAME@ALIAS or models:/NAME/VERSION (MLflow's registered-model URIs)."""
_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


def _check_init_from(value: str) -> str:
    """Syntax only: scratch | champion | models:/NAME@ALIAS | models:/NAME/VERSION | a local path. Whether the
    directory exists or the registry knows the name is checked where the model is built
    (packtrain.model.init_from.resolve_init_source)."""
    if not value.strip():
        raise PydanticCustomError("blank_string", "only whitespace")
    if value.startswith("models:") and not REGISTRY_URI.match(value):
        raise PydanticCustomError("registry_uri", "a models:/ URI must be models:/NAME@ALIAS or models:/NAME/VERSION")
    if _URI_SCHEME.match(value) and not value.startswith("models:"):
        raise PydanticCustomError("uri_scheme", "only models:/ URIs and local directories (nothing is downloaded)")
    return value


InitFrom = Annotated[str, StringConstraints(min_length=1), AfterValidator(_check_init_from),
                     Allowed("'scratch', 'champion', models:/NAME@ALIAS, models:/NAME/VERSION or a local "
                             "save_pretrained directory")]


def _check_init_fallback(value: str) -> str:
    """init_from's syntax without the registry: a fallback must not need the registry that just had nothing."""
    value = _check_init_from(value)
    if value == "champion" or value.startswith("models:"):
        raise PydanticCustomError("registry_fallback", "a fallback cannot be a registry source")
    return value


InitFallback = Annotated[str, StringConstraints(min_length=1), AfterValidator(_check_init_fallback),
                         Allowed("'scratch' or a local save_pretrained directory")]


class RopeScaling(StrictModel):
    """RoPE scaling for context extension (transformers' rope_parameters / rope_scaling)."""

    type: Literal["linear", "dynamic", "yarn", "llama3"] = "linear"
    """linear: positions divided by factor; dynamic: NTK-aware θ grown with the sequence; yarn: YaRN
    (per-frequency interpolation + attention temperature); llama3: Llama-3.1's low/high-frequency split."""
    factor: Float = Field(1.0, ge=1.0)
    """Context multiple over original_max_position_embeddings (e.g. 4.0: 8k → 32k)."""
    original_max_position_embeddings: PositiveInt | None = None
    """The pre-extension context (None: the model's max_position_embeddings before scaling)."""
    low_freq_factor: PositiveFloat = 1.0
    """llama3 only."""
    high_freq_factor: PositiveFloat = 4.0
    """llama3 only."""

    @model_validator(mode="after")
    def _fields_of_the_type(self):
        # a field the chosen type does not read would be accepted and silently ignored: refuse it, named
        if self.original_max_position_embeddings is not None and self.type not in ("yarn", "llama3"):
            raise ValueError(f"original_max_position_embeddings ({self.original_max_position_embeddings}) is read "
                             f"by type yarn or llama3 only, not {self.type!r}: drop it or change the type")
        if (self.low_freq_factor, self.high_freq_factor) != (1.0, 4.0) and self.type != "llama3":
            raise ValueError(f"low_freq_factor/high_freq_factor ({self.low_freq_factor}, {self.high_freq_factor}) "
                             f"are read by type llama3 only, not {self.type!r}: drop them or set type llama3")
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"high_freq_factor ({self.high_freq_factor}) must be greater than low_freq_factor "
                             f"({self.low_freq_factor})")
        return self


class ModelConfig(StrictModel):
    """The model: random init from the sizes below (a Llama-style model), or a checkpoint of any supported
    family (llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3 — packtrain.model.families) to continue."""

    init_from: InitFrom = "scratch"
    """scratch: random init from the sizes below; a local save_pretrained directory (its config.json decides
    the family and every size; the sizes below are ignored); models:/NAME@ALIAS, models:/NAME/VERSION or
    champion: a registered model (downloaded once into <workdir>/models/<name>/v<version>/; champion is
    models:/<register.model_name>@champion). A source that brings a tokenizer is also what tokenize uses.
    packtrain.registry.source resolves it."""
    init_fallback: InitFallback = "scratch"
    """What init_from=champion starts from while the registered model has no champion yet (the first scheduled
    run): scratch or a local save_pretrained directory. The fallback is logged on stderr and tagged on the train
    run (packtrain.init_fallback_reason); any other registry source that does not exist is an error."""
    tokenizer_check: Literal["strict", "vocab"] = "strict"
    """How the train stage checks that the token store's ids are the init model's: strict — the store was made
    by the tokenizer the model ships (same tokenizer_hash) and its ids fit the vocabulary; vocab — only that
    the ids fit (a checkpoint without its real tokenizer, e.g. random-weight benchmarks on synthetic tokens).
    Scratch models take the store's tokenizer and are not checked."""
    allow_pickle: bool = False
    """Whether a registry model (init_from models:/… or champion) that exists only as a pickle (a pytorch-flavor
    version logged without its safetensors copy) may be loaded with mlflow.pytorch.load_model. Unpickling runs
    any code the file names, so the default false refuses it (exit 3, naming this setting); models packtrain
    registers carry safetensors and never need it (packtrain.model.logged_model)."""
    pretrained_dir: PathStr | None = None
    """Deprecated alias of init_from=<dir> (moved into init_from when the config loads)."""
    hidden_size: Int = Field(64, ge=8)
    intermediate_size: Int = Field(176, ge=8)
    num_layers: PositiveInt = 2
    num_heads: PositiveInt = 4
    num_kv_heads: PositiveInt | None = None
    """Grouped-query attention; None → num_heads."""
    max_position_embeddings: Int = Field(4096, ge=16)
    rope_theta: PositiveFloat | None = None
    """RoPE base frequency θ. None: 10,000 for a scratch model, the checkpoint's own θ with init_from; a number
    replaces a checkpoint's θ (said on stderr — docs/long-context.md). None, not a default number, so a config
    written out in full and read back (--gpus N ranks, pipeline pods, run.yaml) never overrides a checkpoint."""
    rope_scaling: RopeScaling | None = None
    """Stretch RoPE to a longer context (linear, dynamic NTK, YaRN, Llama-3 style); None: the family's own
    (a checkpoint's config is kept). packtrain.model.build applies it to scratch and checkpoint models alike."""
    tie_word_embeddings: bool = True
    init_std: PositiveFloat = 0.02

    @model_validator(mode="before")
    @classmethod
    def _pretrained_dir_alias(cls, data: Any) -> Any:
        old = data.get("pretrained_dir") if isinstance(data, dict) else None
        if isinstance(old, str) and old.strip():   # a blank one is left for the field's own check
            init = data.get("init_from", "scratch")
            if init not in ("scratch", data["pretrained_dir"]):
                raise ValueError(f"init_from ({init!r}) and its deprecated alias pretrained_dir "
                                 f"({data['pretrained_dir']!r}) disagree: set init_from only")
            warnings.warn("model.pretrained_dir is deprecated: use model.init_from=<dir>", DeprecationWarning,
                          stacklevel=2)
            data = {**data, "init_from": data["pretrained_dir"], "pretrained_dir": None}
        return data

    @model_validator(mode="after")
    def _heads(self):
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if (self.hidden_size // self.num_heads) % 2:
            # rotary embeddings rotate pairs of channels: an odd head dimension fails in the first forward
            raise ValueError(f"hidden_size / num_heads = {self.hidden_size // self.num_heads} (the head dimension) "
                             "must be even for rotary embeddings")
        kv = self.num_kv_heads or self.num_heads
        if self.num_heads % kv:
            raise ValueError(f"num_heads ({self.num_heads}) must be divisible by num_kv_heads ({kv})")
        return self
