"""Register a trained model in the MLflow Model Registry and move the champion/challenger aliases.

    evaluate: challenger and champion v3 scored on the same suites (suite_scores.parquet, suites.json)
    promotion_verdict(eval_dir, cfg.promotion)   paired per-document Δ, bootstrap CI, Holm (evaluate/promotion.py)
      promote → [register.gate: the training run passes `packtrain gate` against v3's]
              → log model, register v4 (tags: verdict, per suite Δ / CI / n / md5), champion v3 → v4 *if still v3*
      keep    → alias challenger → v4, champion stays on v3 (the reason names the suite and its CI)

The first version of a name becomes champion. A verdict made against v3 while v5 holds the alias at
registration time does not move it (challenger; the reason says re-run evaluate). Every version is tagged
with eval_loss/perplexity (informational), the verdict (`validation`, `suite.<name>.*`), the lineage (data
version, token store md5, git sha, packing fill, MFU, peak memory: packtrain.registry.lineage_tags and
`dataset_tags`), `missing_tags`, packtrain.train_run_id (the training run, for `packtrain gate`) and
packtrain.register_run_id; the register run holds validation/validation.md and validation/validation.json. The
model itself is logged as the train run's output (packtrain.registry.apply), so the version's run is the train run.

One registration is one op (`build_registration`, this module) applied by packtrain.registry.apply's
`apply_registration`, live (the register stage: `StageRun.submit(op)`) or from the MLflow buffer when the store
was down (packtrain.tracking.buffer; the stage then reports decision "deferred"). Applying it again creates
nothing twice (packtrain.registry.apply).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from packtrain.config import RegisterConfig
from packtrain.errors import InputDataError
from packtrain.registry.champion import DEFERRED, as_float
from packtrain.registry.outcome import RegisterOutcome

__all__ = ["build_registration", "deferred_result", "parent_tags", "promotion_verdict"]


def _eval_dict(eval_result) -> dict:
    return eval_result.to_dict() if hasattr(eval_result, "to_dict") else dict(eval_result)


def promotion_verdict(eval_dir: str | Path, cfg: RegisterConfig):
    """The PromotionVerdict of an evaluate output directory under `cfg.promotion` (packtrain.evaluate.promotion)."""
    from packtrain.evaluate.paired_scores import read_decision_input
    from packtrain.evaluate.promotion import decide_promotion

    suites, manifest = read_decision_input(Path(eval_dir))
    against = (manifest.get("against") or {}).get("label")
    v = decide_promotion(suites, cfg.promotion, against, manifest.get("tokenizers_match"), manifest.get("seed_spread"))
    if manifest.get("note") and manifest["note"] not in v.note:
        v.note = "; ".join(x for x in (manifest["note"], v.note) if x)
    from packtrain.evaluate.recipe_identity import guard_seed_rerun

    return guard_seed_rerun(guard_champion_domain(v, manifest, cfg.promotion.allow_unguarded), manifest)


def guard_champion_domain(v, manifest: dict, allow_unguarded: bool):
    """The verdict `v` with the champion's domain accounted for (packtrain.evaluate.champion_domain): its line
    recorded, and a promotion refused when nothing measured that domain, unless `allow_unguarded`."""
    from packtrain.evaluate.champion_domain import unguarded_line

    cd = manifest.get("champion_domain") or {}
    v.champion_domain = cd.get("line") or ""
    line = unguarded_line(manifest)
    if line is None or v.against is None:
        return v
    if v.promote and not allow_unguarded:
        v.promote = False
        v.reason = (f"not promoted over {v.against}: {line} (register.promotion.allow_unguarded=true promotes "
                    f"on the suites alone: {v.reason})")
    elif v.promote:
        v.reason = f"{v.reason}; {line}: promoted anyway (register.promotion.allow_unguarded=true)"
    return v


def build_registration(model_dir: str | Path, eval_result, train_result_path: str | Path | None,
                       cfg: RegisterConfig, pack_stats: dict | None = None, verdict=None) -> dict:
    """The registration op: everything `apply_registration` needs, JSON-able, no MLflow call.

    {"op": "register_model", "id": <uuid hex>, "path": "/abs/model", "name": "packtrain-lm",
     "metric": "eval_loss", "candidate": 3.91, "margin": 0.0, "flavor": "files", "pip_requirements": [...],
     "promotion": PromotionVerdict.to_dict() (None: no paired evaluation → never moves an existing champion),
     "gate": false, "gate_rules": null, "step": 30,
     "version_tags": {"eval_loss": "3.91", ..., "dataset_md5": ..., "tokens_md5": ..., "missing_tags": "none"},
     "lineage_origin": {...}, "missing": [...]}
    """
    from packtrain.registry.lineage_tags import collect_lineage, read_optional_json
    from packtrain.registry.model import default_pip_requirements
    from packtrain.versioning import git_sha

    ev = _eval_dict(eval_result)
    candidate = as_float(ev.get(cfg.metric))
    if candidate is None:
        raise InputDataError(f"eval result: field {cfg.metric!r} is missing or not a number "
                             f"(got {ev.get(cfg.metric)!r}); register.metric allows eval_loss, perplexity")
    train = read_optional_json(train_result_path)
    lineage, origin, missing = collect_lineage(   # typed: TrainResult / evaluate_result.json's "lineage"
        train, ev, checkout_sha=git_sha(), train_source=train_result_path)   # git: cwd, then packtrain's source
    from packtrain.versioning import data_md5

    tags = {"eval_loss": ev.get("eval_loss"), "perplexity": ev.get("perplexity"), "model_md5": data_md5(model_dir),
            "eval_tokens_per_s": ev.get("tokens_per_s"), "metric": cfg.metric, **lineage,
            **dataset_tags(train), "missing_tags": ",".join(missing) or "none", **parent_tags(train)}
    reqs = list(cfg.pip_requirements) if cfg.pip_requirements is not None else default_pip_requirements()
    rules = str(Path(cfg.gate_rules).resolve()) if cfg.gate_rules else None   # applied later, maybe elsewhere
    metric: str = cfg.metric
    promo = verdict.to_dict() if hasattr(verdict, "to_dict") else verdict
    primary = [s for s in (promo or {}).get("suites", []) if s["role"] == "primary"]
    if primary:   # the headline number: the primary suite's bits/byte, challenger and champion on the same docs
        metric, candidate = f"bits_per_byte:{primary[0]['suite']}", float(primary[0]["challenger"])
    return {"op": "register_model", "id": uuid.uuid4().hex, "path": str(Path(model_dir).resolve()),
            "name": cfg.model_name, "metric": metric, "candidate": candidate, "margin": cfg.promotion.delta,
            "promotion": promo,
            "flavor": cfg.flavor, "pip_requirements": reqs, "gate": bool(cfg.gate), "gate_rules": rules,
            "step": model_step(train),
            "version_tags": {k: str(v) for k, v in tags.items() if v is not None},
            "lineage_origin": origin, "missing": missing}


def model_step(train_result: dict | None) -> int:
    """The optimizer step whose weights the model holds: the exported (lowest eval_loss) step of a run that
    evaluated during training, else its last step; 0 when unknown. The logged model is the train run's output
    at that step.

    >>> model_step({"steps": 30}), model_step({"steps": 30, "evaluation": {"exported_step": 20}}), model_step(None)
    (30, 20, 0)
    """
    t = train_result or {}
    exported = (t.get("evaluation") or {}).get("exported_step")
    return int(exported or t.get("steps") or 0)


def dataset_tags(train_result: dict | None) -> dict[str, str]:
    """`tokens_md5`: the md5 of the token store (tokens.bin) the model was trained on, from
    train_result.json's lineage (`input_md5.tokens`). It is the number the `dataset_md5` tag used to hold;
    `dataset_md5` is now the DVC md5 of the source data the chain started from (lineage `data_version`, the
    Airflow DAG's data version, packtrain.registry.lineage_tags).

    >>> dataset_tags({"lineage": {"input_md5": {"packs": "9a2b.dir", "tokens": "70ec"}}})
    {'tokens_md5': '70ec'}
    """
    md5 = (((train_result or {}).get("lineage") or {}).get("input_md5") or {})
    return {"tokens_md5": str(md5["tokens"])} if isinstance(md5, dict) and md5.get("tokens") else {}


def parent_tags(train_result: dict | None) -> dict[str, str]:
    """Warm-start lineage of a version from train_result.json's `init` (packtrain.stages.train):
    packtrain.init_from (as configured), packtrain.parent_model_version / packtrain.parent_model (the registered
    version it continued), packtrain.init_fallback_reason (champion had none: what it started from instead).

    >>> parent_tags({"init": {"value": "champion", "name": "lm", "version": "3"}})["packtrain.parent_model"]
    'models:/lm/3'
    """
    init = (train_result or {}).get("init") or {}
    if not init.get("value"):
        return {}
    tags = {"packtrain.init_from": init["value"], "packtrain.init_resolved": init.get("resolved")}
    if init.get("version"):
        tags["packtrain.parent_model_version"] = str(init["version"])
        tags["packtrain.parent_model"] = f"models:/{init.get('name')}/{init['version']}"
    if init.get("reason"):
        tags["packtrain.init_fallback_reason"] = init["reason"]
    return {k: v for k, v in tags.items() if v}


def deferred_result(op: dict, run_id: str | None, shown_uri: str, buffer_dir: str | Path) -> RegisterOutcome:
    """What the register stage reports when the store was unreachable and `op` went to the buffer."""
    return RegisterOutcome(
        model_name=op["name"], version=None, model_uri=None, flavor=op["flavor"], flavor_note="",
        decision=DEFERRED,
        reason=(f"MLflow store {shown_uri} unreachable: registration buffered as op {op['id']} in {buffer_dir} "
                f"(with a copy of the model); the champion/challenger decision is made when it is replayed "
                f"(automatically once the store is back, or `packtrain mlflow replay`)"),
        metric=op["metric"], candidate_value=op["candidate"], champion_value=None,
        previous_champion_version=None, champion_version=None, margin=op["margin"], threshold=None,
        version_tags=dict(op["version_tags"]), lineage_origin=dict(op["lineage_origin"]),
        missing_tags=list(op["missing"]), run_id=run_id, tracking_uri=shown_uri, op_id=op["id"],
        buffer=str(buffer_dir))
