"""Apply one registration op: log the model, register the version, set the aliases, log what happened.

    apply_registration(client, uri, run_id, op, model_dir)
      1. decision    packtrain.registry.champion: the paired verdict (op["promotion"]), then (op["gate"]) the gate
      2. log model   once per op (the logged model carries tag packtrain.register_op=<op id>); register.flavor=files
                     copies the exported files as they are (packtrain.registry.model.log_model_dir). The model
                     is the train run's: its source run and the run it is an output of are the pipeline's train
                     stage run, so MLflow shows it there ("Logged models", "Registered models: NAME vN") and the
                     version's run is the train run; a register run with no train run in its tree (`packtrain
                     register` alone) keeps it itself
      3. version     registered with tags: lineage, decision (+ reason), gate verdict, packtrain.train_run_id,
                     packtrain.register_run_id (this run: decision, validation/, gate/)
      4. aliases     champion by compare-and-set, else challenger; packtrain.alias_set marks it done
      5. the run     metrics candidate_value/champion_value/promoted, packtrain.* tags, register_result.json,
                     validation/validation.md + validation.json (and gate/gate.json, gate/gate.md when gated)

Idempotent: applying the op again (a replay killed half-way, a copy of the buffer) creates nothing twice —
the logged model and the version are looked up by the op tag first, and the decision, the previous champion
and the gate verdict are read back from the version's tags.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from packtrain.gate.metric_sources import (
    TRAIN_RUN_TAG,  # the version's training run: what `gate NAME@ALIAS` reads
)
from packtrain.registry.adapter import log_adapter
from packtrain.registry.champion import (
    CHALLENGER,
    CHAMPION,
    ChampionGate,
    alias_version,
    as_float,
    current_champion,
    decide_from_verdict,
    gate_against_champion,
    move_champion,
)
from packtrain.registry.outcome import RegisterOutcome

OP_TAG = "packtrain.register_op"
"""Tag on the logged model and the model version: the id of the registration op that made them."""
REGISTER_RUN_TAG = "packtrain.register_run_id"
"""Version tag: the register run that decided (its register_result.json, validation/ and gate/ artifacts); the
version's own run is the train run that owns the model."""
ALIAS_SET_TAG = "packtrain.alias_set"
"""Version tag written once its alias (champion or challenger) is set: a repeat of the op leaves aliases alone."""


def _version_of_op(client, name: str, oid: str):
    """The model version an earlier attempt of op `oid` registered, or None."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_model_versions(f"name = '{name}' and tags.`{OP_TAG}` = '{oid}'")
    except MlflowException:   # no such registered model yet
        return None
    return found[0] if found else None


CONTENT_TAGS = ("model_md5", "dataset_md5", "tokens_md5", "tokenizer_hash")
"""What makes two registrations the same content: the weights' md5 and the lineage they were trained from (the data
version, the token store, the tokenizer). A version with all four equal is registered once."""
UNKNOWN_OK = ("tokens_md5", "tokenizer_hash")
"""Content tags that a registration may lack (no train_result.json: `packtrain register` without --train): unknown on
either side does not make the same weights of the same data version another version."""


def _same_content(a: dict, b: dict) -> bool:
    """CONTENT_TAGS equal, a tag of UNKNOWN_OK missing on either side counting as equal.

    >>> t = {"model_md5": "m", "dataset_md5": "d", "tokens_md5": "t", "tokenizer_hash": "h"}
    >>> _same_content(t, {**t, "tokens_md5": None}), _same_content(t, {**t, "tokens_md5": "u"})
    (True, False)
    """
    return all(a.get(k) == b.get(k) or (k in UNKNOWN_OK and not (a.get(k) and b.get(k))) for k in CONTENT_TAGS)


def version_of_content(client, name: str, tags: dict[str, str]):
    """The oldest version of `name` whose CONTENT_TAGS equal `tags`' (tokens_md5 / tokenizer_hash missing on either
    side count as equal: `_same_content`), or None. A registration without model_md5 or without a data lineage
    (dataset_md5: a model registered by hand from a directory) is always a new version. A `--no-cache` rerun, a
    rerun after kill -9 during register, or `packtrain register` of the same weights without --train finds the
    version the first run registered."""
    from mlflow.exceptions import MlflowException

    md5 = tags.get("model_md5")
    if not md5 or not tags.get("dataset_md5"):
        return None
    try:
        found = client.search_model_versions(f"name = '{name}' and tags.model_md5 = '{md5}'")
    except MlflowException:   # no such registered model yet
        return None
    same = [v for v in found if _same_content(v.tags or {}, tags)]
    return min(same, key=lambda v: int(v.version)) if same else None


def _log_model_once(client, run_id: str, op: dict, model_dir: Path, card: str, step: int = 0
                    ) -> tuple[str, str, str, float]:
    """(model_id, flavor, note, seconds) of the op's logged model, an output of run `run_id` (the train run) at
    `step` (its last optimizer step: MLflow links that step's loss, tokens/s and MFU to the model); logged only
    when no earlier attempt finished it (an attempt is finished once its model carries the packtrain.flavor
    tag)."""
    from packtrain.registry.adapter import registry_model_dir
    from packtrain.registry.model import ARTIFACT_NAME, log_model_dir

    exp = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models([exp], filter_string=f"tags.`{OP_TAG}` = '{op['id']}'", max_results=1)
    if found and found[0].tags.get("packtrain.flavor"):
        t = found[0].tags
        return found[0].model_id, t["packtrain.flavor"], t.get("packtrain.flavor_note", ""), \
            float(t.get("packtrain.log_model_s", 0.0))
    model_id = found[0].model_id if found else client.create_logged_model(
        exp, name=ARTIFACT_NAME, source_run_id=run_id, tags={OP_TAG: op["id"]}).model_id
    model_dir = registry_model_dir(model_dir)   # a LoRA model/: its merged/ (plain transformers)
    _, flavor, note, log_s = log_model_dir(model_dir, op["flavor"], op["pip_requirements"], card,
                                           model_id=model_id, run_id=run_id, step=step)
    client.set_logged_model_tags(model_id, {"packtrain.flavor": flavor, "packtrain.flavor_note": note[:4000],
                                            "packtrain.log_model_s": f"{log_s:.3f}"})
    return model_id, flavor, note, log_s


def train_run_of(client, run_id: str) -> str | None:
    """The train stage run of the pipeline tree `run_id` (the register run) belongs to, or None."""
    from packtrain.errors import MissingDataError
    from packtrain.gate.metric_sources import stage_runs

    try:
        train = stage_runs(client, client.get_run(run_id))[1].get("train")
    except MissingDataError:
        return None
    return train.info.run_id if train is not None else None


def gate_step(client, run_id: str, op: dict, decision: str, reason: str, prev_version: str | None
              ) -> tuple[str, str, ChampionGate | None]:
    """(decision, reason, gate) after gating a would-be champion against the champion (op["gate"] on and
    a champion to beat); gate.json/gate.md logged under the run's gate/ artifacts."""
    if not (op.get("gate") and decision == CHAMPION and prev_version):
        return decision, reason, None
    tmp = Path(tempfile.mkdtemp(prefix="packtrain-gate-"))
    try:
        g = gate_against_champion(client, run_id, op["name"], prev_version, op.get("gate_rules"), tmp)
        for f in g.files:
            client.log_artifact(run_id, str(f), "gate")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if g.exit_code == 0:
        return decision, f"{reason}; gate PASS against champion {g.baseline}", g
    return CHALLENGER, (f"gate {g.verdict} (exit {g.exit_code}) against champion {g.baseline}: {g.summary}; the "
                        f"champion stays (by the paired evaluation alone: {reason})"), g


def _register_new_version(client, run_id: str, op: dict, model_dir: Path | None, promo: dict | None):
    """A new version of op["name"] for the model at `model_dir`: the decision against the current champion
    (and its gate), the model logged once under the train run, the version registered with its tags.
    Returns (model version, decision, reason, gate, had, prev_version, prev_value, flavor, note, log_s)."""
    import mlflow

    from packtrain.errors import MissingDataError

    name, metric, oid, candidate = op["name"], op["metric"], op["id"], float(op["candidate"])
    had, prev_version, _ = current_champion(client, name, metric)
    decision, reason = decide_from_verdict(promo, had, prev_version)
    prev_value = champion_value_of(promo) if promo and promo.get("against") == f"v{prev_version}" else None
    if model_dir is None or not Path(model_dir).is_dir():
        raise MissingDataError(f"registration op {oid}: model directory {model_dir} is gone")
    decision, reason, gate = gate_step(client, run_id, op, decision, reason, prev_version)
    card = (f"# {name}\n\n{metric}: {candidate:.6g}; decision: {decision} ({reason})\n\n"
            + "\n".join(f"- {k}: {v}" for k, v in op["version_tags"].items()))
    train_run = train_run_of(client, run_id)
    model_id, flavor, note, log_s = _log_model_once(client, train_run or run_id, op, Path(model_dir), card,
                                                    int(op.get("step") or 0) if train_run else 0)
    if os.environ.get("PACKTRAIN_FAULT"):   # tests: die between the logged model and its version
        from packtrain.faults import kill_point

        kill_point("register.model_logged")
    tags = {**op["version_tags"], "decision": decision, "decision_reason": reason[:4000], "flavor": flavor,
            "previous_champion_version": prev_version, "had_champion": str(had).lower(),
            "previous_champion_value": prev_value, "log_model_s": f"{log_s:.3f}", OP_TAG: oid,
            TRAIN_RUN_TAG: train_run, REGISTER_RUN_TAG: run_id, **(gate.tags() if gate else {}),
            **log_adapter(client, run_id, Path(model_dir)),   # LoRA: adapter files → artifact adapter/
            **(validation_tags(promo) if promo else {})}
    mv = mlflow.register_model(f"models:/{model_id}", name,
                               tags={k: str(v) for k, v in tags.items() if v is not None})
    if os.environ.get("PACKTRAIN_FAULT"):   # tests: die between the version and its alias
        from packtrain.faults import kill_point

        kill_point("register.version_registered")
    return mv, decision, reason, gate, had, prev_version, prev_value, flavor, note, log_s


def _log_decision(client, run_id: str, op: dict, decision: str, reason: str, version: str,
                  prev_version: str | None, prev_value: float | None, gate: str | None) -> None:
    """The register run's numbers and tags of the decision, at the op's time (a re-applied op logs the same
    points)."""
    from mlflow.entities import Metric, RunTag

    name, oid, candidate = op["name"], op["id"], float(op["candidate"])
    ts = int(float(op.get("ts") or time.time()) * 1000)   # the op's time: a re-applied op logs the same points
    numbers = {"candidate_value": candidate, "promoted": float(decision == CHAMPION)}
    if prev_value is not None:
        numbers["champion_value"] = prev_value
    run_tags = {"packtrain.decision": decision, "packtrain.model_version": version,
                "packtrain.registered_model": name, "packtrain.decision_reason": reason[:4000],
                "packtrain.previous_champion_version": prev_version, OP_TAG: oid,
                "packtrain.gate": gate}
    client.log_batch(run_id, metrics=[Metric(k, float(v), ts, 0) for k, v in numbers.items()],
                     tags=[RunTag(k, str(v)) for k, v in run_tags.items() if v is not None])


def apply_registration(client, tracking_uri: str, run_id: str, op: dict, model_dir: Path | None,
                       before_alias: Callable[[str], None] | None = None) -> dict:
    """Apply registration `op` to run `run_id` (module doc). Returns RegisterOutcome.to_dict().

    `before_alias(version)` runs between the decision and the compare-and-set (tests move the alias
    there with a second client).
    """
    from packtrain.secrets import redact_uri
    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    name, metric, oid, candidate = op["name"], op["metric"], op["id"], float(op["candidate"])
    set_fluent_tracking_uri(tracking_uri)   # Model.log and create_model_version read the global URI
    t0 = time.perf_counter()
    mv = _version_of_op(client, name, oid)
    gate = None
    promo = op.get("promotion")
    threshold = -float(op["margin"]) if promo and promo.get("against") else None
    existing = mv is None and (mv := version_of_content(client, name, op["version_tags"])) is not None
    if existing:   # these weights, from this lineage, are registered already: point at that version
        had, prev_version, _ = current_champion(client, name, metric)
        decision, reason = decide_from_verdict(promo, had, prev_version)
        prev_value = champion_value_of(promo) if promo and promo.get("against") == f"v{prev_version}" else None
        if prev_version == str(mv.version):
            decision, reason = CHAMPION, f"v{prev_version} holds the {CHAMPION} alias (this evaluation: {reason})"
        else:
            decision, reason, gate = gate_step(client, run_id, op, decision, reason, prev_version)
        t = mv.tags
        flavor, note, log_s = t.get("flavor", ""), "registered by an earlier run", float(t.get("log_model_s", 0.0))
        md5 = op["version_tags"].get("model_md5", "")
        reason = (f"already registered: {name} v{mv.version} holds these weights (model md5 {md5[:12]}, same "
                  f"data and tokenizer): no new version; {reason}")
    elif mv is None:
        mv, decision, reason, gate, had, prev_version, prev_value, flavor, note, log_s = \
            _register_new_version(client, run_id, op, model_dir, promo)
    else:   # an earlier attempt registered it: read back what it decided
        t = mv.tags
        decision, reason, flavor = t.get("decision", CHALLENGER), t.get("decision_reason", ""), t.get("flavor", "")
        prev_version, prev_value = t.get("previous_champion_version"), as_float(t.get("previous_champion_value"))
        had, note, log_s = t.get("had_champion") == "true", "registered by an earlier attempt", \
            float(t.get("log_model_s", 0.0))
    version = str(mv.version)
    vtags = dict(mv.tags)
    champion_now = prev_version
    if existing and vtags.get("decision") != decision:   # e.g. kept before, promoted now (allow_unguarded)
        # the verdict that moved it replaces the earlier one: its validation* tags, and this run (its validation/)
        changed = {"decision": decision, "decision_reason": reason[:4000], REGISTER_RUN_TAG: run_id,
                   **(validation_tags(promo) if promo else {})}
        vtags.update(changed)
        for key, value in changed.items():
            client.set_model_version_tag(name, version, key, value)
    if mv.tags.get(ALIAS_SET_TAG) and not existing:   # an earlier attempt finished the aliases: never again
        champion_now = alias_version(client, name, CHAMPION)
    elif decision == CHAMPION:
        if before_alias is not None:
            before_alias(version)
        champion_now, lost = move_champion(client, tracking_uri, name, version, prev_version)
        if lost:   # moved by another registration since we read it
            decision, reason = CHALLENGER, f"{lost} (its own comparison: {reason})"
            vtags.update(decision=CHALLENGER, decision_reason=reason[:4000])
            client.set_model_version_tag(name, version, "decision", CHALLENGER)
            client.set_model_version_tag(name, version, "decision_reason", vtags["decision_reason"])
    if decision == CHALLENGER and (existing or not mv.tags.get(ALIAS_SET_TAG)):
        client.set_registered_model_alias(name, CHALLENGER, version)
    if not mv.tags.get(ALIAS_SET_TAG):
        client.set_model_version_tag(name, version, ALIAS_SET_TAG, decision)
        vtags[ALIAS_SET_TAG] = decision
    _log_decision(client, run_id, op, decision, reason, version, prev_version, prev_value, vtags.get("gate"))
    result = RegisterOutcome(
        model_name=name, version=version, model_uri=f"models:/{name}/{version}", flavor=flavor,
        flavor_note=note, decision=decision, reason=reason, metric=metric, candidate_value=candidate,
        champion_value=prev_value, previous_champion_version=prev_version, champion_version=champion_now,
        margin=op["margin"], threshold=threshold, version_tags=vtags,
        lineage_origin=dict(op["lineage_origin"]), missing_tags=list(op["missing"]), log_model_s=log_s,
        register_s=time.perf_counter() - t0, run_id=run_id, tracking_uri=redact_uri(tracking_uri) or "",
        op_id=oid, existing=existing).to_dict()
    _publish_result(client, run_id, op, result)
    if promo:
        _publish_validation(client, run_id, promo)
    return result


def champion_value_of(promo: dict) -> float | None:
    """The champion's value of the primary suite (bits/byte) in a verdict dict."""
    for s in promo.get("suites", []):
        if s["role"] == "primary" and s.get("champion") is not None:
            return float(s["champion"])
    return None


def validation_tags(promo: dict) -> dict[str, str]:
    from packtrain.evaluate.promotion import PromotionVerdict

    return PromotionVerdict.from_dict(promo).tags()


def _publish_validation(client, run_id: str, promo: dict) -> None:
    """validation/validation.md + validation/validation.json artifacts of the register run."""
    from packtrain.evaluate.promotion import PromotionVerdict, verdict_markdown

    tmp = Path(tempfile.mkdtemp(prefix="packtrain-validation-"))
    try:
        (tmp / "validation.json").write_text(json.dumps(promo, indent=2) + "\n", encoding="utf-8")
        (tmp / "validation.md").write_text(verdict_markdown(PromotionVerdict.from_dict(promo)), encoding="utf-8")
        client.log_artifacts(run_id, str(tmp), "validation")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish_result(client, run_id: str, op: dict, result: dict) -> None:
    """register_result.json as an artifact of the run (overwritten on a repeat), and over the stage's
    deferred register_result.json when that file is still there and names this op."""
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
            old = json.loads(out.read_text(encoding="utf-8"))
            if old.get("op_id") == op["id"]:   # the stage's file keeps its lineage (packtrain.stages.results)
                from packtrain.publish import write_json

                result = {**result, **({"lineage": old["lineage"]} if "lineage" in old else {})}
                write_json(out, result)   # fsynced temp + rename
