"""Config of the pack stage."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from packtrain.config.base import Int, PositiveInt, Seed, StrictModel


class PackConfig(StrictModel):
    """How documents are bin-packed into fixed token budgets."""

    budget: Int = Field(2048, ge=2)
    """Tokens per pack (= one row of a micro-batch). The one meaning of "budget" in packtrain: train reads it
    back from the packs on disk and trains train.rows of them per micro-batch (packtrain.planner.choose_shape)."""
    strategy: Literal["bfd", "mbs", "ffd", "sequential"] = "bfd"
    """bfd: best-fit-decreasing (O(log L) search over remaining space) + exact-fill completion of the gaps by
    the short documents; where that is above the L2 bound, the fewer packs of it, mbs and plain BFD
    (≥ 99.99% of the L2 bound, or at the LP bound, on the benchmark sets); mbs: minimum bin slack + a repair
    pass alone; ffd: first-fit-decreasing; sequential: in order (next fit). docs/packing.md has the measured
    fill and speed."""
    window: PositiveInt = 200_000
    """Documents per streaming window that bfd/mbs/ffd sort and pack together; up to window/4 documents
    of a window's packs (those with free space, then full packs of short documents) are reopened in the next
    one (≥ 100k keeps fill ≥ 99.9% of the bound)."""
    overlong: Literal["split", "truncate"] = "split"
    """Documents longer than the budget: split into continuation chunks, or truncate (dropped tokens counted)."""
    chunk_positions: Literal["restart", "continue"] = "restart"
    """Position ids of the chunks of a split document: restart (every chunk starts at 0: an independent
    document, as every context does at inference) or continue (chunk k starts at its offset in the document).
    Recorded in the packs' meta.json; docs/long-context.md has the policy and why restart is the default."""
    seed: Seed = 0
    """Shuffles the order of packs (not their content); packing is deterministic for a seed."""
    min_doc_tokens: PositiveInt = 1
    """Documents shorter than this (e.g. only an EOS) are dropped and counted."""
