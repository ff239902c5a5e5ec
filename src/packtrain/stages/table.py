"""The stage table: the one list of stages, what each consumes and produces, and what it depends on.

Every adapter reads this table instead of naming stages itself: the stage runners
(`packtrain.pipeline.runtime.RUNNERS`), the CLI's stage subcommands, `packtrain run`'s in-process walk
(`packtrain.pipeline.dag`), the KFP components and pipeline (artifact names, GPU and retry settings), the stage
cache key (`packtrain.pipeline.runtime.config_parts`), the generated `dvc.yaml` (`packtrain.pipeline.dvc_export`),
the run summary and lineage. Adding a stage is adding one `StageSpec` here, and naming its runner and its command
module where they are imported (`packtrain.pipeline.runtime.RUNNERS`, `packtrain.cli.STAGE_COMMANDS`: both check
at import that they follow this table; docs/architecture.md walks through an example).

The DAG, in table order (each arrow is an artifact, named the same in the runtime, the KFP components and
pipeline, dvc.yaml and the summary):

    ingest ─documents─► validate ─validation
      └──documents──► tokenize ─tokens─► pack ─packs─► train ─model─► evaluate ─evaluation─► register ─registration
    and: tokens → train (the tokenizer), packs → evaluate (the eval split), model → register;
         tokenize runs after validate (a failed suite stops the run before any tokenizing or training)

    stage      inputs              output
    ingest     -                   documents
    validate   documents           validation
    tokenize   documents           tokens          (after validate)
    pack       tokens              packs
    train      packs, tokens       model
    evaluate   model, packs        evaluation
    register   model, evaluation   registration

One row, with what each field means:

    >>> spec = stage_spec("train")
    >>> spec.inputs, spec.output, spec.config
    (('packs', 'tokens'), 'model', ('model', 'train', 'telemetry', 'plan', 'pack.budget'))
    >>> stage_spec("train").gpu, stage_spec("train").stats_file
    (True, 'train_result.json')
    >>> [s.name for s in STAGES if s.transient]
    ['ingest', 'train', 'evaluate', 'register']
    >>> ARTIFACTS["model"]            # who produces an artifact
    'train'

Config sections are dotted paths into `RunConfig.to_dict()` ("pack" is the whole section, "pack.budget"
one field of it). The stage cache key holds exactly these values (plus what no field says: the ingest
source's md5, a warm start's resolved source, the resolved tracking URI), so changing a recipe field
reruns exactly the stages that declare it (tests/unit/test_stage_table.py checks every field of the
tiny-cpu recipe). A stage's upstream outputs enter its key through the inputs' md5, not through config.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageSpec:
    """One stage. All names are the ones every adapter uses; nothing here imports the stage's code (its runner,
    `run_<name>` in `packtrain.stages.<name>`, is in packtrain.pipeline.runtime.RUNNERS)."""

    name: str
    """Stage name: CLI subcommand, module `packtrain.stages.<name>`, KFP component/task, DVC stage, MLflow run."""
    inputs: tuple[str, ...]
    """Artifacts it consumes (outputs of earlier stages), in KFP parameter order."""
    output: str
    """The artifact it produces: one directory (KFP output artifact, dvc out `${workdir}/<name>`)."""
    config: tuple[str, ...]
    """Config sections/fields its output depends on (dotted paths into RunConfig.to_dict())."""
    code: tuple[str, ...]
    """Source paths (relative to the repository root) its output depends on: dvc.yaml deps."""
    help: str
    """One line: CLI help, component docstring."""
    stats_file: str
    """The stats JSON the runner writes into its output directory (the typed result, serialised)."""
    runner_args: tuple[str, ...] = ()
    """Positional input directories of the runner, as `artifact[/subdir]`; empty → `inputs` in order.
    evaluate reads `model/model` (the saved model inside the train output) and `packs`."""
    reads: tuple[str, ...] = ()
    """What of its inputs the runner reads, as `artifact[/path]` (a directory or a file); the stage cache key
    hashes exactly these. Empty → `args`. evaluate and register read the saved model, not the train output's
    checkpoints/ (the 350M model's AdamW state is 5.6 GB: hashing it cost the evaluate stage ~8 s)."""
    cli_flags: tuple[str, ...] = ()
    """The stage command's flag for each runner arg (same order); empty → `--<input>` per input."""
    after: tuple[str, ...] = ()
    """Stages that must finish first without feeding an artifact (tokenize waits for validate)."""
    init_config: tuple[str, ...] = ()
    """Sections read only when `model.init_from` is not scratch (train's step-0 evaluation): in the
    cache key only then."""
    gpu: bool = False
    """Runs on the GPU image with an accelerator request on a cluster (when the recipe trains on a GPU)."""
    cluster_cache: bool = True
    """KFP may reuse its outputs when its inputs are unchanged. Off where the output depends on the registry as it
    is now, or the step changes it: evaluate (the champion it is compared with), register (it moves an alias)."""
    transient: bool = False
    """Its failures can be transient (preemption, network, MLflow server): retried on a cluster. The
    deterministic stages are not: a retry would fail the same way."""
    metrics: tuple[tuple[str, str], ...] = ()
    """What `dvc metrics show` lists for it: (short name, dotted key in the stats file). A few per stage, so
    all stages together stay readable in 100 columns."""
    plots: tuple[str, ...] = ()
    """Plot files (dvc `plots`) it exports next to the metrics."""

    @property
    def args(self) -> tuple[str, ...]:
        """Runner inputs as `artifact[/subdir]` (`runner_args`, or the inputs)."""
        return self.runner_args or self.inputs

    @property
    def read_paths(self) -> tuple[str, ...]:
        """What the stage cache key hashes (`reads`, or `args`)."""
        return self.reads or self.args

    @property
    def flags(self) -> tuple[str, ...]:
        """CLI flags aligned with `args`."""
        return self.cli_flags or tuple(f"--{a.split('/')[0]}" for a in self.args)

    @property
    def metrics_file(self) -> str:
        """`metrics/<name>.json`, written by `packtrain pipeline export <name>` (dvc.yaml)."""
        return f"metrics/{self.name}.json"


ROW_RULE_FIELDS = ("pack.budget", "tokenize.tokenizer_dir", "tokenize.chat_template", "tokenize.append_eos",
                   "tokenize.long_records", "tokenize.control_text", "model.init_from")
"""What the per-document rules (packtrain.data.record_rules.RowRules.of) read outside the stage's own section."""
CONTAMINATION_FIELDS = ("evaluate.suites", "tokenize.eval_fraction")
"""What the contamination check reads outside validate's section: the suites and the held-out fraction."""
SUITE_CODE = ("src/packtrain/evaluate/suites.py", "src/packtrain/evaluate/suite_types.py",
              "src/packtrain/evaluate/tasks.py")
"""The code the contamination check reads its eval documents with."""

STAGES: tuple[StageSpec, ...] = (
    StageSpec(
        name="ingest", inputs=(), output="documents",
        # ingest.on_bad_record=skip drops what validate's per-document rules refuse: those rules' fields too
        config=("ingest", *ROW_RULE_FIELDS, "validate.role_order"),
        code=("src/packtrain/data", "src/packtrain/stages/ingest.py"),
        help="read a .txt/.jsonl/.parquet source (or the default corpus) into a documents table",
        stats_file="ingest_result.json", transient=True,
        metrics=(("docs", "documents"),),
    ),
    StageSpec(
        name="validate", inputs=("documents",), output="validation",
        # prompt_fits_budget counts prompts against pack.budget; the contamination check reads every suite the run
        # scores and the held-out split tokenize will make (packtrain.data.contamination_sources)
        config=("validate", *ROW_RULE_FIELDS, *CONTAMINATION_FIELDS),
        code=("src/packtrain/data", "src/packtrain/stages/validate.py", *SUITE_CODE),
        help="run the Great Expectations suite on the documents table",
        stats_file="validate_result.json", cli_flags=("--docs",),
        metrics=(("passed", "success"),),
    ),
    StageSpec(
        name="tokenize", inputs=("documents",), output="tokens",
        # records are fitted to pack.budget; policy drop leaves out what the contamination check finds
        config=("tokenize", "model.init_from", "pack.budget", "validate.contamination", "evaluate.suites"),
        code=("src/packtrain/data", "src/packtrain/stages/tokenize.py", *SUITE_CODE),
        help="train/load a BPE tokenizer and write memory-mappable token ids",
        stats_file="tokenize_result.json", cli_flags=("--docs",), after=("validate",),
        metrics=(("tokens", "tokens"),),
    ),
    StageSpec(
        name="pack", inputs=("tokens",), output="packs",
        config=("pack",),
        code=("src/packtrain/packing", "src/packtrain/stages/pack.py"),
        help="bin-pack documents into fixed token budgets",
        stats_file="pack_result.json",
        metrics=(("fill", "train.fill"),),
    ),
    StageSpec(
        name="train", inputs=("packs", "tokens"), output="model",
        config=("model", "train", "telemetry", "plan", "pack.budget"),
        # the packed-batch loader lives in packing/, the planner decides train.rows=auto
        code=("src/packtrain/model", "src/packtrain/train", "src/packtrain/packing", "src/packtrain/planner",
              "src/packtrain/telemetry", "src/packtrain/stages/train.py"),
        help="train the model on packed batches (AMP, checkpointing, ZeRO)",
        stats_file="train_result.json", init_config=("evaluate",), gpu=True, transient=True,
        metrics=(("tok/s", "throughput.real_tokens_per_s"), ("loss", "final_loss")),
        plots=("plots/train_steps.csv",),
    ),
    StageSpec(
        name="evaluate", inputs=("model", "packs"), output="evaluation",
        # + the seed-spread setting, the recipe name and the sections its record is matched on (evaluate.seed_spread.HASHED_SECTIONS): whether the
        # record's margins apply depends on them (a change there changes the weights too, so it costs no hit)
        config=("evaluate", "model", "ingest", "validate", "tokenize", "pack", "train", "name",
                "register.promotion.seed_spread"),
        code=("src/packtrain/evaluate", "src/packtrain/model", "src/packtrain/stages/evaluate.py"),
        help="held-out loss/perplexity on packed batches, generation samples",
        stats_file="evaluate_result.json", runner_args=("model/model", "packs"), gpu=True, transient=True,
        cluster_cache=False,
        metrics=(("ppl", "perplexity"),),
    ),
    StageSpec(
        name="register", inputs=("model", "evaluation"), output="registration",
        # the registry lives at the tracking URI (None → <workdir>/mlflow.db) in the experiment
        config=("register", "tracking.enabled", "tracking.tracking_uri", "tracking.experiment", "workdir"),
        code=("src/packtrain/evaluate", "src/packtrain/tracking", "src/packtrain/stages/register.py"),
        help="log + register the model in MLflow, move champion/challenger alias",
        stats_file="register_result.json", runner_args=("model/model", "evaluation", "model"),
        reads=("model/model", "evaluation", "model/train_result.json"),   # of the train dir: its result only
        cli_flags=("--model", "--eval", "--train"), transient=True, cluster_cache=False,
        metrics=(("version", "version"),),
    ),
)
"""Every stage in DAG order (a topological order: each stage's inputs come from stages before it)."""

STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
"""('ingest', 'validate', 'tokenize', 'pack', 'train', 'evaluate', 'register')"""

ARTIFACTS: dict[str, str] = {s.output: s.name for s in STAGES}
"""Artifact name → the stage producing it: {'documents': 'ingest', ..., 'registration': 'register'}."""

_BY_NAME: dict[str, StageSpec] = {s.name: s for s in STAGES}


def stage_spec(name: str) -> StageSpec:
    """The spec of one stage; an unknown name raises KeyError naming the stages."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r} (stages: {', '.join(STAGE_NAMES)})") from None


def upstream(name: str) -> tuple[str, ...]:
    """Stages whose output `name` consumes, then its `after` stages: upstream('evaluate') → ('train', 'pack')."""
    spec = stage_spec(name)
    return tuple(dict.fromkeys([ARTIFACTS[a] for a in spec.inputs] + list(spec.after)))


def _check(stages: tuple[StageSpec, ...]) -> None:
    """Import-time consistency: unique names and outputs, inputs produced by an earlier stage."""
    seen: set[str] = set()
    made: set[str] = set()
    for s in stages:
        assert s.name not in seen, f"stage {s.name} twice"
        assert s.output not in made, f"artifact {s.output} produced twice"
        for a in s.inputs:
            assert a in made, f"stage {s.name}: input {a} is not produced by an earlier stage"
        for a in s.after:
            assert a in seen, f"stage {s.name}: after {a} is not an earlier stage"
        assert len(s.flags) == len(s.args), f"stage {s.name}: cli_flags do not match runner args"
        for a in s.args:
            assert a.split("/")[0] in s.inputs, f"stage {s.name}: runner arg {a} is not an input"
        seen.add(s.name)
        made.add(s.output)


_check(STAGES)
