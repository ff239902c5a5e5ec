"""Configs of the evaluate and register stages."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from packtrain.config.base import StrictModel


class EvalConfig(StrictModel):
    rows: int = Field(4, ge=1)
    max_batches: int | None = Field(None, ge=1)
    prompts: list[str] = ["def ", "import ", "The "]
    sample_tokens: int = Field(32, ge=1)
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"


class RegisterConfig(StrictModel):
    model_name: str = "packtrain-lm"
    metric: Literal["eval_loss", "perplexity"] = "eval_loss"
    """Lower is better."""
    margin: float = Field(0.0, ge=0)
    """The challenger must beat the champion's metric by this relative margin to take the alias."""
    flavor: Literal["auto", "transformers", "pytorch"] = "auto"
