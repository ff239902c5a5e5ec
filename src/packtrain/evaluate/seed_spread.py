"""How much a suite's metric moves between two trainings that differ only in `train.seed`, and the margins
and detectable effects that follow from it (docs/validation.md "Seed noise").

The paired bootstrap of packtrain.evaluate.promotion resamples documents with both models fixed: it says how sure
we are that *these two weights* differ, not that the recipe change did anything. Two trainings of one recipe
that differ only in the seed differ too (Dodge et al. 2020: of the order of the effects people report). The
calibration record measures that spread:

    python -m bench seed-spread --recipe tiny-cpu --seeds 0 1 2 --out bench/results/seed_spread_tiny-cpu.json

    {"recipe": "tiny-cpu", "config_hash": "c4d8a44cd0654c3f" (recipe_hash: the resolved config minus train.seed),
     "seeds": [0, 1, 2], "k": 3,
     "suites": {"recent":    {"kind": "text", "unit": "bits/byte", "n": 37, "values": [2.8474, 2.8474, 2.8615],
                              "sd": 0.008157, "doc_sd": 0.0432},
                "wordorder": {"kind": "task", "unit": "accuracy",  "n": 200, "values": [0.51, 0.58, 0.585],
                              "sd": 0.041932, "doc_sd": 0.682}}}

The record is built by packtrain.evaluate.seed_record (spread_record) from the seeds' evaluate outputs.
`sd` is the between-seed standard deviation of the suite's metric (bits/byte or accuracy), k − 1 degrees of
freedom; `doc_sd` the per-document standard deviation of the paired difference between two seeds (the
bootstrap's own noise: its standard error at n documents is doc_sd / √n), averaged over the seed pairs.

The margin a seed rerun alone exceeds with probability 1 − confidence (one-sided): the difference of two new
seed draws M₁ − M₀ has standard deviation σ·√2, and with σ estimated from k seeds (M₁ − M₀) / (σ̂·√2) follows
Student's t with k − 1 degrees of freedom (a prediction bound, exact under normality), so

    seed_margin = t(confidence, k − 1) · sd · √2        e.g. k 3, sd 0.008157, 95 % → 2.920 · 0.008157 · 1.414 = 0.0337

t rather than z because k is small: with k = 3 or 4 the estimate σ̂ itself is uncertain by ±40–50 %, and z would
under-cover (with k = 3, t(0.95, 2) = 2.92 against z 1.645). Each suite's margin is the larger of the configured one (delta, epsilon, epsilon_task) and this.

The minimum detectable effect of a suite of n documents at level 1 − a and power 1 − b:

    mde = (z(1 − a) + z(1 − b)) · se          se = doc_sd / √n (preflight) or the bootstrap's sd (verdict)
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from packtrain.errors import ConfigError, InputDataError, MissingDataError

if TYPE_CHECKING:
    from packtrain.config import RunConfig

RECORD_PREFIX = "seed_spread_"
HASHED_SECTIONS = ("ingest", "validate", "tokenize", "pack", "model", "train")
"""The sections whose values make the trained weights (the recipe proper); train.seed is left out, and so are
workdir, tracking, telemetry, the evaluate/register settings and the pipeline's."""
WEIGHT_NEUTRAL_FIELDS = (
    "train.activation_checkpointing", "train.ac_every_k", "train.ac_count",        # recomputes the same values
    "train.compile", "train.compile_backend", "train.attention", "train.fused_optimizer",   # the same function,
    "train.loss", "train.loss_kernel", "train.loss_chunk_tokens", "train.fp8.mix_order_reduction",  # other kernels
    "train.fsdp.reshard_after_forward", "train.deepspeed.overlap_comm", "train.deepspeed.contiguous_gradients",
    "train.deepspeed.offload_optimizer", "train.deepspeed.offload_params",          # where state lives, not what
    "train.checkpoint", "train.log_every", "train.expandable_segments", "train.threads",   # saving, logging, host
    "tokenize.workers", "tokenize.batch_docs", "validate.max_offending_ids")          # speed and reporting only
"""Settings of the hashed sections that change how a run computes, not what: recipe_hash leaves them out, so a
seed rerun with activation checkpointing turned on (the same weights to the bit on the CPU) is still a seed rerun
of the champion, and the seed-spread record of the recipe still applies to it. What changes the data, the model,
the optimisation or the numeric precision stays in (train.precision, train.fsdp.reduce_dtype, rows, lr, ...)."""
UNITS = {"text": "bits/byte", "task": "accuracy"}


def recipe_hash(cfg: RunConfig, sections: tuple[str, ...] = HASHED_SECTIONS) -> str:
    """sha256 (first 16 hex) of the resolved config's `sections` (HASHED_SECTIONS; a dotted path picks one field:
    "pack.budget"), train.seed and WEIGHT_NEUTRAL_FIELDS removed: two configs that differ only in the seed (or in
    where they write, or in how fast they compute the same thing) hash alike."""
    d = cfg.model_dump(mode="json", by_alias=True)
    for path in ("train.seed", *WEIGHT_NEUTRAL_FIELDS):
        parent, _, last = path.rpartition(".")
        _at(d, parent).pop(last, None)
    picked = {key: _at(d, key) for key in sections}
    # the corpus by content, not by where it lies (as the stage cache keys it): `dvc repro` and `packtrain run`
    # read the same documents from different directories and must hash alike
    if "ingest" in picked:
        picked["ingest"] = {**picked["ingest"], "source": _source_identity(cfg.ingest.source)}
    blob = json.dumps(picked, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _at(d: dict, path: str) -> Any:
    """The value at dotted `path` of the config dict `d` ("train.fp8" → d["train"]["fp8"])."""
    for part in path.split("."):
        d = d[part]
    return d


SPLIT_SECTIONS = ("ingest", "validate", "tokenize")
"""The sections that decide which documents tokenize holds out (the held-out split): what is read, what validate
drops, the split settings; a model or train change leaves the split as it was (split_hash adds the few fields
of other sections that ingest's per-document rules read)."""


def split_hash(cfg: RunConfig) -> str:
    """recipe_hash over SPLIT_SECTIONS and the fields outside them that ingest's
    per-document rules read (stages.table.ROW_RULE_FIELDS: pack.budget, model.init_from, …; with
    ingest.on_bad_record=skip they decide which records get a doc_id, and the split is drawn by doc_id): equal
    for two configs that hold out the same documents of one corpus."""
    from packtrain.stages.table import ROW_RULE_FIELDS

    return recipe_hash(cfg, SPLIT_SECTIONS + ROW_RULE_FIELDS)


def _source_identity(src: str | None) -> str | None:
    """None for the default corpus (fixed by the recipe), else the md5 of the source's documents (a missing
    source keeps its spelling: ingest reports it)."""
    if src is None:
        return None
    from packtrain.versioning import data_md5

    p = Path(src)
    return data_md5(p, skip_hidden=True) if p.exists() else str(src)


def t_cdf(t: float, df: int) -> float:
    """Student's t CDF for an integer df, exactly: the finite series of Abramowitz & Stegun 26.7.3/26.7.4 in
    θ = atan(t/√df) for A = P(|T| < |t|)."""
    th = math.atan(abs(t) / math.sqrt(df))
    c2, s_ = math.cos(th) ** 2, math.sin(th)
    if df % 2:
        term, acc = math.cos(th), 0.0
        for j in range(1, (df - 1) // 2 + 1):   # cos θ · (1 + 2/3 cos²θ + 2·4/(3·5) cos⁴θ + …), df − 2 powers
            acc += term
            term *= c2 * (2 * j) / (2 * j + 1)
        a = 2 / math.pi * (th + s_ * acc) if df > 1 else 2 * th / math.pi
    else:
        term, acc = 1.0, 0.0
        for j in range(1, df // 2 + 1):          # 1 + ½ cos²θ + 1·3/(2·4) cos⁴θ + …
            acc += term
            term *= c2 * (2 * j - 1) / (2 * j)
        a = s_ * acc
    return 0.5 + 0.5 * a if t >= 0 else 0.5 - 0.5 * a


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for an integer df (bisection on t_cdf to 1e-12; tests compare with scipy).

    >>> round(t_quantile(0.95, 2), 3), round(t_quantile(0.95, 3), 3)
    (2.92, 2.353)
    """
    if df < 1 or not 0 < p < 1:
        raise ValueError(f"t quantile needs df ≥ 1 and 0 < p < 1 (got df {df}, p {p})")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2
    while t_cdf(hi, df) < p:
        hi *= 2
    while hi - lo > 1e-12 * max(1.0, abs(hi)):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def seed_margin(sd: float, k: int, confidence: float) -> float:
    """t(confidence, k − 1) · sd · √2 (module doc): what a seed rerun alone exceeds with probability 1 − confidence."""
    return t_quantile(confidence, k - 1) * sd * math.sqrt(2.0)


def mde(se: float, alpha: float, power: float) -> float:
    """Minimum detectable effect of a one-sided test at level alpha with the given power: (z(1−α) + z(power))·se."""
    nd = NormalDist()
    return (nd.inv_cdf(1.0 - alpha) + nd.inv_cdf(power)) * se


# --- the record as the decision reads it -------------------------------------------------------------------

def default_record_path(recipe: str) -> Path:
    """Where `seed_spread: auto` looks: bench/results/seed_spread_<recipe>.json of the repository packtrain runs
    from (a source checkout; an installed wheel has no bench/, so auto finds nothing there and says so)."""
    import packtrain

    # src/packtrain/__init__.py of a checkout (editable install or PYTHONPATH=src) → the checkout's root
    return Path(packtrain.__file__).resolve().parents[2] / "bench" / "results" / f"{RECORD_PREFIX}{recipe}.json"


def resolve_seed_spread(cfg: RunConfig, base: Path | None = None, champion: tuple[str, str] | None = None) -> dict:
    """The seed-spread entry of suites.json for this run: {"recipe", "path", "md5", "config_hash", "k",
    "suites": {name: {"sd", "doc_sd", "n", "unit"}}, "note"} from `register.promotion.seed_spread`, or {"recipe",
    "path": None, "suites": {}, "note"} when there is none (the configured margins are assumed, and the note says
    so). A record made for another recipe is a ConfigError naming both; auto skips a record whose config hash
    differs from this run's (saying so) unless it is the champion's (`champion`: ("v1", its version tag
    packtrain.config_hash; packtrain.evaluate.recipe_identity): the champion is a draw of that recipe, so its seed
    spread is the noise to exceed), an explicit path refuses it."""
    from packtrain.versioning import file_md5

    setting = cfg.register_.promotion.seed_spread
    recipe, digest = cfg.name, recipe_hash(cfg)
    none: dict = {"recipe": recipe, "config_hash": digest, "path": None, "suites": {}}
    if setting is None:
        return {**none, "note": "register.promotion.seed_spread is null: no seed-spread record, the configured "
                                "margins are assumed"}
    path = default_record_path(recipe) if setting == "auto" else (Path(base or Path.cwd()) / setting).resolve()
    if not path.is_file():
        if setting == "auto":
            return {**none, "note": f"no seed-spread record for recipe {recipe} ({path} does not exist): the "
                                    "configured margins are assumed"}
        raise MissingDataError(f"register.promotion.seed_spread: {path} does not exist (a record of "
                               "`python -m bench seed-spread`, auto, or null)")
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
        suites, rec_recipe, rec_hash, k = rec["suites"], rec["recipe"], rec["config_hash"], int(rec["k"])
        suites = {n: {"sd": float(s["sd"]), "doc_sd": float(s["doc_sd"]), "n": int(s["n"]), "unit": str(s["unit"])}
                  for n, s in suites.items()}
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
        raise InputDataError(f"register.promotion.seed_spread: {path} is not a seed-spread record (needs recipe, "
                             f"config_hash, k and suites.<name>.sd/doc_sd/n/unit): {e!r}") from None
    if rec_recipe != recipe:
        raise ConfigError(f"register.promotion.seed_spread: {path} was measured for recipe {rec_recipe!r}, this "
                          f"run is recipe {recipe!r}: another recipe's seed spread says nothing about this one "
                          f"(measure it: python -m bench seed-spread --recipe {recipe})")
    if rec_hash != digest:
        msg = (f"the seed-spread record {path} was measured for recipe {recipe} with config {rec_hash}, this run's "
               f"config is {digest} (sections {', '.join(HASHED_SECTIONS)} minus train.seed differ)")
        if setting == "auto" and champion is not None and champion[1] == rec_hash and k >= 3:
            return {"recipe": recipe, "config_hash": digest, "path": str(path), "md5": file_md5(path), "k": k,
                    "suites": suites, "note": f"margins from the seed-spread record {path.name} (recipe {recipe}, k "
                                              f"{k} seeds; measured for {champion[0]}'s config {rec_hash}, this "
                                              f"run's config {digest} differs)"}
        if setting == "auto":
            return {**none, "note": f"{msg}: not used, the configured margins are assumed"}
        raise ConfigError(f"register.promotion.seed_spread: {msg}; re-measure it, or set seed_spread to null")
    if k < 3:
        raise InputDataError(f"register.promotion.seed_spread: {path} has k {k} seeds; at least 3 are needed")
    return {"recipe": recipe, "config_hash": digest, "path": str(path), "md5": file_md5(path), "k": k,
            "suites": suites, "note": f"margins from the seed-spread record {path.name} (recipe {recipe}, k {k} seeds)"}
