"""Which fields of a result dataclass its JSON record holds: every field but those declared
`field(..., metadata=MEMORY_ONLY)` — kept for the caller in memory (a training run's per-step history, the files
ingest read), never written. A library result's `to_dict()` and the stage result that extends it
(packtrain.stages.results) both leave them out, so the two write the same keys from one field list.

    @dataclass
    class TrainStats:
        steps: int
        history: list[dict] = field(default_factory=list, metadata=MEMORY_ONLY)
    record_dict(TrainStats(3, [{"loss": 2.1}]))   # {'steps': 3}
"""

from __future__ import annotations

import dataclasses
from typing import Any

MEMORY_ONLY = {"record": False}
"""Field metadata: not part of the record (module doc)."""


def recorded(f: dataclasses.Field) -> bool:
    """True for a field the JSON record holds."""
    return f.metadata.get("record", True)


def recorded_fields(cls_or_obj: Any) -> list[dataclasses.Field]:
    """The fields of a dataclass (class or instance) its record holds, in declaration order."""
    return [f for f in dataclasses.fields(cls_or_obj) if recorded(f)]


def record_dict(obj: Any) -> dict[str, Any]:
    """`dataclasses.asdict(obj)` without the MEMORY_ONLY fields (nested dataclasses as dicts)."""
    d = dataclasses.asdict(obj)
    for f in dataclasses.fields(obj):
        if not recorded(f):
            d.pop(f.name)
    return d
