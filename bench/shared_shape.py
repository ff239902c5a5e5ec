"""One micro-batch shape for every variant of a comparison: the rows and activation checkpointing at which the
memory planner says ALL of them fit the device at hand (bench fp8: bf16 and the FP8 variants at one shape).

    choose_shared_shape(predict, target_gib, modes, rows)     pure: the first mode (least recompute first) at
                                                              which some rows fit every variant, then the most
                                                              such rows → SharedShape
    planner_predictor(cfgs, budget, vocab, device, gib)       predict(mode, rows) → {variant: predicted peak GiB}
                                                              from packtrain's plan_memory (what `packtrain plan`
                                                              prints as "= predicted peak"), one plan per variant

The rule, for a target T = plan.target_fraction × the device's memory (train.rows=auto's own target):

    for mode in modes (default none → selective → full: least recomputation first):
        rows = the largest r in `rows` (default max_rows … 1) with max over variants of predict(mode, r) ≤ T
        if there is one: that (mode, rows) is the shape
    none at any mode: ConfigError naming the smallest candidate's peaks

So the largest variant binds (bf16 keeps a bf16 copy of every decoder weight that torchao's float8 linears do
not, so bf16 binds against fp8), and recomputation is used only where not even one row fits without it.
Example (3B, 2048-token packs, predicted peaks from the planner, T = 0.85 × 79.2 GiB = 67.3 on an H100 80 GB):
none, 3 rows: bf16 63.7 GiB (binds), fp8 58.2 → 3 rows, no checkpointing; 4 rows would need bf16 69.3 > 67.3
(selective would fit 5 rows, full 8). On an H200 (139.8 GiB → T 118.8): 8 rows without recomputation, bf16 91.4.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from packtrain.errors import ConfigError

MODES = ("none", "selective", "full")
"""train.activation_checkpointing candidates, least recomputation first: none (no recompute), selective (the
element-wise ops between the matrix products recomputed), full (the whole layer's forward recomputed)."""

Predict = Callable[[str, int], dict[str, float]]
"""predict(mode, rows) → {variant: predicted peak GiB} (what must fit the device)."""


@dataclass(frozen=True)
class SharedShape:
    """The shape every variant runs at, and why: the planner's peaks there and one row more."""

    activation_checkpointing: str      # the mode chosen
    rows: int                          # packs per micro-batch
    target_gib: float                  # plan.target_fraction × device memory
    peaks_gib: dict[str, float]        # {variant: predicted peak GiB} at (mode, rows)
    binding: str                       # the variant with the largest predicted peak
    next_rows_peaks_gib: dict[str, float] | None = None   # at rows + 1 under the same mode (None: rows is the cap)
    tried: list[dict] = field(default_factory=list)       # modes before the chosen one, with their 1-row peaks

    def describe(self) -> str:
        """One line for the record and the console: the choice, the binding variant, what one row more needs."""
        more = ""
        if self.next_rows_peaks_gib:
            need = max(self.next_rows_peaks_gib.values())
            more = f"; {self.rows + 1} rows would need {_gib(need)} GiB"
        tried = "".join(f"; {t['mode']}: not even 1 row fits ({_gib(t['peak_gib'])} GiB)" for t in self.tried)
        return (f"{self.rows} rows, activation checkpointing {self.activation_checkpointing}: predicted peaks "
                + ", ".join(f"{v} {_gib(g)}" for v, g in self.peaks_gib.items())
                + f" GiB ≤ target {_gib(self.target_gib)} GiB ({self.binding} binds){more}{tried}")

    def to_dict(self) -> dict:
        return {**asdict(self), "description": self.describe()}


def _gib(x: float) -> str:
    """63.72 → "63.7"; a CPU smoke's 0.00932 → "0.00932"."""
    return f"{x:.1f}" if x >= 1 else f"{x:.3g}"


def choose_shared_shape(predict: Predict, target_gib: float, modes: Sequence[str] = MODES,
                        rows: Sequence[int] = tuple(range(8, 0, -1))) -> SharedShape:
    """The shape of the module docstring's rule. `rows`: the candidates, largest first (an explicit --rows N: (N,)).

    >>> peaks = lambda mode, r: {"bf16": 20.0 * r / (2 if mode == "full" else 1), "fp8": 16.0 * r}
    >>> s = choose_shared_shape(peaks, 67.0, rows=(8, 7, 6, 5, 4, 3, 2, 1))
    >>> (s.activation_checkpointing, s.rows, s.binding, s.next_rows_peaks_gib)
    ('none', 3, 'bf16', {'bf16': 80.0, 'fp8': 64.0})
    """
    rows = sorted({int(r) for r in rows}, reverse=True)
    if not modes or not rows or rows[-1] < 1:
        raise ConfigError(f"choose_shared_shape: modes {list(modes)} and rows {rows} must be non-empty, rows ≥ 1")
    tried: list[dict] = []
    for mode in modes:
        smallest: dict[str, float] = {}
        for i, r in enumerate(rows):
            peaks = predict(mode, r)
            smallest = peaks
            if max(peaks.values()) <= target_gib:
                nxt = predict(mode, r + 1) if i > 0 else None
                return SharedShape(mode, r, target_gib, dict(peaks), max(peaks, key=peaks.__getitem__), nxt,
                                   tried)
        worst = max(smallest, key=smallest.__getitem__)
        tried.append({"mode": mode, "rows": rows[-1], "peak_gib": smallest[worst], "binding": worst})
    last = tried[-1]
    raise ConfigError(f"no shape fits every variant under the target {_gib(target_gib)} GiB: at {last['rows']} "
                      f"row(s) with activation checkpointing {last['mode']}, {last['binding']} needs "
                      f"{_gib(last['peak_gib'])} GiB (tried {', '.join(t['mode'] for t in tried)}); use shorter "
                      "packs (--budget) or a device with more memory")


def planner_predictor(cfgs: dict, budget: int, vocab: int, device: str, device_memory_gib: float) -> Predict:
    """predict(mode, rows) for the RunConfigs `cfgs` ({variant: cfg}): each variant's plan_memory with
    train.activation_checkpointing=mode and `rows` packs of `budget` tokens, on `device` ('cuda' or 'cpu') with
    `device_memory_gib` — the planner's predicted peak (allocated × (1 + allocator overhead) + CUDA context)."""
    from packtrain.planner import plan_memory

    def predict(mode: str, rows: int) -> dict[str, float]:
        return {v: plan_memory(c.model, c.train.model_copy(update={"activation_checkpointing": mode}), budget,
                               c.plan, device_memory_gib, vocab_size=vocab, rows=rows, device=device,
                               suggest=False).peak_gib
                for v, c in cfgs.items()}

    return predict
