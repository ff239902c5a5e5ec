"""Typed stage results: what each stage runner returns and writes as its stats JSON, with its lineage.

    stage     result           extends (packtrain.…)                      file                   lineage.input_md5
    ingest    IngestResult     data.ingest_stats.IngestStats              ingest_result.json     source
    validate  ValidateResult   data.validation_summary.ValidationSummary  validate_result.json   documents
    tokenize  TokenizeResult   data.tokenize_stats.TokenizeStats          tokenize_result.json   documents (+ tokenizer)
    pack      PackResult       packing.pack_stats.PackStats               pack_result.json       tokens
    train     TrainResult      train.loop.TrainStats                      train_result.json      packs, tokens
    evaluate  EvaluateResult   evaluate.perplexity.EvalStats              evaluate_result.json   model, packs
    register  RegisterResult   registry.outcome.RegisterOutcome           register_result.json   model, evaluation

A stage result extends the library's result class (its fields, inherited, then the stage's own, then "lineage"):
one field list, not two; the library's MEMORY_ONLY fields (packtrain.record_fields) are not written. Every record
is named `<stage>_result.json` (`FILE`, set from `STAGE`); a reader takes that name only.

Every result holds the same `Lineage` part, written as the JSON key "lineage":

    {"git_sha": "4cff369e...", "code_version": "0.1.0+g4cff369e1a2b",
     "input_md5": {"packs": "9a2b....dir", "tokens": "bbe02f94..."},
     "data_version": "894677b4....dir", "tokenizer_hash": "sha256:5f1c..."}

`input_md5[name]` is the DVC md5 (packtrain.versioning.data_md5) of the artifact `name` as this stage read
it: for documents the table file, for tokens `tokens.bin` (equal ⇔ same ids), for packs the split directory
read, for a model its directory, for an evaluation its evaluate_result.json. `data_version` is the DVC md5 of the
source data the chain started from: ingest's input, carried by every later stage from its upstream result
file; a chain that starts later (documents passed by hand, no ingest_result.json beside them) starts its data
version at that stage's first input. `tokenizer_hash` (packtrain.data.tokenizer_files) is None before tokenize.

    r = PackResult.from_file(Path("data/pack/pack_result.json"))    # InputDataError naming file + key if off
    r.lineage.data_version, r.train.fill
    as_dict(r) == r.to_dict() == json.loads(Path("data/pack/pack_result.json").read_text())

`from_dict` refuses a key the class does not declare and a missing required key (InputDataError, exit 3,
naming the file and the key), so a reader indexes one declared key instead of guessing among aliases.
Nested sections (train's throughput/memory) stay plain dicts owned by the library that produces them; pack's
splits are its SplitPackStats.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from packtrain.data.ingest_stats import IngestStats
from packtrain.data.tokenize_stats import TokenizeStats
from packtrain.data.validation_summary import ValidationSummary
from packtrain.errors import InputDataError
from packtrain.evaluate.perplexity import EvalStats
from packtrain.packing.pack_stats import PackStats
from packtrain.record_fields import record_dict, recorded_fields
from packtrain.registry.outcome import RegisterOutcome
from packtrain.stages.lineage import Lineage, _check_keys
from packtrain.train.loop import TrainStats

R = TypeVar("R", bound="StageResult")


@dataclass(kw_only=True)
class StageResult:
    """Base of every stage result: the declared fields plus `lineage`; JSON in and out."""

    STAGE: ClassVar[str] = ""
    FILE: ClassVar[str] = ""                  # "<STAGE>_result.json", set for every subclass
    lineage: Lineage

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.FILE = f"{cls.STAGE}_result.json"

    def to_dict(self) -> dict[str, Any]:
        """The stats JSON: as the library's `to_dict()` writes its result (nested stats as dicts, MEMORY_ONLY
        fields left out, its DERIVED_KEYS added), the stage's own fields after, lineage last."""
        lib = getattr(super(), "to_dict", None)   # the library class this result extends, if it has one
        d = lib() if lib is not None else record_dict(self)
        d.pop("lineage", None)
        d["lineage"] = self.lineage.to_dict()
        return json.loads(json.dumps(d, default=str))   # Paths → str, tuples → lists: exactly what is written

    @classmethod
    def record_keys(cls) -> list[str]:
        """The top-level keys of the record: the recorded fields, then the library's DERIVED_KEYS."""
        return [f.name for f in recorded_fields(cls)] + list(getattr(cls, "DERIVED_KEYS", ()))

    @classmethod
    def from_dict(cls: type[R], d: dict, source: str | None = None) -> R:
        """Build from the JSON the stage wrote; `source` (default: the file name) names it in errors. The
        library's DERIVED_KEYS are checked present-or-absent only (recomputed from the fields)."""
        source = source or cls.FILE
        _check_keys(cls, d, source)
        derived = getattr(cls, "DERIVED_KEYS", ())
        kwargs = {k: v for k, v in d.items() if k not in derived}
        try:
            return cls(**{**kwargs, "lineage": Lineage.from_dict(d["lineage"], source)})
        except TypeError as e:   # a nested section with keys its class does not declare (pack's splits)
            raise InputDataError(f"{source}: {e} for {cls.__name__}") from None

    @classmethod
    def from_file(cls: type[R], path: str | Path) -> R:
        """Read `path` (the stage's stats file); missing file → MissingDataError, bad JSON/keys → InputDataError."""
        from packtrain.errors import MissingDataError

        path = Path(path)
        if not path.is_file():
            raise MissingDataError(f"{path} does not exist: run `packtrain {cls.STAGE}` first (it writes {cls.FILE})")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputDataError(f"{path}: not valid JSON: {e}") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dir(cls: type[R], out_dir: str | Path) -> R:
        """The result a stage wrote into its output directory."""
        return cls.from_file(Path(out_dir) / cls.FILE)

    @classmethod
    def read_optional(cls: type[R], out_dir: str | Path | None) -> R | None:
        """Like from_dir, None when there is no such file (an upstream stage that did not run here)."""
        if out_dir is None or not (Path(out_dir) / cls.FILE).is_file():
            return None
        return cls.from_dir(out_dir)

    def write(self, out_dir: str | Path) -> Path:
        """Write `to_dict()` to out_dir/FILE (atomic) and return the path."""
        from packtrain.publish import write_json

        path = Path(out_dir) / self.FILE
        write_json(path, self.to_dict())
        return path


@dataclass(kw_only=True)
class IngestResult(StageResult, IngestStats):
    """packtrain.data.ingest_stats.IngestStats (its fields, inherited) + the md5 of what was read and written."""

    STAGE: ClassVar[str] = "ingest"
    input_md5_of: str                         # what lineage.input_md5["source"] covers: source | files read
    output_md5: str                           # DVC md5 of documents.parquet (validate/tokenize read it)


@dataclass(kw_only=True)
class ValidateResult(StageResult, ValidationSummary):
    """packtrain.data.validation_summary.ValidationSummary (its fields, inherited) + the counts of the GX suite's
    expectations (the full report is report.json)."""

    STAGE: ClassVar[str] = "validate"
    expectations: int
    passed: int
    unexpected: dict[str, int]                # expectation → unexpected count
    duplicate_ratio: float | None = None


@dataclass(kw_only=True)
class TokenizeResult(StageResult, TokenizeStats):
    """packtrain.data.tokenize_stats.TokenizeStats (its fields, inherited) + the documents read, the md5 of the
    ids written and the contamination policy's drops."""

    STAGE: ClassVar[str] = "tokenize"
    input: str
    tokens_md5: str                           # DVC md5 of tokens.bin: equal across runs ⇔ same ids
    contamination_dropped: list[int] = dataclasses.field(default_factory=list)
                                              # doc_ids left out (validate.contamination.policy drop)


@dataclass(kw_only=True)
class PackResult(StageResult, PackStats):
    """packtrain.packing.pack_stats.PackStats (its fields, inherited: `train`/`eval` are SplitPackStats, written
    as dicts, with the top-level copies fill, padding_fraction, n_packs, fill_vs_bound) + what was read and
    written."""

    STAGE: ClassVar[str] = "pack"
    input: str
    output: str


@dataclass(kw_only=True)
class TrainResult(StageResult, TrainStats):
    """packtrain.train.loop.TrainStats (its fields, inherited) + the warm start and the packs trained on.

    Sections: throughput (packtrain.telemetry.meter: real_tokens_per_s, useful_mfu, ...), memory
    (packtrain.telemetry.memory: peak_alloc_gib, cpu_peak_rss_gib, ...), system (sampler summary), setup
    (attention, engine, rows, budget, world_size, resumed_from, ...), timings, params.
    """

    STAGE: ClassVar[str] = "train"
    init_eval_loss: float | None = None       # held-out loss of the initial weights (warm start), else None
    init: dict[str, Any] | None = None        # the resolved model.init_from, tokenizer check, step-0 eval
    packing_fill: float | None = None         # train fill of the packs trained on (their pack_result.json)
    recipe: dict[str, Any] | None = None      # what made these weights: config_hash, train_seed, init_from
                                              # (packtrain.evaluate.recipe_identity)

    @property
    def peak_memory_gib(self) -> float | None:
        """CUDA peak allocated; on a CPU run (CUDA numbers are 0.0) the process' peak RSS; None if neither."""
        cuda = self.memory.get("peak_alloc_gib")
        if cuda:
            return float(cuda)
        rss = self.memory.get("cpu_peak_rss_gib")
        return float(rss) if rss else None


@dataclass(kw_only=True)
class EvaluateResult(StageResult, EvalStats):
    """packtrain.evaluate.perplexity.EvalStats (its fields, inherited; the samples are samples.json)."""

    STAGE: ClassVar[str] = "evaluate"


@dataclass(kw_only=True)
class RegisterResult(StageResult, RegisterOutcome):
    """packtrain.registry.outcome.RegisterOutcome (its fields, inherited): the registered version and the alias
    decision."""

    STAGE: ClassVar[str] = "register"


RESULTS: dict[str, type[StageResult]] = {c.STAGE: c for c in (
    IngestResult, ValidateResult, TokenizeResult, PackResult, TrainResult, EvaluateResult, RegisterResult)}
"""Stage name → its result class."""


def from_library(cls: type[R], lib: dict, lineage: Lineage, source: str, **extra: Any) -> R:
    """A stage result from a library stats dict (`stats.to_dict()`) plus the runner's own fields.
    A key the stage result does not declare is a programming error that names the class and the key."""
    return cls.from_dict({**lib, **extra, "lineage": lineage.to_dict()}, source=f"{source} (stats of the "
                                                                              f"{cls.STAGE} stage)")


def as_dict(result: StageResult | dict | None) -> dict:
    """The JSON-able dict of a result at a boundary (KFP metadata, stage cache, summary): a StageResult →
    `to_dict()`, a dict → a shallow copy, None → {}."""
    if result is None:
        return {}
    if isinstance(result, StageResult):
        return result.to_dict()
    if isinstance(result, dict):
        return dict(result)
    raise TypeError(f"as_dict: expected a StageResult or dict, got {type(result).__name__}")
