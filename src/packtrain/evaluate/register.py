"""Register a trained model in the MLflow Model Registry and move the champion/challenger aliases.

    eval_result (eval_loss 3.91) ─┐
    champion v3 (tag eval_loss 4.02) ─→ decide_alias(3.91, 4.02, margin 0.01): 3.91 < 4.02·0.99 = 3.98
                                     → log model, register v4 (tags), alias champion → v4
    otherwise                          alias challenger → v4, champion stays on v3

Lower is better (eval_loss or perplexity). The first version of a name becomes champion. Every version is
tagged with eval_loss/perplexity (so a later run can compare against it), the decision, the lineage
(dataset md5, git sha, packing fill, MFU, peak memory: packtrain.evaluate.lineage) and `missing_tags`.
Concurrent registrations of one name are not serialized: the last alias write wins.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packtrain.config import RegisterConfig
from packtrain.errors import ConfigError, InputDataError

CHAMPION, CHALLENGER = "champion", "challenger"


@dataclass
class RegisterResult:
    """What `register_model` did. `to_dict()` is register_result.json."""

    model_name: str
    version: str                          # the new version, e.g. "4"
    model_uri: str                        # models:/<name>/<version>
    flavor: str                           # transformers | pytorch
    flavor_note: str                      # why this flavor
    decision: str                         # champion | challenger
    reason: str                           # one line, with both numbers
    metric: str                           # eval_loss | perplexity
    candidate_value: float
    champion_value: float | None          # the previous champion's metric (None: there was none)
    previous_champion_version: str | None
    champion_version: str | None          # who holds the champion alias now
    margin: float
    threshold: float | None               # champion_value · (1 − margin): beat this to take the alias
    version_tags: dict[str, str] = field(default_factory=dict)
    lineage_origin: dict[str, str] = field(default_factory=dict)
    missing_tags: list[str] = field(default_factory=list)
    log_model_s: float = 0.0
    register_s: float = 0.0
    run_id: str | None = None
    tracking_uri: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def decide_alias(candidate: float, champion: float | None, margin: float, has_champion: bool = True
                 ) -> tuple[str, str, float | None]:
    """(decision, reason, threshold). Lower is better; the candidate must be < champion · (1 − margin).

    >>> decide_alias(3.9, 4.0, 0.01)[0], decide_alias(3.97, 4.0, 0.01)[0], decide_alias(5.0, None, 0.0, False)[0]
    ('champion', 'challenger', 'champion')
    """
    if not math.isfinite(candidate):
        return CHALLENGER, f"candidate metric {candidate} is not finite: never champion", None
    if not has_champion:
        return CHAMPION, f"first champion: no version held the {CHAMPION} alias", None
    if champion is None:
        return CHALLENGER, "the champion has no recorded metric to compare against; kept", None
    if not math.isfinite(champion):
        return CHAMPION, f"champion metric {champion} is not finite; candidate {candidate:.6g} takes it", None
    threshold = champion * (1.0 - margin)
    if candidate < threshold:
        return CHAMPION, (f"candidate {candidate:.6g} < champion {champion:.6g} × (1 − {margin:g}) = "
                          f"{threshold:.6g}"), threshold
    return CHALLENGER, (f"candidate {candidate:.6g} ≥ champion {champion:.6g} × (1 − {margin:g}) = "
                        f"{threshold:.6g}"), threshold


def _as_float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def current_champion(client, name: str, metric: str) -> tuple[bool, str | None, float | None]:
    """(has_champion, version, metric value) of `name@champion`; the value from the version's tag, else
    from its run's metrics (`eval_loss`/`perplexity` or `candidate_<metric>`)."""
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return False, None, None
    value = _as_float(mv.tags.get(metric))
    if value is None and mv.run_id:
        try:
            m = client.get_run(mv.run_id).data.metrics
            value = _as_float(m.get(metric, m.get(f"candidate_{metric}")))
        except MlflowException:
            value = None
    return True, str(mv.version), value


def _eval_dict(eval_result) -> dict:
    return eval_result.to_dict() if hasattr(eval_result, "to_dict") else dict(eval_result)


def register_model(model_dir: str | Path, eval_result, train_result_path: str | Path | None,
                   cfg: RegisterConfig, tracker=None, pack_stats: dict | None = None) -> RegisterResult:
    """Log the model in `model_dir` to the active MLflow run (or a new "register" run), register a version
    under `cfg.model_name` and set the champion or challenger alias (see module doc).

    eval_result: EvalResult or its dict (eval_result.json). train_result_path: train_result.json, may be
    missing. pack_stats: pack_stats.json's lineage keys (run_evaluate copies them into eval_result.json
    under "lineage"; used when None). tracker: the stage's StageRun (metrics/tags go there too).
    """
    import contextlib

    import mlflow
    from mlflow import MlflowClient

    from packtrain.evaluate.lineage import collect_lineage, read_optional_json
    from packtrain.evaluate.loading import load_model_dir
    from packtrain.evaluate.registry import default_pip_requirements, log_model
    from packtrain.tracking.run import git_sha

    ev = _eval_dict(eval_result)
    candidate = _as_float(ev.get(cfg.metric))
    if candidate is None:
        raise InputDataError(f"eval result: field {cfg.metric!r} is missing or not a number "
                             f"(got {ev.get(cfg.metric)!r}); register.metric allows eval_loss, perplexity")
    if tracker is not None and not tracker.enabled:
        raise ConfigError("register needs MLflow: tracking.enabled is false (set tracking.enabled=true)")
    train = read_optional_json(train_result_path)
    lineage, origin, missing = collect_lineage(
        {"train_result": train, "pack_stats": pack_stats if pack_stats is not None else ev.get("lineage")},
        checkout_sha=git_sha())   # cwd, then packtrain's source tree
    model_dir = Path(model_dir).resolve()   # absolute: mlflow never mistakes it for a hub repo id
    model, tokenizer = load_model_dir(model_dir, "cpu")
    client = MlflowClient()
    t0 = time.perf_counter()
    had, prev_version, prev_value = current_champion(client, cfg.model_name, cfg.metric)
    decision, reason, threshold = decide_alias(candidate, prev_value, cfg.margin, had)
    tags = {"eval_loss": ev.get("eval_loss"), "perplexity": ev.get("perplexity"),
            "eval_tokens_per_s": ev.get("tokens_per_s"), "metric": cfg.metric, "decision": decision,
            "previous_champion_version": prev_version, **lineage,
            "missing_tags": ",".join(missing) or "none"}
    tags = {k: str(v) for k, v in tags.items() if v is not None}
    reqs = list(cfg.pip_requirements) if cfg.pip_requirements is not None else default_pip_requirements()
    card = (f"# {cfg.model_name}\n\n{cfg.metric}: {candidate:.6g}; decision: {decision} ({reason})\n\n"
            + "\n".join(f"- {k}: {v}" for k, v in tags.items()))
    with contextlib.ExitStack() as stack:
        if mlflow.active_run() is None:
            stack.enter_context(mlflow.start_run(run_name="register"))
        run_id = mlflow.active_run().info.run_id
        info, flavor, note, log_s = log_model(model, tokenizer, model_dir, cfg.flavor, reqs, card)
        tags["flavor"] = flavor
        mv = mlflow.register_model(info.model_uri, cfg.model_name, tags=tags)
        version = str(mv.version)
        client.set_registered_model_alias(cfg.model_name, decision, version)
        numbers = {f"candidate_{cfg.metric}": candidate, "promoted": float(decision == CHAMPION),
                   "log_model_s": log_s}
        if prev_value is not None:
            numbers[f"champion_{cfg.metric}"] = prev_value
        run_tags = {"packtrain.decision": decision, "packtrain.model_version": version,
                    "packtrain.registered_model": cfg.model_name, "packtrain.decision_reason": reason,
                    "packtrain.previous_champion_version": prev_version}
        if tracker is not None:
            tracker.log_metrics(numbers)
            tracker.set_tags(run_tags)
        else:
            mlflow.log_metrics(numbers)
            mlflow.set_tags({k: str(v) for k, v in run_tags.items() if v is not None})
    return RegisterResult(
        model_name=cfg.model_name, version=version, model_uri=f"models:/{cfg.model_name}/{version}",
        flavor=flavor, flavor_note=note, decision=decision, reason=reason, metric=cfg.metric,
        candidate_value=candidate, champion_value=prev_value, previous_champion_version=prev_version,
        champion_version=version if decision == CHAMPION else prev_version, margin=cfg.margin,
        threshold=threshold, version_tags=tags, lineage_origin=origin, missing_tags=missing,
        log_model_s=log_s, register_s=time.perf_counter() - t0, run_id=run_id,
        tracking_uri=mlflow.get_tracking_uri())
