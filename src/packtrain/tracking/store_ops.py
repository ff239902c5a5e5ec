"""Applying one op to the store — idempotently, so a replay that repeats an op changes nothing.

Each kind, and why applying it twice leaves one copy (checked against a real sqlite store and a real
`mlflow server` in tests/faults/test_replay_*.py):

    create_run      the run carries tag packtrain.pending_id=<its pending id>; a buffered create first
                    looks it up — the pending → real id map (run_ids.json) if that run exists in this store,
                    else a search of the experiment for the tag — and reuses the run it finds
    log_batch       metrics: MLflow drops a metric whose (key, timestamp, step, value) is already logged;
                    params: re-logging the same value is accepted; tags: overwritten with the same value
    log_artifact    the same artifact path is overwritten
    log_input       MLflow reuses the (name, digest) dataset and the existing run → dataset link
    set_terminated  sets the same status and end time
    register_model  packtrain.registry.apply.apply_registration (a registered handler, `register_handler`): the
                    logged model and the model version
                    carry tag packtrain.register_op=<op id> and are looked up before being created

Buffered files (artifacts, a model to register) are referenced as `buffered_path`, relative to the buffer
directory, so a copied or moved buffer replays its own copies. A buffer file is data, not instructions:
every path it names is resolved (`..` and symbolic links) and must lie inside `<buffer>/artifacts/`
(`buffered_file`); a line naming anything else is refused (packtrain.tracking.replay), nothing is uploaded
for it and nothing outside the buffer is deleted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packtrain.paths import PathOutsideError, check_links_inside, confined_path
from packtrain.tracking.ledger import write_id
from packtrain.tracking.transport import Blocked

log = logging.getLogger(__name__)
PENDING = "pending-"
PENDING_TAG = "packtrain.pending_id"
ARTIFACTS = "artifacts"   # <buffer>/artifacts/<op id>/<name>: the buffer's copies of the files ops carry
Handler = Callable[[Any, str, str, dict, Path | None], Any]
"""An op kind applied by a room above tracking: handler(client, tracking uri, run id, op, its buffered file)."""
HANDLERS: dict[str, Handler] = {}
"""Op kinds implemented outside the tracking room, registered by their room (`register_handler`):
register_model by packtrain.registry.install_handlers."""
FOREIGN_KINDS = frozenset({"register_model"})
"""The op kinds another room applies: one whose handler this process has not registered stays pending (Blocked),
never rejected, until a process that has it (the CLI, a stage component) replays the buffer."""


def register_handler(kind: str, handler: Handler) -> None:
    """Apply buffered ops of `kind` with `handler` (a plain callable, registered by the room that owns the kind)."""
    HANDLERS[kind] = handler


def buffered_file(buffer_dir: Path, op: dict) -> Path | None:
    """The buffer's own copy of the file/dir an op read from a buffer file carries, resolved and confined:
    every path a buffer line names must lead (after `..` and symbolic links) inside `<buffer_dir>/artifacts/`,
    and a buffered directory holds no link leading out of the buffer; anything else raises
    PathOutsideError (exit 3) and the op is refused. None for an op without a file.

        "buffered_path": "artifacts/<op id>/<name>"      relative to the buffer (a moved buffer finds its copy)
        "path": "<buffer>/artifacts/<uuid>/<name>", "buffered": true    older layout; when the buffer moved,
                                                         <buffer_dir>/artifacts/<uuid>/<name>
        "path": "/anywhere" without either               never written into a buffer: confined all the same
    """
    root = Path(buffer_dir)
    if op.get("buffered_path"):
        path = _in_artifacts(root, op["buffered_path"], "buffered_path")
    elif op.get("path"):
        try:
            path = _in_artifacts(root, op["path"], "path")
        except PathOutsideError:
            moved = Path(ARTIFACTS) / Path(op["path"]).parent.name / Path(op["path"]).name
            if not (op.get("buffered") and (root / moved).exists()):
                raise
            path = _in_artifacts(root, moved, "path (moved buffer)")
    else:
        return None
    check_links_inside(path, Path(os.path.realpath(root)) / ARTIFACTS, "buffered copy")
    return path


def _in_artifacts(root: Path, path: str | Path, what: str) -> Path:
    art = Path(os.path.realpath(root)) / ARTIFACTS
    allowed = f"a path inside {art}"
    real = confined_path(path, root, what, allowed)
    if art not in real.parents:
        raise PathOutsideError(f"{what} {str(path)!r} leads to {real}, not inside the buffer's {ARTIFACTS}/ "
                               f"(allowed: {allowed}, after resolving '..' and symbolic links)")
    return real


def op_file(buffer_dir: Path, op: dict) -> Path | None:
    """The local file/dir an op carries: the buffer's confined copy (`buffered_file`) for an op that went
    through a buffer, else (a live op of this process) the path it was called with."""
    if op.get("buffered_path") or op.get("buffered"):
        return buffered_file(buffer_dir, op)
    return Path(op["path"]) if op.get("path") else None


def drop_copy(buffer_dir: Path, op: dict) -> None:
    """Delete the buffer's own copy of an op's file once the op is recorded as applied: only ever the one
    folder `<buffer_dir>/artifacts/<id>/` its confined copy lies in; nothing for a refused path."""
    import shutil

    if not (op.get("buffered_path") or op.get("buffered")):
        return
    try:
        path = buffered_file(buffer_dir, op)
    except PathOutsideError:
        return
    if path is None:
        return
    art = Path(os.path.realpath(buffer_dir)) / ARTIFACTS
    rel = path.relative_to(art)
    if len(rel.parts) >= 2:   # artifacts/<id>/<name>: the op's own folder; a bare artifacts/<name> stays
        shutil.rmtree(art / rel.parts[0], ignore_errors=True)


def experiment_id(bc, name: str) -> str:
    """Get or create the experiment. A sqlite store keeps artifacts in `mlartifacts/` next to its .db
    (MLflow's own default is ./mlruns under whatever the current directory happens to be)."""
    if name not in bc._experiments:
        c = bc._client
        exp = c.get_experiment_by_name(name)
        if exp is None:
            location = None
            if bc.uri.startswith("sqlite:///"):
                location = (Path(bc.uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()
            with contextlib.suppress(Exception):  # lost a creation race with another process
                c.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND: TRAINING_KIND})
            exp = c.get_experiment_by_name(name)
        if EXPERIMENT_KIND not in (exp.tags or {}):   # an experiment made before packtrain set it, or by hand
            with contextlib.suppress(Exception):
                c.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND, TRAINING_KIND)
        bc._experiments[name] = exp.experiment_id
    return bc._experiments[name]


EXPERIMENT_KIND, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
"""The experiment tag older MLflow 3 UIs read to choose its view (training: runs, metrics, models; not GenAI
traces). MLflow 3.17's UI follows its "GenAI | Model training" switch instead: the links packtrain prints carry
it (packtrain.tracking.links.TRAINING_VIEW). A kind the user chose is kept."""


def run_id_of(bc, run_id: str) -> str:
    rid = bc.resolve(run_id)
    if rid.startswith(PENDING):
        raise Blocked(f"run {rid} was created while the store was down and is not replayed yet")
    return rid


def _known_run(bc, experiment_id: str, pending: str) -> str | None:
    """The run already created for `pending` in this store: the id map's entry if that run exists here
    (the map may come from a replay into another store), else the run tagged packtrain.pending_id."""
    from mlflow.exceptions import MlflowException

    mapped = bc.resolve(pending)
    if mapped != pending:
        try:
            run = bc._client.get_run(mapped)
            if run.info.lifecycle_stage == "active" and run.data.tags.get(PENDING_TAG) == pending:
                return mapped
        except MlflowException:
            pass
    found = bc._client.search_runs([experiment_id], f"tags.`{PENDING_TAG}` = '{pending}'", max_results=1)
    return found[0].info.run_id if found else None


def _create_run(bc, op: dict) -> str:
    c = bc._client
    pending = op["pending_id"]
    tags = dict(op["tags"])
    tags[PENDING_TAG] = pending
    parent = tags.get("mlflow.parentRunId")
    if parent:
        tags["mlflow.parentRunId"] = run_id_of(bc, parent)
    exp = experiment_id(bc, op["experiment"])
    rid = None
    if op.get("buffered_create"):   # maybe created before: by a replay killed before recording the op, from
        rid = _known_run(bc, exp, pending)   # a copy of the buffer, or by a live call that timed out
    if rid is None:
        rid = c.create_run(exp, start_time=op["start_time"], tags=tags, run_name=op["run_name"]).info.run_id
    if op.get("buffered_create"):
        bc._ids[pending] = rid
        write_id(bc.buffer_dir, pending, rid)
    return rid


def apply_op(bc, op: dict) -> Any:
    """Apply `op` through BufferedClient `bc` (its MlflowClient, id map and buffer dir). Returns the run id
    for create_run, the handler's result for handler kinds, else None. Raises on failure (transient or not:
    the caller decides)."""
    from mlflow.entities import Metric, Param, RunTag

    kind = op["op"]
    if kind == "create_run":
        return _create_run(bc, op)
    rid = run_id_of(bc, op["run_id"])
    c = bc._client
    if kind == "log_batch":
        c.log_batch(rid, metrics=[Metric(k, float(v), int(ts), int(s)) for k, v, ts, s in op["metrics"]],
                    params=[Param(k, str(v)) for k, v in op["params"].items()],
                    tags=[RunTag(k, str(v)) for k, v in op["tags"].items()])
    elif kind == "log_artifact":
        path = op_file(bc.buffer_dir, op)
        if path is not None and path.is_dir():
            c.log_artifacts(rid, str(path), artifact_path=op.get("artifact_path"))
        elif path is not None and path.exists():
            c.log_artifact(rid, str(path), artifact_path=op.get("artifact_path"))
        else:
            log.warning("artifact %s vanished before it could be logged", path)
    elif kind == "log_input":
        from mlflow.entities import Dataset, DatasetInput, InputTag

        ds = Dataset(name=op["name"], digest=op["digest"], source_type="local",
                     source=json.dumps({"uri": op["source"]}))
        c.log_inputs(rid, datasets=[DatasetInput(ds, tags=[InputTag("mlflow.data.context", op["context"])])])
    elif kind == "set_terminated":
        c.set_terminated(rid, status=op["status"], end_time=op["end_time"])
    elif kind in HANDLERS:
        return HANDLERS[kind](c, bc.uri, rid, op, op_file(bc.buffer_dir, op))
    elif kind in FOREIGN_KINDS:
        raise Blocked(f"a buffered {kind} op waits for its handler, which this process has not registered "
                      "(packtrain.registry.install_handlers; `packtrain mlflow replay` applies it)")
    else:
        raise ValueError(f"unknown buffered op {kind!r}")
    return None
