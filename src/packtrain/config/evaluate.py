"""Configs of the evaluate and register stages."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from packtrain.config.base import Float, PositiveInt, Seed, StrictModel, Text
from packtrain.config.messages import Allowed


class EvalConfig(StrictModel):
    """Held-out loss/perplexity on packed batches and greedy generation samples."""

    rows: PositiveInt = 4
    """Packs per evaluation micro-batch: one forward sees rows × pack.budget tokens."""
    max_batches: PositiveInt | None = None
    """Cap on evaluation micro-batches (smoke runs). None → exactly one epoch over the eval packs, so every
    held-out document counts; a cap is recorded in eval_result.json (`complete: false`)."""
    prompts: list[Text] = ["def ", "import ", "The "]
    """Fixed prompts of the generation samples (samples.json); the same prompts every run, so runs compare."""
    sample_tokens: PositiveInt = 32
    """New tokens generated greedily per prompt."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Autocast dtype of the forward; the loss itself is always accumulated in fp64."""
    attention: Literal["auto", "sdpa", "eager", "flex", "varlen"] = "auto"
    """Isolated attention backend (packtrain.model.attention) of the evaluate stage and of the warm start's
    step-0 loss; auto → varlen (CUDA, bf16/fp16), else flex on CUDA, else sdpa, else eager: the first the
    model's family allows (Gemma2 on the CPU: eager). Generation samples use sdpa (eager where the family
    refuses sdpa)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto → cuda when available, else cpu."""
    seed: Seed = 0
    """Order of the eval packs (the loss sum does not depend on it)."""


class RegisterConfig(StrictModel):
    """Model Registry name and the champion/challenger rule."""

    model_name: Annotated[str, Allowed("a name of letters, digits, '.', '_', '-' that starts with a letter "
                                       "or digit")] = Field("packtrain-lm", pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
    """Registered model name: letters, digits, '.', '_', '-'."""
    metric: Literal["eval_loss", "perplexity"] = "eval_loss"
    """Lower is better."""
    margin: Float = Field(0.0, ge=0, lt=1)
    """The challenger must beat the champion's metric by this relative margin to take the alias:
    new < champion · (1 − margin)."""
    flavor: Literal["auto", "transformers", "pytorch"] = "auto"
    """auto → the transformers flavor, falling back to the pytorch flavor (with the tokenizer as extra files)
    if the transformers flavor raises on the installed versions; the reason is tagged on the version."""
    pip_requirements: list[Text] | None = None
    """Requirements written with the model. None → the installed torch/transformers/tokenizers/safetensors
    pinned without local suffixes (torch==2.13.0, not 2.13.0+cpu): MLflow's inference is slow and wrong."""
    gate: bool | None = None
    """Gate before the champion alias moves: a version that beats the champion's metric takes the alias only
    if its training run passes `packtrain gate` against the champion's (docs/gate.md); else it stays
    challenger and the reason names the regressed metrics. None → on for scheduled runs (the Airflow DAG,
    packtrain.pipeline.retrain), off for `packtrain run` / `packtrain register`."""
    gate_rules: Text | None = None
    """Rules file (YAML/JSON) of that gate; None → the built-in noise-aware rules of the runs' device kind."""
