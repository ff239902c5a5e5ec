"""The micro-batch shape a run trains with, decided in one place: `choose_shape`.

`packtrain train` (packtrain.train.parts), `packtrain plan` and the CI gate (bench/ci_gate.py) all call it, so
the shape the planner plans is the shape training runs. One word, one meaning:

    budget      tokens per pack = tokens per row of a micro-batch. Fixed by the pack stage (pack.budget) and
                read back from the packs on disk (meta.json); never chosen or overridden here.
    rows        packs per micro-batch (train.rows): an integer, or 'auto' → the most rows whose predicted peak
                ≤ plan.target_fraction × device memory (≤ plan.max_rows).
    grad_accum  micro-batches per optimizer step: train.grad_accum; with rows 'auto' and plan.global_batch_tokens
                G set, the smallest grad_accum whose rows = ⌈G / (budget × gpus × grad_accum)⌉ fits.
    gpus        data-parallel processes (train.gpus; training passes its world size).

    tokens per micro-batch = rows × budget;  tokens per step = rows × budget × grad_accum × gpus.

No memory term depends on the documents inside the packs: sdpa/eager materialize (rows, 1, budget, budget)
masks whatever the segment lengths, varlen/flex nothing quadratic; so a plan is exact for any packs of that
budget. Unset values fall back here and nowhere else: gpus → train.gpus, device → cpu when train.device is cpu
(else cuda), attention → the backend train.attention resolves to on that device, vocabulary → the packs' (else
plan.vocab_size), device memory → plan.device_memory_gib (else the CUDA device, else 80 GiB).

Example (350m-h200: packs of 2048 tokens, vocab 32768, an 80 GiB device, target 0.85 → 68.0 GiB):

    choose_shape(cfg.model, cfg.train, 2048, cfg.plan, 32768, device_memory_gib=80)
      train.rows=8                      → Shape(budget=2048, rows=8, grad_accum=1, source='train.rows')
                                          16,384 tokens per step (planned peak 19.5 GiB)
      train.rows=auto                   → Shape(budget=2048, rows=36, grad_accum=1, source='auto')
                                          73,728 tokens per step, plan.peak_gib 66.8 (37 rows would not fit)
      train.rows=auto, G=262,144 tokens → Shape(budget=2048, rows=32, grad_accum=4, source='auto')
                                          262,144 tokens per step: 128 packs; 64 × 2 and 43 × 3 do not fit
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packtrain.errors import ConfigError
from packtrain.planner.plan import MemoryPlan, plan_memory, resolve_device_memory_gib, suggest_changes

if TYPE_CHECKING:
    from packtrain.config import ModelConfig, PlanConfig, TrainConfig


@dataclass(frozen=True)
class Shape:
    """The micro-batch shape a run trains with: `rows` packs of `budget` tokens each, `grad_accum` micro-batches
    per optimizer step on each of `gpus` processes."""

    budget: int                       # tokens per pack (the packs' own, fixed by the pack stage)
    rows: int                         # packs per micro-batch
    grad_accum: int                   # micro-batches per optimizer step
    source: str = "train.rows"        # 'train.rows' (the integer given) or 'auto' (the planner chose rows)
    plan: MemoryPlan | None = None    # the planner's MemoryPlan of this very shape when source == 'auto'
    gpus: int = 1                     # data-parallel processes

    @property
    def tokens(self) -> int:
        """rows × budget: tokens per micro-batch."""
        return self.budget * self.rows

    @property
    def tokens_per_step(self) -> int:
        """rows × budget × grad_accum × gpus: slot tokens per optimizer step over all processes."""
        return self.tokens * self.grad_accum * self.gpus

    def to_dict(self) -> dict:
        return {"budget": self.budget, "rows": self.rows, "grad_accum": self.grad_accum, "gpus": self.gpus,
                "rows_source": self.source, "tokens_per_micro_batch": self.tokens,
                "tokens_per_step": self.tokens_per_step}


def choose_shape(model_cfg: ModelConfig, train_cfg: TrainConfig, budget: int, plan_cfg: PlanConfig | None = None,
                 vocab_size: int | None = None, *, gpus: int | None = None, device: Any = None,
                 attention: str | None = None, device_memory_gib: float | None = None) -> Shape:
    """The shape for packs of `budget` tokens (see the module docstring for every fallback).

    budget: the packs' budget (train: the store's meta.json; plan: the store's, else pack.budget).
    gpus: the world size (default train.gpus). device: the torch device or 'cpu'/'cuda' training runs on.

    >>> from packtrain.config import ModelConfig, TrainConfig
    >>> s = choose_shape(ModelConfig(), TrainConfig(rows=4, grad_accum=2), 512)
    >>> (s.budget, s.rows, s.grad_accum, s.gpus, s.source, s.tokens_per_step)
    (512, 4, 2, 1, 'train.rows', 4096)
    """
    from packtrain.config import PlanConfig

    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 2:
        raise ConfigError(f"budget {budget!r}: the packs' budget must be an integer ≥ 2 tokens per pack")
    plan_cfg = plan_cfg or PlanConfig()
    gpus = int(gpus or train_cfg.gpus)
    if train_cfg.rows != "auto":
        return Shape(budget, int(train_cfg.rows), train_cfg.grad_accum, "train.rows", None, gpus)
    kind = _device_type(device, train_cfg)
    backend = attention or _attention(train_cfg, device)
    rows, ga, plan = choose_rows(model_cfg, train_cfg, budget, plan_cfg, gpus=gpus, device=kind, attention=backend,
                                 vocab_size=vocab_size, device_memory_gib=device_memory_gib)
    return Shape(budget, rows, ga, "auto", plan, gpus)


def plan_shape(model_cfg: ModelConfig, train_cfg: TrainConfig, shape: Shape, plan_cfg: PlanConfig | None = None,
               vocab_size: int | None = None, *, device: Any = None, attention: str | None = None,
               device_memory_gib: float | None = None) -> MemoryPlan:
    """The MemoryPlan of `shape` (the one choose_shape made when it chose rows, else computed for it)."""
    from packtrain.config import PlanConfig

    if shape.plan is not None:
        return shape.plan
    return plan_memory(model_cfg, train_cfg, shape.budget, plan_cfg or PlanConfig(), device_memory_gib,
                       vocab_size=vocab_size, rows=shape.rows, grad_accum=shape.grad_accum, gpus=shape.gpus,
                       device=_device_type(device, train_cfg), attention=attention or _attention(train_cfg, device))


def choose_rows(model_cfg: ModelConfig, train_cfg: TrainConfig, budget: int, plan_cfg: PlanConfig, *, gpus: int,
                device: str, attention: str | None = None, vocab_size: int | None = None,
                device_memory_gib: float | None = None) -> tuple[int, int, MemoryPlan]:
    """(rows, grad_accum, plan) for train.rows=auto: the largest micro-batch of `budget`-token packs that fits.

    Without plan.global_batch_tokens: the most rows ≤ plan.max_rows whose peak fits, grad_accum = train.grad_accum.
    With G: n = max(1, round(G / (budget × gpus))) packs per GPU and step; the smallest grad_accum whose
    rows = ⌈n / grad_accum⌉ (≤ max_rows) fits — exactly G when grad_accum divides n (128 packs: 32 rows × 4).
    grad_accum > 1 keeps the gradients alive during the forward, so each candidate is planned with its own.
    """
    dev_gib = resolve_device_memory_gib(plan_cfg, device_memory_gib)

    def plan_of(rows: int, ga: int) -> MemoryPlan:
        return plan_memory(model_cfg, train_cfg, budget, plan_cfg, dev_gib, vocab_size=vocab_size, rows=rows,
                           grad_accum=ga, gpus=gpus, device=device, attention=attention, suggest=False)

    g = plan_cfg.global_batch_tokens
    if g:
        n = max(1, round(g / (budget * gpus)))
        candidates = [(-(-n // ga), ga) for ga in range(1, n + 1)]
    else:
        candidates = [(rows, train_cfg.grad_accum) for rows in range(plan_cfg.max_rows, 0, -1)]
    smallest = None
    for rows, ga in candidates:              # largest micro-batch first
        if rows > plan_cfg.max_rows:
            continue
        plan = plan_of(rows, ga)
        if plan.fits:
            suggest_changes(plan, model_cfg, train_cfg, plan_cfg, vocab_size, device, attention)
            return rows, ga, plan
        smallest = plan
    one = smallest or plan_of(1, candidates[-1][1])
    suggest_changes(one, model_cfg, train_cfg, plan_cfg, vocab_size, device, attention)
    raise ConfigError(f"train.rows=auto: not even 1 row fits: 1 row × {budget} tokens (the packs' budget) needs "
                      f"{one.peak_gib:.1f} GiB > {one.target_gib:.1f} GiB ({plan_cfg.target_fraction} × "
                      f"{dev_gib:.1f} GiB); {one.suggestion}")


def _device_type(device: Any, train_cfg: TrainConfig) -> str:
    """'cpu' or 'cuda': the device's type when given, else cpu when train.device is cpu, else cuda."""
    if device is not None:
        return "cuda" if str(getattr(device, "type", device)).startswith("cuda") else "cpu"
    return "cpu" if train_cfg.device == "cpu" else "cuda"


def _attention(train_cfg: TrainConfig, device: Any) -> str | None:
    """The backend training resolves train.attention to on `device` (packtrain.model.attention); None without a
    device (`packtrain plan`: the planner's own rule for auto)."""
    if device is None:
        return None
    from packtrain.model.attention import resolve_attention

    return resolve_attention(train_cfg.attention, device, train_cfg.precision)
