"""Load a trained model directory (the train stage's `save_pretrained` output with its tokenizer).

    <model_dir>/config.json, model.safetensors, generation_config.json      (model.save_pretrained)
    <model_dir>/tokenizer.json, tokenizer_config.json                      (tokenizer.save_pretrained)

Errors name the directory and the missing file, never a transformers traceback.
"""

from __future__ import annotations

from pathlib import Path

from packtrain.errors import ConfigError, InputDataError, MissingDataError


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
    """The directory exists and holds config.json + weights + a tokenizer; returns it as a Path."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise MissingDataError(f"model directory {model_dir} does not exist: run `packtrain train` first "
                               f"or pass --model DIR")
    if not (model_dir / "config.json").is_file():
        raise InputDataError(f"model directory {model_dir}: missing config.json (expected a "
                             f"save_pretrained directory)")
    if not any(model_dir.glob("*.safetensors")) and not any(model_dir.glob("*.bin")):
        raise InputDataError(f"model directory {model_dir}: no weights (*.safetensors or *.bin)")
    if not (model_dir / "tokenizer.json").is_file() and not (model_dir / "tokenizer_config.json").is_file():
        raise InputDataError(f"model directory {model_dir}: no tokenizer (tokenizer.json); the train stage "
                             f"saves the tokenizer next to the model")
    return model_dir


def load_model_dir(model_dir: str | Path, device="cpu", attention: str = "sdpa"):
    """(model in eval mode on `device`, tokenizer) from a save_pretrained directory.

    attention: a packtrain backend (sdpa | eager | flex | varlen, packtrain.model.attention), all of which
    isolate packed documents given `model_inputs(batch, backend)`.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from packtrain.model.attention import HF_NAMES, register_attention_backends

    register_attention_backends()

    model_dir = check_model_dir(model_dir)
    from transformers import AutoConfig

    from packtrain.model.families import check_attention

    try:
        hf_cfg = AutoConfig.from_pretrained(str(model_dir))
    except (OSError, ValueError, KeyError) as e:
        raise InputDataError(f"model directory {model_dir} cannot be loaded: {e}") from None
    # refuse a family × backend pair that cannot isolate documents (or honour the family's attention) by name
    check_attention(hf_cfg, attention, training=False, where=f"model directory {model_dir}", key="evaluate.attention")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        # fp32 master weights; `precision` autocasts the forward (bf16 weights would bias the loss).
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation=HF_NAMES[attention],
                                                     dtype=torch.float32)
    except (OSError, ValueError, KeyError) as e:
        raise InputDataError(f"model directory {model_dir} cannot be loaded: {e}") from None
    return model.to(device).eval(), tokenizer
