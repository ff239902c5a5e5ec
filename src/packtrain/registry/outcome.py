"""`RegisterOutcome`: what applying a registration op did (packtrain.registry.apply.apply_registration, or
packtrain.registry.op.deferred_result when the store was unreachable), in a module of its own with no heavy
import: the register stage's record (packtrain.stages.results.RegisterResult) is these fields plus the lineage,
by inheritance — one field list, not two."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RegisterOutcome:
    """What applying a registration op did (or, deferred, will do): the register stage's record
    (packtrain.stages.results.RegisterResult) holds these fields, by inheritance, plus the lineage."""

    model_name: str
    version: str | None                   # the new version, e.g. "4" (None: deferred)
    model_uri: str | None                 # models:/<name>/<version>
    flavor: str                           # files | transformers | pytorch (register.flavor; auto → one of the last two)
    flavor_note: str                      # why this flavor
    decision: str                         # champion | challenger | deferred (store down: buffered)
    reason: str                           # one line: the suites that decided, with Δ and CI (or both versions)
    metric: str                           # "bits_per_byte:<primary suite>" (paired), else register.metric
    candidate_value: float                # the challenger's value of `metric`
    champion_value: float | None          # the champion's, on the same documents (None: no champion scored)
    previous_champion_version: str | None
    champion_version: str | None          # who holds the champion alias now
    margin: float                         # register.promotion.delta (bits/byte)
    threshold: float | None               # −delta: the primary suite's upper CI bound of Δ must be below it
    version_tags: dict[str, str] = field(default_factory=dict)
    lineage_origin: dict[str, str] = field(default_factory=dict)
    missing_tags: list[str] = field(default_factory=list)
    log_model_s: float = 0.0
    register_s: float = 0.0
    run_id: str | None = None
    tracking_uri: str = ""                # redacted: https://user:***@host
    op_id: str | None = None              # the registration op (tag packtrain.register_op)
    buffer: str | None = None             # deferred: the buffer directory holding the op and a model copy
    existing: bool = False                # an earlier version holds these weights (same model_md5 and lineage):
                                          # no new version, `version` is that one (version_of_content)

    def to_dict(self) -> dict:
        return asdict(self)
