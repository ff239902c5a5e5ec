"""Register a trained model in the MLflow Model Registry and move the champion/challenger aliases.

    eval_result (eval_loss 3.91) ─┐
    champion v3 (tag eval_loss 4.02) ─→ decide_alias(3.91, 4.02, margin 0.01): 3.91 < 4.02·0.99 = 3.98
                                     → log model, register v4 (tags), champion v3 → v4 *if still v3*
    otherwise                          alias challenger → v4, champion stays on v3

Lower is better (eval_loss or perplexity). The first version of a name becomes champion. Every version is
tagged with eval_loss/perplexity (so a later run can compare against it), the decision, the lineage
(dataset md5, git sha, packing fill, MFU, peak memory: packtrain.evaluate.lineage) and `missing_tags`.

Compare-and-set: the champion alias moves only from the version the candidate was gated against. Right
before `set_registered_model_alias` the alias is read again; if another registration moved it meanwhile
(v3 → v5), v4 does not take it: v4 becomes challenger, reason "champion moved from v3 to v5 while v4 was
being registered (gated against v3) …". MLflow has no atomic compare-and-set, so the re-read and the write
are two requests; for a sqlite store they run under an flock on `<db>.alias.lock`, which makes them atomic
between processes of one machine; against a server the window is those two requests (~ms), not the whole
log_model (seconds to minutes) as before.

One registration is one op (`build_registration`) applied by `apply_registration`, live or from the MLflow
buffer when the store was down (packtrain.tracking.buffer; the stage then reports decision "deferred").
Applying it again (a replay killed half-way, a copy of the buffer) creates nothing twice: the logged model
and the version carry tag packtrain.register_op=<op id> and are looked up first; the decision and the
previous champion are read back from the version's tags.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packtrain.config import RegisterConfig
from packtrain.errors import ConfigError, InputDataError

CHAMPION, CHALLENGER, DEFERRED = "champion", "challenger", "deferred"
OP_TAG = "packtrain.register_op"
"""Tag on the logged model and the model version: the id of the registration op that made them."""
ALIAS_SET_TAG = "packtrain.alias_set"
"""Version tag written once its alias (champion or challenger) is set: a repeat of the op leaves aliases alone."""


@dataclass
class RegisterResult:
    """What `register_model` did. `to_dict()` is register_result.json."""

    model_name: str
    version: str | None                   # the new version, e.g. "4" (None: deferred)
    model_uri: str | None                 # models:/<name>/<version>
    flavor: str                           # transformers | pytorch
    flavor_note: str                      # why this flavor
    decision: str                         # champion | challenger | deferred (store down: buffered)
    reason: str                           # one line, with both numbers (or both versions)
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
    tracking_uri: str = ""                # redacted: https://user:***@host
    op_id: str | None = None              # the registration op (tag packtrain.register_op)
    buffer: str | None = None             # deferred: the buffer directory holding the op and a model copy

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


def build_registration(model_dir: str | Path, eval_result, train_result_path: str | Path | None,
                       cfg: RegisterConfig, pack_stats: dict | None = None) -> dict:
    """The registration op: everything `apply_registration` needs, JSON-able, no MLflow call.

    {"op": "register_model", "id": <uuid hex>, "path": "/abs/model", "name": "packtrain-lm",
     "metric": "eval_loss", "candidate": 3.91, "margin": 0.01, "flavor": "auto", "pip_requirements": [...],
     "version_tags": {"eval_loss": "3.91", ..., "dataset_md5": ..., "missing_tags": "none"},
     "lineage_origin": {...}, "missing": [...]}
    """
    from packtrain.evaluate.lineage import collect_lineage, read_optional_json
    from packtrain.evaluate.registry import default_pip_requirements
    from packtrain.tracking.context import git_sha

    ev = _eval_dict(eval_result)
    candidate = _as_float(ev.get(cfg.metric))
    if candidate is None:
        raise InputDataError(f"eval result: field {cfg.metric!r} is missing or not a number "
                             f"(got {ev.get(cfg.metric)!r}); register.metric allows eval_loss, perplexity")
    train = read_optional_json(train_result_path)
    lineage, origin, missing = collect_lineage(
        {"train_result": train, "pack_stats": pack_stats if pack_stats is not None else ev.get("lineage")},
        checkout_sha=git_sha())   # cwd, then packtrain's source tree
    tags = {"eval_loss": ev.get("eval_loss"), "perplexity": ev.get("perplexity"),
            "eval_tokens_per_s": ev.get("tokens_per_s"), "metric": cfg.metric, **lineage,
            "missing_tags": ",".join(missing) or "none", **parent_tags(train)}
    reqs = list(cfg.pip_requirements) if cfg.pip_requirements is not None else default_pip_requirements()
    return {"op": "register_model", "id": uuid.uuid4().hex, "path": str(Path(model_dir).resolve()),
            "name": cfg.model_name, "metric": cfg.metric, "candidate": candidate, "margin": cfg.margin,
            "flavor": cfg.flavor, "pip_requirements": reqs,
            "version_tags": {k: str(v) for k, v in tags.items() if v is not None},
            "lineage_origin": origin, "missing": missing}


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


def deferred_result(op: dict, run_id: str | None, shown_uri: str, buffer_dir: str | Path) -> RegisterResult:
    """What the register stage reports when the store was unreachable and `op` went to the buffer."""
    return RegisterResult(
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


@contextlib.contextmanager
def _alias_lock(tracking_uri: str) -> Iterator[None]:
    """An flock next to a sqlite store's file (no-op for other stores): makes the compare-and-set atomic
    between processes on this machine."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    db = Path(tracking_uri[len("sqlite:///"):])
    with open(db.with_name(db.name + ".alias.lock"), "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        yield


def _alias_version(client, name: str, alias: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def _version_of_op(client, name: str, oid: str):
    """The model version an earlier attempt of op `oid` registered, or None."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_model_versions(f"name = '{name}' and tags.`{OP_TAG}` = '{oid}'")
    except MlflowException:   # no such registered model yet
        return None
    return found[0] if found else None


def _log_model_once(client, run_id: str, op: dict, model_dir: Path, card: str) -> tuple[str, str, str, float]:
    """(model_id, flavor, note, seconds) of the op's logged model; logged only when no earlier attempt
    finished it (an attempt is finished once its model carries the packtrain.flavor tag)."""
    from packtrain.evaluate.loading import load_model_dir
    from packtrain.evaluate.registry import ARTIFACT_NAME, log_model

    exp = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models([exp], filter_string=f"tags.`{OP_TAG}` = '{op['id']}'", max_results=1)
    if found and found[0].tags.get("packtrain.flavor"):
        t = found[0].tags
        return found[0].model_id, t["packtrain.flavor"], t.get("packtrain.flavor_note", ""), \
            float(t.get("packtrain.log_model_s", 0.0))
    model_id = found[0].model_id if found else client.create_logged_model(
        exp, name=ARTIFACT_NAME, source_run_id=run_id, tags={OP_TAG: op["id"]}).model_id
    model, tokenizer = load_model_dir(model_dir, "cpu")
    _, flavor, note, log_s = log_model(model, tokenizer, model_dir, op["flavor"], op["pip_requirements"], card,
                                       model_id=model_id, run_id=run_id)
    client.set_logged_model_tags(model_id, {"packtrain.flavor": flavor, "packtrain.flavor_note": note[:4000],
                                            "packtrain.log_model_s": f"{log_s:.3f}"})
    return model_id, flavor, note, log_s


def apply_registration(client, tracking_uri: str, run_id: str, op: dict, model_dir: Path | None,
                       before_alias: Callable[[str], None] | None = None) -> dict:
    """Apply registration `op` to run `run_id`: log the model, register a version, compare-and-set the
    champion alias (or set challenger), tag the run, log register_result.json. Idempotent (module doc).

    `before_alias(version)` runs between the decision and the compare-and-set (tests move the alias
    there with a second client). Returns RegisterResult.to_dict().
    """
    import mlflow
    from mlflow.entities import Metric, RunTag

    from packtrain.errors import MissingDataError
    from packtrain.secrets import redact_uri
    from packtrain.tracking.run import set_fluent_tracking_uri

    name, metric, oid, candidate = op["name"], op["metric"], op["id"], float(op["candidate"])
    set_fluent_tracking_uri(tracking_uri)   # Model.log and create_model_version read the global URI
    t0 = time.perf_counter()
    mv = _version_of_op(client, name, oid)
    if mv is None:
        had, prev_version, prev_value = current_champion(client, name, metric)
        decision, reason, threshold = decide_alias(candidate, prev_value, op["margin"], had)
        if model_dir is None or not Path(model_dir).is_dir():
            raise MissingDataError(f"registration op {oid}: model directory {model_dir} is gone")
        card = (f"# {name}\n\n{metric}: {candidate:.6g}; decision: {decision} ({reason})\n\n"
                + "\n".join(f"- {k}: {v}" for k, v in op["version_tags"].items()))
        model_id, flavor, note, log_s = _log_model_once(client, run_id, op, Path(model_dir), card)
        if os.environ.get("PACKTRAIN_FAULT"):   # tests: die between the logged model and its version
            from packtrain.faults import kill_point

            kill_point("register.model_logged")
        tags = {**op["version_tags"], "decision": decision, "decision_reason": reason[:4000], "flavor": flavor,
                "previous_champion_version": prev_version, "had_champion": str(had).lower(),
                "previous_champion_value": prev_value, "log_model_s": f"{log_s:.3f}", OP_TAG: oid}
        mv = mlflow.register_model(f"models:/{model_id}", name,
                                   tags={k: str(v) for k, v in tags.items() if v is not None})
    else:   # an earlier attempt registered it: read back what it decided
        t = mv.tags
        decision, reason, flavor = t.get("decision", CHALLENGER), t.get("decision_reason", ""), t.get("flavor", "")
        prev_version, prev_value = t.get("previous_champion_version"), _as_float(t.get("previous_champion_value"))
        had, note, log_s = t.get("had_champion") == "true", "registered by an earlier attempt", \
            float(t.get("log_model_s", 0.0))
        threshold = decide_alias(candidate, prev_value, op["margin"], had)[2]
    version = str(mv.version)
    vtags = dict(mv.tags)
    champion_now = prev_version
    if mv.tags.get(ALIAS_SET_TAG):   # an earlier attempt finished the aliases: never move them again
        champion_now = _alias_version(client, name, CHAMPION)
    elif decision == CHAMPION:
        if before_alias is not None:
            before_alias(version)
        with _alias_lock(tracking_uri):
            champion_now = _alias_version(client, name, CHAMPION)   # compare ...
            if champion_now == prev_version:
                client.set_registered_model_alias(name, CHAMPION, version)   # ... and set
                champion_now = version
            elif champion_now != version:   # moved by another registration since we read it
                decision = CHALLENGER
                reason = (f"champion moved from {_v(prev_version)} to {_v(champion_now)} while v{version} was "
                          f"being registered (gated against {_v(prev_version)}); v{version} kept as challenger "
                          f"(its own comparison: {reason})")
                vtags.update(decision=CHALLENGER, decision_reason=reason[:4000])
                client.set_model_version_tag(name, version, "decision", CHALLENGER)
                client.set_model_version_tag(name, version, "decision_reason", vtags["decision_reason"])
    if decision == CHALLENGER and not mv.tags.get(ALIAS_SET_TAG):
        client.set_registered_model_alias(name, CHALLENGER, version)
    if not mv.tags.get(ALIAS_SET_TAG):
        client.set_model_version_tag(name, version, ALIAS_SET_TAG, decision)
        vtags[ALIAS_SET_TAG] = decision
    ts = int(float(op.get("ts") or time.time()) * 1000)   # the op's time: a re-applied op logs the same points
    numbers = {f"candidate_{metric}": candidate, "promoted": float(decision == CHAMPION)}
    if prev_value is not None:
        numbers[f"champion_{metric}"] = prev_value
    run_tags = {"packtrain.decision": decision, "packtrain.model_version": version,
                "packtrain.registered_model": name, "packtrain.decision_reason": reason[:4000],
                "packtrain.previous_champion_version": prev_version, OP_TAG: oid}
    client.log_batch(run_id, metrics=[Metric(k, float(v), ts, 0) for k, v in numbers.items()],
                     tags=[RunTag(k, str(v)) for k, v in run_tags.items() if v is not None])
    result = RegisterResult(
        model_name=name, version=version, model_uri=f"models:/{name}/{version}", flavor=flavor,
        flavor_note=note, decision=decision, reason=reason, metric=metric, candidate_value=candidate,
        champion_value=prev_value, previous_champion_version=prev_version, champion_version=champion_now,
        margin=op["margin"], threshold=threshold, version_tags=vtags,
        lineage_origin=dict(op["lineage_origin"]), missing_tags=list(op["missing"]), log_model_s=log_s,
        register_s=time.perf_counter() - t0, run_id=run_id, tracking_uri=redact_uri(tracking_uri) or "",
        op_id=oid).to_dict()
    _publish_result(client, run_id, op, result)
    return result


def _v(version: str | None) -> str:
    return f"v{version}" if version else "no champion"


def _publish_result(client, run_id: str, op: dict, result: dict) -> None:
    """register_result.json as an artifact of the run (overwritten on a repeat), and over the stage's
    deferred register_result.json when that file is still there and names this op."""
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="packtrain-register-"))
    try:
        (tmp / "register_result.json").write_text(json.dumps(result, indent=2, default=str) + "\n",
                                                  encoding="utf-8")
        client.log_artifact(run_id, str(tmp / "register_result.json"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = Path(op["result_path"]) if op.get("result_path") else None
    if out is not None and out.is_file():
        with contextlib.suppress(OSError, ValueError):
            if json.loads(out.read_text(encoding="utf-8")).get("op_id") == op["id"]:
                new = out.with_name(f".{out.name}.{os.getpid()}.tmp")
                new.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
                new.replace(out)


def register_model(model_dir: str | Path, eval_result, train_result_path: str | Path | None,
                   cfg: RegisterConfig, tracker=None, pack_stats: dict | None = None,
                   before_alias: Callable[[str], None] | None = None) -> RegisterResult:
    """Log the model in `model_dir`, register a version under `cfg.model_name` and compare-and-set the
    champion alias, or set challenger (module doc).

    eval_result: EvalResult or its dict (eval_result.json). train_result_path: train_result.json, may be
    missing. pack_stats: pack_stats.json's lineage keys (run_evaluate copies them into eval_result.json
    under "lineage"; used when None). tracker: the stage's StageRun — the registration is then one op of
    its buffered client, and comes back with decision "deferred" when the store is unreachable. Without a
    tracker: the active MLflow run, or a new "register" run, on the current tracking URI.
    """
    import mlflow
    from mlflow import MlflowClient

    if tracker is not None and not tracker.enabled:
        raise ConfigError("register needs MLflow: tracking.enabled is false (set tracking.enabled=true)")
    op = build_registration(model_dir, eval_result, train_result_path, cfg, pack_stats)
    if tracker is not None:
        out = tracker.submit(op)
        if out is None:
            client = tracker.client
            return deferred_result(op, tracker.run_id, client.shown_uri, client.buffer_dir)
        return RegisterResult(**out)
    with contextlib.ExitStack() as stack:
        if mlflow.active_run() is None:
            stack.enter_context(mlflow.start_run(run_name="register"))
        run_id = mlflow.active_run().info.run_id
        out = apply_registration(MlflowClient(), mlflow.get_tracking_uri(), run_id,
                                 {**op, "ts": time.time()}, Path(op["path"]), before_alias)
    return RegisterResult(**out)
