"""Load a trained model directory (the train stage's `save_pretrained` output with its tokenizer).

    <model_dir>/config.json, model.safetensors, generation_config.json      (model.save_pretrained)
    <model_dir>/tokenizer.json, tokenizer_config.json                      (tokenizer.save_pretrained)

or a LoRA run's adapter directory (packtrain.model.lora.save_adapter_model):

    <model_dir>/adapter_config.json, adapter_model.safetensors              (peft save_pretrained)
    <model_dir>/packtrain_adapter.json     base location (base/ or the init_from directory), loss_on, merged/
    <model_dir>/tokenizer.json, ...

An adapter directory loads as base (fp32) + adapter merged (peft merge_and_unload): the same function, one matmul
per linear. `model_loss_on(dir)` is the train.loss_on the model was trained with (evaluation scores the same
tokens).

Errors name the directory and the missing file, never a transformers traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtrain.errors import ConfigError, InputDataError, MissingDataError

if TYPE_CHECKING:
    from packtrain.config import EvalConfig


@dataclass
class Loaded:
    """A model loaded for evaluation: in eval mode on `device`, with the isolated attention `backend`;
    `compiled`: its decoder layers are `torch.compile`d (evaluate.compile) for the fixed-shape scoring forwards —
    run anything of varying shape (generation, lm-eval tasks) under `eager()`."""

    model: Any
    tokenizer: Any
    backend: str
    device: Any
    compiled: bool = False

    def eager(self):
        """A context in which the compiled layers run eagerly (no graph per generation length)."""
        import contextlib

        if not self.compiled:
            return contextlib.nullcontext()
        import torch

        return torch.compiler.set_stance("force_eager")


def load_for_eval(model_dir: Path, cfg: EvalConfig, dev=None) -> Loaded:
    """The model and tokenizer of `model_dir` on evaluate's device, with the attention backend its family allows
    for evaluate.attention and evaluate.precision (auto resolved for the device): Gemma2's soft-caps refuse
    sdpa; auto on CUDA in bf16 → varlen. The held-out perplexity and the suites use the same load."""
    from packtrain.config.evaluate import eval_compile, eval_precision
    from packtrain.model.families import pick_attention

    dev = resolve_device(cfg.device) if dev is None else dev
    backend = pick_attention(cfg.attention, dev, eval_precision(cfg.precision, dev.type),
                             read_model_config(model_dir), training=False, key="evaluate.attention",
                             where=f"model directory {model_dir}")
    model, tok = load_model_dir(model_dir, dev, backend)
    compiled = eval_compile(cfg.compile, dev.type)
    if compiled:
        compile_layers(model)
    return Loaded(model, tok, backend, dev, compiled)


def compile_layers(model) -> None:
    """`torch.compile` each decoder layer in place with static shapes: the scoring forwards all have the same
    token count (rows × budget), so one graph serves every layer, every batch, both models and the suites
    (cu_seqlens is marked dynamic by `model_inputs(..., compiled=True)`)."""
    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None:
        raise ConfigError(f"evaluate.compile: {type(model).__name__} has no decoder layers at .model.layers "
                          "(allowed: evaluate.compile=false)")
    for layer in layers:
        layer.compile(dynamic=False)


def resolve_device(device: str = "auto"):
    """'auto' → cuda when available, else cpu. Asking for cuda without one is a ConfigError."""
    import torch

    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("evaluate.device: 'cuda' requested but torch.cuda.is_available() is False "
                          "(allowed here: auto, cpu)")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"evaluate.device: {device!r} is not allowed (allowed: auto, cpu, cuda)")
    return torch.device(device)


def check_model_dir(model_dir: str | Path) -> Path:
    """The directory exists and holds config.json + weights + a tokenizer (or an adapter, its base and a
    tokenizer); returns it as a Path."""
    from packtrain.model.lora import ADAPTER_META, adapter_base_dir, read_adapter_meta

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise MissingDataError(f"model directory {model_dir} does not exist: run `packtrain train` first "
                               f"or pass --model DIR")
    try:
        meta = read_adapter_meta(model_dir)
    except (OSError, ValueError) as e:
        raise InputDataError(f"model directory {model_dir}: {ADAPTER_META} cannot be read ({e})") from None
    if meta is not None:
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            if not (model_dir / f).is_file():
                raise InputDataError(f"model directory {model_dir}: adapter run without {f} (peft save_pretrained)")
        base = adapter_base_dir(model_dir, meta)
        if not (base / "config.json").is_file():
            raise MissingDataError(f"model directory {model_dir}: the adapter's base {base} (from {ADAPTER_META}, "
                                   f"init_from {meta.get('init_from')!r}) has no config.json")
        if not (model_dir / "tokenizer.json").is_file() and not (model_dir / "tokenizer_config.json").is_file():
            raise InputDataError(f"model directory {model_dir}: no tokenizer (tokenizer.json)")
        return model_dir
    if not (model_dir / "config.json").is_file():
        raise InputDataError(f"model directory {model_dir}: missing config.json (expected a "
                             f"save_pretrained directory)")
    if not any(model_dir.glob("*.safetensors")) and not any(model_dir.glob("*.bin")):
        raise InputDataError(f"model directory {model_dir}: no weights (*.safetensors or *.bin)")
    if not (model_dir / "tokenizer.json").is_file() and not (model_dir / "tokenizer_config.json").is_file():
        raise InputDataError(f"model directory {model_dir}: no tokenizer (tokenizer.json); the train stage "
                             f"saves the tokenizer next to the model")
    return model_dir


def model_loss_on(model_dir: str | Path) -> str:
    """train.loss_on of the run that wrote `model_dir`: packtrain_adapter.json's, or config.json's
    `packtrain_loss_on` (a full fine-tune with loss_on ≠ all), else 'all'."""
    import json

    from packtrain.model.lora import read_adapter_meta

    model_dir = Path(model_dir)
    meta = read_adapter_meta(model_dir)
    if meta is not None:
        return str(meta.get("loss_on") or "all")
    try:
        return str(json.loads((model_dir / "config.json").read_text()).get("packtrain_loss_on") or "all")
    except (OSError, ValueError):
        return "all"


def read_model_config(model_dir: str | Path):
    """The transformers config of a save_pretrained directory (an adapter directory: its base's), which decides
    the family; InputDataError naming the directory when it cannot be read."""
    from transformers import AutoConfig

    from packtrain.model.lora import adapter_base_dir, read_adapter_meta

    model_dir = check_model_dir(model_dir)
    meta = read_adapter_meta(model_dir)
    config_dir = adapter_base_dir(model_dir, meta) if meta is not None else model_dir
    try:
        return AutoConfig.from_pretrained(str(config_dir))
    except (OSError, ValueError, KeyError) as e:
        raise InputDataError(f"model directory {model_dir} cannot be loaded: {e}") from None


def load_model_dir(model_dir: str | Path, device="cpu", attention: str = "auto"):
    """(model in eval mode on `device`, tokenizer) from a save_pretrained directory (or an adapter directory:
    base + adapter, merged).

    attention: a packtrain backend (sdpa | eager | flex | varlen, packtrain.model.attention), all of which
    isolate packed documents given `model_inputs(batch, backend)`; auto (registration, export) → the first one
    the model's family allows on `device` (packtrain.model.families.pick_attention: Gemma2 → eager on the CPU).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from packtrain.model.attention import HF_NAMES, register_attention_backends
    from packtrain.model.families import check_attention, pick_attention
    from packtrain.model.lora import load_adapter_model, read_adapter_meta

    register_attention_backends()
    model_dir = check_model_dir(model_dir)
    meta = read_adapter_meta(model_dir)
    hf_cfg = read_model_config(model_dir)
    where = f"model directory {model_dir}"
    if attention == "auto":
        attention = pick_attention("auto", device, "fp32", hf_cfg, training=False, where=where)
    # refuse a family × backend pair that cannot isolate documents (or honour the family's attention) by name
    check_attention(hf_cfg, attention, training=False, where=where, key="evaluate.attention")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        # fp32 master weights; `precision` autocasts the forward (bf16 weights would bias the loss).
        if meta is not None:
            model = load_adapter_model(model_dir, attention, torch.float32)
        else:
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation=HF_NAMES[attention],
                                                         dtype=torch.float32)
    except (OSError, ValueError, KeyError) as e:
        raise InputDataError(f"model directory {model_dir} cannot be loaded: {e}") from None
    return model.to(device).eval(), tokenizer
