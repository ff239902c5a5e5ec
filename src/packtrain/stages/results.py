"""Typed stage results: what each stage runner returns and writes as its stats JSON, with its lineage.

    stage     result            file (in the stage's output dir)   lineage.input_md5 keys
    ingest    IngestResult      ingest_stats.json                   source
    validate  ValidateResult    validate_stats.json                 documents
    tokenize  TokenizeResult    stats.json                          documents (+ tokenizer when given)
    pack      PackResult        pack_stats.json                     tokens
    train     TrainResult       train_result.json                   packs, tokens
    evaluate  EvaluateResult    eval_result.json                    model, packs
    register  RegisterResult    register_result.json                model, evaluation

Every result holds the same `Lineage` part, written as the JSON key "lineage":

    {"git_sha": "4cff369e...", "code_version": "0.1.0+g4cff369e1a2b",
     "input_md5": {"packs": "9a2b....dir", "tokens": "bbe02f94..."},
     "data_version": "894677b4....dir", "tokenizer_hash": "sha256:5f1c..."}

`input_md5[name]` is the DVC md5 (packtrain.versioning.data_md5) of the artifact `name` as this stage read
it: for documents the table file, for tokens `tokens.bin` (equal ⇔ same ids), for packs the split directory
read, for a model its directory, for an evaluation its eval_result.json. `data_version` is the DVC md5 of the
source data the chain started from: ingest's input, carried by every later stage from its upstream result
file; a chain that starts later (documents passed by hand, no ingest_stats.json beside them) starts its data
version at that stage's first input. `tokenizer_hash` (packtrain.data.tokenizer_files) is None before tokenize.

    r = PackResult.from_file(Path("data/pack/pack_stats.json"))    # InputDataError naming file + key if off
    r.lineage.data_version, r.train["fill"]
    as_dict(r) == r.to_dict() == json.loads(Path("data/pack/pack_stats.json").read_text())

`from_dict` refuses a key the class does not declare and a missing required key (InputDataError, exit 3,
naming the file and the key), so a reader indexes one declared key instead of guessing among aliases.
Nested sections (pack's per-split stats, train's throughput/memory) stay plain dicts owned by the library
that produces them; the top-level keys are fixed here.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from packtrain.data.tokenize_stats import TokenizeStats
from packtrain.errors import InputDataError
from packtrain.stages.lineage import Lineage, _check_keys

R = TypeVar("R", bound="StageResult")


@dataclass(kw_only=True)
class StageResult:
    """Base of every stage result: the declared fields plus `lineage`; JSON in and out."""

    STAGE: ClassVar[str] = ""
    FILE: ClassVar[str] = ""
    lineage: Lineage

    def to_dict(self) -> dict[str, Any]:
        """The stats JSON, keys in declaration order (lineage last)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "lineage"}
        d["lineage"] = self.lineage.to_dict()
        return json.loads(json.dumps(d, default=str))   # Paths → str, tuples → lists: exactly what is written

    @classmethod
    def from_dict(cls: type[R], d: dict, source: str | None = None) -> R:
        """Build from the JSON the stage wrote; `source` (default: the file name) names it in errors."""
        source = source or cls.FILE
        _check_keys(cls, d, source)
        return cls(**{**d, "lineage": Lineage.from_dict(d["lineage"], source)})

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
class IngestResult(StageResult):
    """packtrain.data.ingest.IngestStats + the md5 of what was read and written."""

    STAGE: ClassVar[str] = "ingest"
    FILE: ClassVar[str] = "ingest_stats.json"
    documents: int
    chars: int
    bytes_utf8: int
    files: int
    source: str
    source_kind: str                          # default | txt | jsonl | parquet | folder
    output: str                               # <out>/documents.parquet
    files_by_type: dict[str, int]
    skipped_files: list[str]
    skipped_entries: list[dict]
    linked_folders: list[dict]
    length_chars: dict[str, float]            # min/p50/p90/p99/max/mean characters per document
    stopped_at_max_docs: bool
    seconds: float
    default_corpus: dict | None
    input_md5_of: str                         # what lineage.input_md5["source"] covers: source | files read
    output_md5: str                           # DVC md5 of documents.parquet (validate/tokenize read it)
    records_by_format: dict[str, int] = dataclasses.field(default_factory=dict)   # chat/prompt sources: docs per format
    records_skipped: int = 0                  # documents dropped by ingest.on_bad_record=skip
    skipped_records: list[dict] = dataclasses.field(default_factory=list)   # [{"source", "reason"}] of each


@dataclass(kw_only=True)
class ValidateResult(StageResult):
    """The GX suite's outcome on the documents table (the full report is report.json)."""

    STAGE: ClassVar[str] = "validate"
    FILE: ClassVar[str] = "validate_stats.json"
    success: bool
    documents: int
    expectations: int
    passed: int
    failed: list[str]                         # names of failed expectations
    report: str                               # path of report.json
    data_docs: str | None                     # Data Docs index.html (None: GX built none)
    input: str                                # the documents table read
    unexpected: dict[str, int]                # expectation → unexpected count
    duplicate_ratio: float | None = None
    contamination: dict[str, Any] | None = None   # packtrain.data.contamination.check_table (+ "dropped"
                                              # doc_ids under policy drop); None: check off


@dataclass(kw_only=True)
class TokenizeResult(StageResult, TokenizeStats):
    """packtrain.data.tokenize_stats.TokenizeStats (its fields, inherited) + the documents read, the md5 of the
    ids written and the contamination policy's drops."""

    STAGE: ClassVar[str] = "tokenize"
    FILE: ClassVar[str] = "stats.json"
    input: str
    tokens_md5: str                           # DVC md5 of tokens.bin: equal across runs ⇔ same ids
    contamination_dropped: list[int] = dataclasses.field(default_factory=list)
                                              # doc_ids left out (validate.contamination.policy drop)


@dataclass(kw_only=True)
class PackResult(StageResult):
    """packtrain.packing.dataset.PackStats; `train`/`eval` are SplitPackStats dicts (fill, n_packs, ...)."""

    STAGE: ClassVar[str] = "pack"
    FILE: ClassVar[str] = "pack_stats.json"
    budget: int
    strategy: str
    overlong: str
    seed: int
    train: dict[str, Any]
    eval: dict[str, Any]
    seconds: float
    fill: float                               # = train["fill"] (the gate's and dashboards' top-level copy)
    padding_fraction: float                   # = train["padding_fraction"]
    n_packs: int                              # = train["n_packs"]
    fill_vs_bound: float                      # = train["fill_vs_bound"]
    input: str
    output: str


@dataclass(kw_only=True)
class TrainResult(StageResult):
    """packtrain.train.loop.TrainResult.to_dict() + the warm start and the packs trained on.

    Sections: throughput (packtrain.telemetry.meter: real_tokens_per_s, useful_mfu, ...), memory
    (packtrain.telemetry.memory: peak_alloc_gib, cpu_peak_rss_gib, ...), system (sampler summary), setup
    (attention, engine, rows, budget, world_size, resumed_from, ...), timings, params.
    """

    STAGE: ClassVar[str] = "train"
    FILE: ClassVar[str] = "train_result.json"
    steps: int
    start_step: int
    tokens: int
    label_tokens: int
    slot_tokens: int
    final_loss: float | None
    loss_curve: list[float]
    lr_curve: list[float]
    skipped_steps: int
    compiles: int | None
    recompiles: int | None
    timings: dict[str, Any]
    throughput: dict[str, Any]
    memory: dict[str, Any]
    system: dict[str, Any]
    violations: list[str]
    telemetry_files: list[str]
    setup: dict[str, Any]
    params: dict[str, Any]
    model_dir: str | None
    checkpoint: str | None
    init_eval_loss: float | None = None       # held-out loss of the initial weights (warm start), else None
    init: dict[str, Any] | None = None        # the resolved model.init_from, tokenizer check, step-0 eval
    packing_fill: float | None = None         # train fill of the packs trained on (their pack_stats.json)
    evaluation: dict[str, Any] | None = None  # train.eval_every_steps: curve, best_step, exported_step, early_stopped
    guard: dict[str, Any] | None = None       # telemetry.guard: steady state, events, fallbacks (docs/guard.md)

    @property
    def peak_memory_gib(self) -> float | None:
        """CUDA peak allocated; on a CPU run (CUDA numbers are 0.0) the process' peak RSS; None if neither."""
        cuda = self.memory.get("peak_alloc_gib")
        if cuda:
            return float(cuda)
        rss = self.memory.get("cpu_peak_rss_gib")
        return float(rss) if rss else None


@dataclass(kw_only=True)
class EvaluateResult(StageResult):
    """packtrain.evaluate.perplexity.EvalResult without the samples (they are samples.json)."""

    STAGE: ClassVar[str] = "evaluate"
    FILE: ClassVar[str] = "eval_result.json"
    eval_loss: float
    perplexity: float
    n_label_tokens: int
    n_real_tokens: int
    n_slot_tokens: int
    n_segments: int
    n_batches: int
    n_batches_epoch: int
    complete: bool
    seconds: float
    tokens_per_s: float
    peak_memory_gib: float | None
    memory_kind: str                          # cuda_peak_alloc | cpu_max_rss
    device: str
    precision: str
    attention: str
    rows: int
    budget: int
    model_dir: str
    eval_split_dir: str
    timings: dict = dataclasses.field(default_factory=dict)   # load_s, warmup_s, samples_s, suites_s, total_s (seconds)
    compiled: bool = False                    # evaluate.compile: the decoder layers ran compiled


@dataclass(kw_only=True)
class RegisterResult(StageResult):
    """packtrain.registry.apply.RegisterResult: the registered version and the alias decision."""

    STAGE: ClassVar[str] = "register"
    FILE: ClassVar[str] = "register_result.json"
    model_name: str
    version: str | None                       # None: deferred (store unreachable, op buffered)
    model_uri: str | None
    flavor: str
    flavor_note: str
    decision: str                             # champion | challenger | deferred
    reason: str
    metric: str
    candidate_value: float
    champion_value: float | None
    previous_champion_version: str | None
    champion_version: str | None
    margin: float
    threshold: float | None
    version_tags: dict[str, str]
    lineage_origin: dict[str, str]
    missing_tags: list[str]
    log_model_s: float
    register_s: float
    run_id: str | None
    tracking_uri: str
    op_id: str | None
    buffer: str | None
    existing: bool = False                    # an earlier version holds these weights: no new version


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
