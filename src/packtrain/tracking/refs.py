"""Run references as users type them → MLflow run ids.

    resolve_run_ref(client, "3f2a9c0e1b7d4c5a8e6f0a1b2c3d4e5f")   → the same id (checked to exist)
    resolve_run_ref(client, "3f2a9c0e")                           → the one run whose id starts so
    resolve_run_ref(client, "runs:/3f2a9c0e/model")               → the same (artifact path ignored)
    resolve_run_ref(client, "packtrain-lm@champion")              → the source run of that model version
    resolve_run_ref(client, "models:/packtrain-lm@champion")      → (same)
    resolve_run_ref(client, "models:/packtrain-lm/3")             → the source run of version 3

A short prefix needs ≥ 6 hex characters (`packtrain run` prints 8): 16⁶ ≈ 17M, so a store of 1,000 runs
has a 3% chance that some 6-character prefix is shared — then the error lists the candidates. MLflow 3.17
filters `attributes.run_id LIKE 'abc%'` in SQL on sqlite and behind `mlflow server` (tests/stages/
test_run_refs_server.py checks both); the search spans every active experiment, 100 at a time.

`stage_run_of(client, run_id, "train")` walks a pipeline tree: from a pipeline (parent) run or any of its
stage runs to the stage run of that name (the run compare/gate want for curves and throughput).

Errors are `RunRefError` (a MissingDataError with exit code 2, the gate's "missing data"), naming the
reference, what was tried and, for an ambiguous prefix, every candidate with its run name and experiment.
"""

from __future__ import annotations

import re
from typing import Any

from packtrain.errors import MissingDataError

MIN_PREFIX = 6
FULL_ID = re.compile(r"^[0-9a-f]{32}$")
_PREFIX = re.compile(r"^[0-9a-f]+$")
_ALIAS = re.compile(r"^(?:models:/)?(?P<name>[^@/\s]+)@(?P<alias>[\w.\-]+)$")
_VERSION = re.compile(r"^models:/(?P<name>[^@/\s]+)/(?P<version>\d+)$")
_EXPERIMENT_CHUNK = 100
SHORT = 8
"""Characters of the short form `packtrain run` prints (`3f2a9c0e`)."""


class RunRefError(MissingDataError):
    """A run reference that names no run, or more than one."""

    exit_code = 2


def short_id(run_id: str) -> str:
    """The printed short form of a run id.

    >>> short_id("3f2a9c0e1b7d4c5a8e6f0a1b2c3d4e5f")
    '3f2a9c0e'
    """
    return run_id[:SHORT]


def resolve_run_ref(client: Any, ref: str, *, min_prefix: int = MIN_PREFIX) -> str:
    """The full run id `ref` names: a full id, a unique prefix (≥ 6 hex chars), `runs:/ID[/path]`,
    `NAME@ALIAS`, `models:/NAME@ALIAS` or `models:/NAME/VERSION` (the version's source run).

    `client` is an `mlflow.MlflowClient` (a packtrain BufferedClient is unwrapped). Raises RunRefError
    (exit 2) for an unknown run, an ambiguous or too-short prefix, or a model version without a run.
    `min_prefix` lowers the prefix floor (tests use it to provoke an ambiguous prefix).
    """
    client = getattr(client, "_client", client)   # BufferedClient → its MlflowClient
    raw = str(ref).strip()
    if not raw:
        raise RunRefError("run reference is empty: pass a run id (full or ≥ 6-character prefix), "
                          "NAME@ALIAS or models:/NAME/VERSION")
    if m := (_ALIAS.match(raw) or _VERSION.match(raw)):
        return _model_version_run(client, raw, m)
    rid = raw.removeprefix("runs:/").split("/")[0].lower()
    if FULL_ID.match(rid):
        _get_run(client, rid, raw)
        return rid
    if not _PREFIX.match(rid):
        raise RunRefError(f"run {raw!r}: not a run id (32 hex characters), a prefix of one (≥ {MIN_PREFIX} hex "
                          f"characters), NAME@ALIAS or models:/NAME/VERSION")
    if len(rid) < min_prefix:
        raise RunRefError(f"run prefix {raw!r} is too short: give at least {min_prefix} characters of the run id "
                          f"(`packtrain run` prints {SHORT})")
    matches = find_runs_by_prefix(client, rid, limit=10)
    if not matches:
        raise RunRefError(f"run prefix {rid!r}: no run id in the MLflow store starts with it "
                          f"({_store(client)}); check the tracking URI (MLFLOW_TRACKING_URI) or pass the full id")
    if len(matches) > 1:
        listed = "; ".join(_describe(client, r) for r in matches)
        more = " (and maybe more)" if len(matches) >= 10 else ""
        raise RunRefError(f"run prefix {rid!r} is ambiguous: {len(matches)} runs start with it{more}: {listed}. "
                          f"Give more characters")
    return matches[0].info.run_id


def find_runs_by_prefix(client: Any, prefix: str, limit: int = 10) -> list:
    """Active runs (any experiment) whose id starts with `prefix`, at most `limit`."""
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    client = getattr(client, "_client", client)
    exp_ids = [e.experiment_id for e in _all_experiments(client)]
    found: list = []
    for i in range(0, len(exp_ids), _EXPERIMENT_CHUNK):
        try:
            found += client.search_runs(exp_ids[i:i + _EXPERIMENT_CHUNK],
                                        filter_string=f"attributes.run_id LIKE '{prefix}%'",
                                        run_view_type=ViewType.ACTIVE_ONLY, max_results=limit)
        except MlflowException as e:
            raise RunRefError(f"run prefix {prefix!r}: the MLflow store ({_store(client)}) refused a prefix search "
                              f"({_first_line(e)}); pass the full 32-character run id") from None
        if len(found) >= limit:
            break
    return found[:limit]


def stage_run_of(client: Any, run_id: str, stage: str) -> str | None:
    """The `stage` run (run name) of the pipeline tree `run_id` belongs to, or None.

    A pipeline run → its child named `stage`; a stage run → itself when it is that stage, else its sibling;
    a top-level stage run of another stage (a lone CLI stage) → None. When a pipeline ran a stage twice
    (retries), the newest run wins.
    """
    client = getattr(client, "_client", client)
    run = _get_run(client, run_id, run_id)
    tags = run.data.tags
    name = tags.get("mlflow.runName") or run.info.run_name
    if name == stage and tags.get("packtrain.kind") != "pipeline":
        return run.info.run_id
    parent = tags.get("mlflow.parentRunId") or (run.info.run_id if tags.get("packtrain.kind") == "pipeline"
                                                else None)
    if not parent:
        return None
    kids = client.search_runs([run.info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent}' "
                                            f"and attributes.run_name = '{stage}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return kids[0].info.run_id if kids else None


# -- helpers -----------------------------------------------------------------------------------------------
def _model_version_run(client, raw: str, m: re.Match) -> str:
    from mlflow.exceptions import MlflowException

    d = m.groupdict()
    try:
        if "alias" in d:
            mv = client.get_model_version_by_alias(d["name"], d["alias"])
        else:
            mv = client.get_model_version(d["name"], d["version"])
    except MlflowException as e:
        what = f"alias {d['alias']!r}" if "alias" in d else f"version {d['version']}"
        raise RunRefError(f"registered model {raw!r}: {what} of model {d['name']!r} not found in "
                          f"{_store(client)} ({_first_line(e)})") from None
    if not mv.run_id:
        raise RunRefError(f"registered model {raw!r} (version {mv.version}) has no source run")
    return mv.run_id


def _get_run(client, run_id: str, raw: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as e:
        raise RunRefError(f"run {raw!r}: not found in {_store(client)} ({_first_line(e)}); check the tracking "
                          f"URI (MLFLOW_TRACKING_URI)") from None


def _all_experiments(client) -> list:
    from mlflow.entities import ViewType

    out, token = [], None
    while True:
        page = client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        out += list(page)
        token = getattr(page, "token", None)
        if not token:
            return out


def _describe(client, run) -> str:
    name = run.data.tags.get("mlflow.runName") or run.info.run_name or "?"
    kind = run.data.tags.get("packtrain.kind", "")
    return f"{run.info.run_id} ({name}{', ' + kind if kind and kind != name else ''}, experiment " \
           f"{run.info.experiment_id})"


def _store(client) -> str:
    from packtrain.secrets import redact_uri

    uri = getattr(getattr(client, "_tracking_client", None), "tracking_uri", None)
    return f"store {redact_uri(uri)}" if uri else "the MLflow store"


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:200]
