"""Configs of the evaluate and register stages."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from packtrain.config.base import Float, Fraction, Int, PathStr, PositiveInt, Seed, StrictModel, Text
from packtrain.config.messages import Allowed

SuiteName = Annotated[str, Allowed("a name of letters, digits, '_', '-' that starts with a letter")]


class PerturbConfig(StrictModel):
    """A seeded robustness transform of a suite's documents (packtrain.evaluate.perturb), e.g. every letter's
    case flipped with probability 0.05. The perturbed suite is scored like any other; give it role regression."""

    kind: Literal["case", "whitespace", "chars"]
    """case: flip a letter's case; whitespace: double a space or turn it into a newline; chars: replace a
    character by a neighbouring printable ASCII one."""
    rate: Fraction = 0.05
    """Probability per character (case/chars) or per whitespace run (whitespace)."""
    seed: Seed = 0
    """Seed of the transform: the same seed gives the same perturbed documents for both models and every run."""


class SuiteConfig(StrictModel):
    """One frozen evaluation suite, scored for challenger and champion alike (docs/validation.md)."""

    name: SuiteName = Field(pattern=r"^[A-Za-z][A-Za-z0-9_\-]*$")
    """Unique name, used in tags (`suite.<name>.delta`), the per-document table and validation.md. "recent" is
    reserved for the pipeline's own held-out split."""
    role: Literal["primary", "regression", "task"]
    """primary: must improve (upper CI bound of Δ < −register.promotion.delta); regression: must not get worse
    (upper bound < +register.promotion.epsilon); task: accuracy must not drop (upper bound of the drop <
    +register.promotion.epsilon_task)."""
    path: PathStr
    """A held-out file (.txt: documents separated by blank lines; .jsonl/.parquet: one record per row with
    `text`, `prompt` + `completion`, or `messages`), or an lm-evaluation-harness task YAML (.yaml/.yml) whose
    data are local files. Relative paths resolve against the working directory; `@recipes/…` inside packtrain's
    recipes directory (the shipped task: @recipes/tasks/wordorder/wordorder.yaml)."""
    task: Text | None = None
    """lm-eval task name inside the YAML (None → the YAML's `task:`); only for .yaml suites."""
    max_documents: PositiveInt | None = None
    """Score only the first N documents of the file (the same N for both models, recorded); None → all."""
    perturb: PerturbConfig | None = None
    """Robustness probe: score a seeded perturbation of the documents instead (text suites only)."""


class PromotionConfig(StrictModel):
    """The paired decision of `register` (docs/validation.md): challenger − champion per document, paired
    bootstrap over documents, Holm across suites.

    Worked example (defaults): primary Δ = −0.042 bits/byte, 95% upper bound −0.031 < −delta (−0.0) → improved;
    regression "replay" Δ = +0.004, upper +0.009 < epsilon 0.01 → not worse; promoted."""

    delta: Float = Field(0.0, ge=0)
    """Superiority margin on the primary suite, in bits per UTF-8 byte: promote only when the upper confidence
    bound of Δ (challenger − champion) < −delta."""
    epsilon: Float = Field(0.01, ge=0)
    """Non-inferiority margin of each regression suite, in bits per byte: its upper bound of Δ must be < +epsilon."""
    epsilon_task: Float = Field(0.02, ge=0)
    """Non-inferiority margin of each task suite, in accuracy (0.02 = 2 points): the upper bound of the
    accuracy drop (champion − challenger) must be < +epsilon_task."""
    confidence: Float = Field(0.95, gt=0.5, lt=1)
    """Family-wise confidence across all suites (Holm step-down on one-sided bootstrap p-values)."""
    resamples: Int = Field(2000, ge=100)
    """Bootstrap resamples of the documents (each suite)."""
    seed: Seed = 0
    """Seed of the bootstrap: the same tables give the same verdict, bit for bit."""
    seed_spread: Literal["auto"] | PathStr | None = "auto"
    """Calibration record of every suite's between-seed spread (`python -m bench seed-spread`;
    packtrain.evaluate.seed_spread). Each suite's margin becomes the larger of the configured one and
    t(confidence, k − 1) · sd · √2, what a rerun differing only in `train.seed` exceeds with probability
    1 − confidence, so a seed rerun is promoted in neither role. auto → bench/results/seed_spread_<name>.json of
    the checkout, if it exists and was measured with this config (else the configured margins, said so in the
    verdict); a path → that record (missing, or measured for another recipe or config: an error); null → none."""
    power: Float = Field(0.8, gt=0, lt=1)
    """Power of the minimum detectable effect (MDE) shown per suite: the smallest true effect the suite's test
    detects with this probability, from its n documents and their paired spread."""
    power_check: Literal["warn", "strict", "off"] = "warn"
    """Before training: per suite, the MDE from the seed-spread record's per-document spread and the suite's n; a
    suite whose MDE exceeds its margin cannot decide. warn → named in a warning; strict → a ConfigError (exit 2)
    before any stage runs; off → not checked."""

    @field_validator("power_check", mode="before")
    @classmethod
    def _off_from_yaml(cls, v):
        """YAML reads a bare `off` as false: that is "off"."""
        return "off" if v is False else v
    allow_unguarded: bool = False
    """Promote even when nothing measures the champion's domain: its held-out documents, found through the
    lineage recorded on its registered version (tags heldout.path / heldout.md5), are gone, changed or were never
    recorded (packtrain.evaluate.champion_domain). false → such a challenger is kept as challenger and the reason
    says "nothing measures the champion's domain: …"; true → the suites alone decide, and the same line is still
    written to the summary, validation.json and the version's tag `champion_domain`."""


class EvalConfig(StrictModel):
    """Held-out loss/perplexity on packed batches and greedy generation samples."""

    rows: PositiveInt | Literal["auto"] = "auto"
    """Packs per evaluation micro-batch: one forward sees rows × pack.budget tokens. auto → 4 on the CPU; on
    CUDA as many as make FORWARD_TOKENS (65,536) tokens per forward (`forward_rows`): a forward-only pass keeps
    no activations for a backward, so its transient memory is a few hidden-size tensors per token (≈ 9 GiB at
    65,536 tokens for a Llama-3-8B shape, ≈ 1.7 GiB for 350M) and the LM head is chunked."""
    max_batches: PositiveInt | None = None
    """Cap on evaluation micro-batches (smoke runs). None → exactly one epoch over the eval packs, so every
    held-out document counts; a cap is recorded in evaluate_result.json (`complete: false`)."""
    prompts: list[Text] = ["def ", "import ", "The "]
    """Fixed prompts of the generation samples (samples.json); the same prompts every run, so runs compare."""
    sample_tokens: PositiveInt = 32
    """New tokens generated greedily per prompt."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """Autocast dtype of the forward; the loss itself is always accumulated in fp64. auto → bf16 on CUDA (the
    precision training uses there; the held-out loss agrees with fp32 within 0.5% relative, tests/gpu), fp32
    on the CPU (exact: re-evaluations reproduce bit for bit)."""
    attention: Literal["auto", "sdpa", "eager", "flex", "varlen"] = "auto"
    """Isolated attention backend (packtrain.model.attention) of the evaluate stage and of the warm start's
    step-0 loss; auto → varlen (CUDA, bf16/fp16), else flex on CUDA, else sdpa, else eager: the first the
    model's family allows (Gemma2 on the CPU: eager). Generation samples use sdpa (eager where the family
    refuses sdpa)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto → cuda when available, else cpu."""
    compile: Literal["auto"] | bool = "auto"
    """`torch.compile` each decoder layer for the scoring forwards (held-out loss, text suites), as training does:
    one graph for every layer and every forward (the token count per forward is fixed, rows × budget). auto → on
    CUDA, off on the CPU (where the eager forward is the exact reference). Generation samples and lm-eval tasks
    (a shape per call) run eagerly either way."""
    seed: Seed = 0
    """Order of the eval packs (the loss sum does not depend on it)."""
    suites: list[SuiteConfig] = []
    """Frozen evaluation suites scored for challenger and champion (docs/validation.md); the pipeline's own
    held-out split is always there too, as suite "recent" (role `recent_role`)."""
    recent_role: Literal["primary", "regression", "off"] = "primary"
    """Role of suite "recent" (this run's held-out documents); off → not scored (then a suite must be primary)."""
    recent_max_documents: PositiveInt | None = None
    """Score only the first N held-out documents (by doc_id) as suite "recent", the same N for both models and
    recorded in suites.json; None → the whole held-out split."""
    suite_budget: PositiveInt = 512
    """Tokens per packed row when scoring suites, for both models; longer documents are scored in chunks that
    overlap by one token, so every token is predicted exactly once."""
    against: Literal["champion", "none"] = "champion"
    """Whom the evaluate stage also scores: the registry's `register.model_name@champion` (none yet → the
    challenger alone, said so), or nobody."""

    @field_validator("recent_role", mode="before")
    @classmethod
    def _off_from_yaml(cls, v):
        """YAML reads a bare `off` (a recipe line, or `--set evaluate.recent_role=off`) as false: that is "off"."""
        return "off" if v is False else v

    @model_validator(mode="after")
    def _suite_names(self) -> EvalConfig:
        names = [s.name for s in self.suites]
        dup = sorted({n for n in names if names.count(n) > 1})
        reserved = [n for n in names if n in ("recent", "champion_domain")]
        if dup or reserved:
            raise ValueError(f"evaluate.suites: names must be unique and not 'recent' or 'champion_domain' (got "
                             f"{', '.join(dup or reserved)})")
        if self.recent_role == "off" and not any(s.role == "primary" for s in self.suites):
            raise ValueError("evaluate.recent_role is off but no evaluate.suites entry has role primary: "
                             "one suite must be primary")
        return self


FORWARD_TOKENS = 65_536
"""Tokens per evaluation forward on CUDA under evaluate.rows auto."""


def eval_precision(precision: str, device_type: str) -> str:
    """evaluate.precision with auto resolved for a device type ("cuda" → bf16, else fp32)."""
    if precision != "auto":
        return precision
    return "bf16" if device_type == "cuda" else "fp32"


def eval_compile(compile: bool | str, device_type: str) -> bool:
    """evaluate.compile with auto resolved for a device type (on for "cuda", off elsewhere)."""
    return device_type == "cuda" if compile == "auto" else bool(compile)


def forward_rows(rows: int | str, device_type: str, budget: int) -> int:
    """evaluate.rows with auto resolved: 4 on the CPU, FORWARD_TOKENS // budget (at least 1) on CUDA."""
    if rows != "auto":
        return int(rows)
    return max(1, FORWARD_TOKENS // max(int(budget), 1)) if device_type == "cuda" else 4


class RegisterConfig(StrictModel):
    """Model Registry name and the champion/challenger rule."""

    model_name: Annotated[str, Allowed("a name of letters, digits, '.', '_', '-' that starts with a letter "
                                       "or digit")] = Field("packtrain-lm", pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
    """Registered model name: letters, digits, '.', '_', '-'."""
    moved_fields: ClassVar[dict[str, str]] = {"margin": "register.promotion.delta"}

    metric: Literal["eval_loss", "perplexity"] = "eval_loss"
    """The held-out number tagged on the version (informational: the alias follows `promotion`)."""
    promotion: PromotionConfig = PromotionConfig()
    """Who takes the champion alias: the paired comparison of the evaluate stage (docs/validation.md)."""
    flavor: Literal["files", "auto", "transformers", "pytorch"] = "files"
    """How the model is logged. files → the exported directory's files copied as they are into MLflow's
    transformers flavor (never loaded or re-saved: 0.4 s for a 350M model on the CPU, not 6.7 s; a directory without
    config.json + *.safetensors goes the auto way). auto → load the directory and log the in-memory model in the
    transformers flavor, falling back to the pytorch flavor (with the tokenizer as extra files) if that raises on
    the installed versions. transformers / pytorch → that in-memory flavor only. The choice and its reason are
    tagged on the version (flavor, flavor_note)."""
    pip_requirements: list[Text] | None = None
    """Requirements written with the model. None → the installed torch/transformers/tokenizers/safetensors
    pinned without local suffixes (torch==2.13.0, not 2.13.0+cpu): MLflow's inference is slow and wrong."""
    gate: bool | None = None
    """Gate before the champion alias moves: a version the paired evaluation would promote takes the alias only
    if its training run passes `packtrain gate` against the champion's (docs/gate.md); else it stays
    challenger and the reason names the regressed metrics. None → on for scheduled runs (the Airflow DAG,
    packtrain.pipeline.retrain), off for `packtrain run` / `packtrain register`."""
    gate_rules: Text | None = None
    """Rules file (YAML/JSON) of that gate; None → the built-in noise-aware rules of the runs' device kind."""
