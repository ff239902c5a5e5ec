"""Checks of a whole RunConfig that no single section can make, run by `load_run_config` before any stage.

Attention backend × model family. Every stage that runs the model picks an attention backend for the family of
`model.init_from` (packtrain.model.families: Gemma2's soft-cap cannot run on sdpa or varlen):

    use                                          setting              training   auto picks (CPU / CUDA)
    train                                        train.attention      yes        sdpa, eager / varlen, flex, sdpa, eager
    step-0 loss of a warm start, evaluate        evaluate.attention   no         the same order
    register / export (load on the CPU)          none: always auto    no         sdpa, eager

`auto` takes the first backend in that order that runs on the device and that the family allows (eager always
does, so auto never fails: Gemma2 → eager on the CPU, flex on CUDA). An explicit backend the family refuses
is a ConfigError here, naming the setting, the value, the family and the allowed values (exit 2), before
ingest, validate, tokenize or pack has run. Whether a backend runs on the device (varlen needs CUDA) is
checked where the device is known: the train and evaluate stages.

The family is read from a local init directory's config.json (no transformers import); a scratch model is
Llama-style (every backend allowed); a registry source (models:/..., champion) is checked by the stages
once downloaded.
"""

from __future__ import annotations

from typing import Protocol

from packtrain.config.evaluate import EvalConfig
from packtrain.config.train import ModelConfig, TrainConfig


class RunSections(Protocol):
    """The sections of a RunConfig these checks read (a Protocol, so this module sits below the RunConfig that
    calls it: packtrain.config imports it, never the other way round)."""

    @property
    def model(self) -> ModelConfig: ...
    @property
    def train(self) -> TrainConfig: ...
    @property
    def evaluate(self) -> EvalConfig: ...


def attention_uses(cfg: RunSections) -> list[tuple[str, str, bool]]:
    """(setting, value, training) of every use of an attention backend in a run."""
    return [("train.attention", cfg.train.attention, True),
            ("evaluate.attention", cfg.evaluate.attention, False),
            ("register (export load)", "auto", False)]


def check_attention_settings(cfg: RunSections) -> dict[str, list[str]]:
    """{setting: the backends the init model's family allows for that use} ({} when the family is not known
    at load time: scratch, a registry source, no readable config.json); ConfigError for an explicit backend
    the family refuses.

    Gemma2 init directory → {"train.attention": ["eager", "flex"], "evaluate.attention": ["eager", "flex"],
    "register (export load)": ["eager", "flex"]}; `train.attention=sdpa` → ConfigError "model.init_from
    <dir>: family Gemma2 (gemma2) with train.attention=sdpa is refused: ... (allowed for Gemma2: auto, eager,
    flex)".
    """
    from packtrain.model.families import allowed_backends, check_attention
    from packtrain.model.source import init_checkpoint_config, init_from_value

    family_cfg = init_checkpoint_config(cfg.model)
    if family_cfg is None:
        return {}   # unknown architectures are refused by the loader, naming the directory
    where = f"model.init_from {init_from_value(cfg.model)}"
    out = {}
    for key, value, training in attention_uses(cfg):
        try:
            allowed = allowed_backends(family_cfg, training)
        except (TypeError, ValueError, KeyError):
            return {}   # a config.json without the family's fields: the loader refuses it, naming the directory
        if value != "auto":
            check_attention(family_cfg, value, training, where=where, key=key)
        out[key] = allowed
    return out
