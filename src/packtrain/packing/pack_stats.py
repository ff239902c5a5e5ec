"""What packing measured (`PackStats`, per split `SplitPackStats`), in a module of its own with no heavy import:
the pack stage's typed result (packtrain.stages.results.PackResult) is these fields plus the stage's own, by
inheritance — one field list, not two."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar


@dataclass
class SplitPackStats:
    """What packing did to one split. fill = real tokens / (n_packs × budget)."""

    n_docs: int                 # documents in the split, before dropping short ones
    dropped_short_docs: int     # documents with < min_doc_tokens tokens (not packed)
    n_tokens: int               # real tokens packed
    n_packs: int
    lower_bound_packs: int      # max(⌈Σ/B⌉, #docs > B/2): no packer needs fewer packs
    l2_bound_packs: int         # Martello-Toth L2, a tighter lower bound
    fill: float
    fill_vs_bound: float        # l2_bound_packs / n_packs: 1.0 = provably optimal
    padding_tokens: int         # n_packs × budget − n_tokens
    padding_fraction: float
    docs_per_pack_mean: float   # segments per pack (a split document counts once per chunk)
    docs_per_pack_max: int
    truncated_tokens: int       # dropped by overlong="truncate"
    split_docs: int             # documents longer than the budget cut into chunks
    split_tokens: int           # tokens of those documents
    seconds_plan: float         # pack_lengths only
    seconds: float              # plan + gather + write
    loss_tokens: int | None = None   # packed tokens with loss mask 1 (None: no mask, every token is learned)


@dataclass
class PackStats:
    """What packing did, per split; the pack stage's record (packtrain.stages.results.PackResult) holds these
    fields, by inheritance, plus the stage's own. `to_dict()` adds DERIVED_KEYS at the top level."""

    budget: int
    strategy: str
    overlong: str
    seed: int
    train: SplitPackStats
    eval: SplitPackStats
    seconds: float

    DERIVED_KEYS: ClassVar[tuple[str, ...]] = ("fill", "padding_fraction", "n_packs", "fill_vs_bound")
    """Top-level copies of the train split's numbers (the gate and the dashboards read them): written by
    `to_dict()`, not fields (`self.train.fill` holds it); a record read back recomputes them from `train`."""

    def __post_init__(self) -> None:
        for name in ("train", "eval"):   # a record read back holds its splits as dicts
            split = getattr(self, name)
            if isinstance(split, dict):
                setattr(self, name, SplitPackStats(**split))

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update({k: getattr(self.train, k) for k in self.DERIVED_KEYS})
        return d
