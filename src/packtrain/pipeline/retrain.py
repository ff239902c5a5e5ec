"""The scheduled-retraining steps the Airflow DAG (pipelines/airflow_dag.py) calls, one function per task.

    detect_data_version(cfg)  → {"version", "previous", "changed", "source"}     skip the run when unchanged
    validate_data(cfg, dir)   → validate stats (raises ValidationFailed: nothing is trained)
    run_pipeline(cfg, version)→ {"mode", "registered": {"model_name", "version", "alias"},
                                 "warm_start": {"init_from", "resolved", "parent_version", "fallback_reason"},
                                 "gate": {"verdict", "baseline", ...}, ...}   raises GateFailed (below)
    record_version(cfg, version, registered)   the state file, written only after a successful run

Gate: a scheduled run gates itself against the champion before it moves the alias. `scheduled(cfg)` turns
`register.gate` on (unless the recipe set it), so the register stage lets a version the paired evaluation
promotes over the champion (docs/validation.md) take the alias only if its training run passes `packtrain gate` against the champion's training run
(packtrain.registry.champion; built-in noise-aware rules, or `register.gate_rules`). When it does not, the
champion stays where it is, the new version becomes challenger (its tags `gate`, `gate_failed`,
`decision_reason` say why; the register run holds gate/gate.md) and `run_pipeline` raises
packtrain.gate.GateFailed: exit code 1 for a regression, 2 for missing data (as `packtrain gate`). The
Airflow task fails with that message, the data version is not recorded, and the next schedule tries again.

Replay suite: after a successful run, `record_version` keeps the held-out documents of the data version just
trained on (the tokenize split rule, at most REPLAY_MAX_DOCS) as <workdir>/airflow/replay/replay.jsonl; the
next scheduled run (`scheduled(cfg)`) adds it as evaluation suite "replay" with role regression — the new
version must not get worse than the champion on the earlier data's held-out documents (docs/validation.md).
The first run has none (nothing earlier), and a recipe that declares its own suite "replay" keeps it.

Warm start: the DAG's default recipe (recipes/retrain-cpu.yaml) sets `model.init_from: champion`, so each run
continues the registered champion — the pipeline's tokenize and train stages resolve it
(packtrain.registry.source), the register stage tags the new version with its parent. `warm_start` reads
that lineage back from the registered version's tags (`warm_start_of`).

"DVC data version" = the md5 DVC records for the ingest source (`packtrain.versioning.data_md5`): read from
`<source>.dvc` when the source is DVC-tracked (a `git pull` of a new .dvc file is a new version, no
hashing), otherwise computed; the default corpus hashes exactly the standard-library files it reads.
The last version that was trained on is kept in <workdir>/airflow/last_data_version.json, so a failed run
is retried at the next schedule and an unchanged dataset costs one hash.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

STATE_FILE = Path("airflow") / "last_data_version.json"
REPLAY_FILE = Path("airflow") / "replay" / "replay.jsonl"
REPLAY_MAX_DOCS = 500


def state_path(cfg) -> Path:
    return Path(cfg.workdir) / STATE_FILE


def data_version(cfg) -> tuple[str, str]:
    """(md5, where it came from) of the ingest source as DVC records it."""
    from packtrain.versioning import data_md5, files_md5

    src = cfg.ingest.source
    if src is None:
        from packtrain.data.corpus import select_default_corpus

        corpus = select_default_corpus(cfg.ingest.default_corpus_mb)
        files = {f"{f.label}/{f.relpath}": f.path for f in corpus.files}  # keyed as ingest's input_md5
        return files_md5(files), "default corpus (Python standard library)"
    dvc_file = Path(f"{src}.dvc")
    if dvc_file.is_file():
        import yaml

        outs = (yaml.safe_load(dvc_file.read_text(encoding="utf-8")) or {}).get("outs") or [{}]
        if outs[0].get("md5"):
            return str(outs[0]["md5"]), str(dvc_file)
    return data_md5(src), str(src)


def detect_data_version(cfg, force: bool = False) -> dict:
    """Compare the source's DVC md5 with the last version trained on. First the preflight of the scheduled config
    (packtrain.pipeline.preflight; `here` in local mode, where this worker scores the suites): what would fail
    only after training — a suite this worker cannot score, another recipe's seed-spread record, a LoRA recipe
    the register task would refuse — fails this first task, before ingest."""
    from packtrain.pipeline.preflight import refuse_before_stages

    refuse_before_stages(scheduled(cfg), here=cfg.pipeline.mode == "local")
    version, source = data_version(cfg)
    prev = None
    p = state_path(cfg)
    if p.is_file():
        try:
            prev = json.loads(p.read_text(encoding="utf-8")).get("version")
        except (OSError, json.JSONDecodeError):
            prev = None
    return {"version": version, "previous": prev, "changed": force or version != prev, "source": source}


def validate_data(cfg, out_dir: str | Path) -> dict:
    """Ingest + the GX suite into `out_dir` before any cluster time is spent; raises ValidationFailed.

    Runs through the stage cache (<workdir>/cache, as `packtrain run` does): the local pipeline that
    follows restores ingest and validate instead of redoing them, and a re-triggered run costs nothing.
    """
    import json
    import os

    from packtrain.pipeline.runtime import CACHE_ENV, run_stage_component

    out = Path(out_dir)
    text = json.dumps(cfg.to_dict())
    old = os.environ.get(CACHE_ENV)
    if cfg.pipeline.stage_cache:
        os.environ[CACHE_ENV] = str(Path(cfg.workdir).resolve() / "cache")
    try:
        run_stage_component("ingest", text, {}, str(out / "ingest"))
        stats = run_stage_component("validate", text, {"documents": str(out / "ingest")}, str(out / "validate"))
    finally:
        if old is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = old
    return {**stats, "report_dir": str(out / "validate")}


def run_pipeline(cfg, version: str, *, wait: bool = True) -> dict:
    """`pipeline.mode` local: run_local (the in-process runner of `packtrain run`); cluster: submit to
    `pipeline.kfp_host`, wait, then read
    the registry. Returns {"mode", "registered", ...}."""
    from packtrain.errors import PacktrainError

    cfg = scheduled(cfg)
    if cfg.pipeline.mode == "local":
        from packtrain.pipeline.local import run_local

        res = run_local(cfg)
        s = res["summary"]
        name = s.get("model_name") or cfg.register_.model_name
        out = {"mode": "local", "seconds": res["seconds"], "parent_run_id": res["parent_run_id"],
               "registered": {"model_name": name, "version": s.get("version"), "alias": s.get("alias")},
               "warm_start": warm_start_of(cfg, name, s.get("version"))}
        return {**out, "gate": check_gate(cfg, name, s.get("version"))}
    from packtrain.pipeline.kfp_ops import submit, wait_for_run

    sub = submit(cfg.pipeline.kfp_host or "", cfg=cfg, data_version=version)
    if not wait:
        return {"mode": "cluster", **sub, "registered": None}
    state = wait_for_run(cfg.pipeline.kfp_host, sub["run_id"], cfg.pipeline.run_timeout_s)
    if state.upper() not in ("SUCCEEDED", "SUCCESS"):
        raise PacktrainError(f"KFP run {sub['run_id']} ended {state}: {sub['url']}")
    reg = registered_model(cfg)
    return {"mode": "cluster", **sub, "state": state, "registered": reg,
            "warm_start": warm_start_of(cfg, reg["model_name"], reg["version"]),
            "gate": check_gate(cfg, reg["model_name"], reg["version"])}


def scheduled(cfg):
    """The config a scheduled run uses: `register.gate` None → True, and the replay suite of the previous data
    version added (module doc); explicit values stay."""
    replay = Path(cfg.workdir) / REPLAY_FILE
    if replay.is_file() and not any(s.name == "replay" for s in cfg.evaluate.suites):
        from packtrain.config.evaluate import SuiteConfig

        suite = SuiteConfig(name="replay", role="regression", path=str(replay.resolve()))
        cfg = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(
            update={"suites": [*cfg.evaluate.suites, suite]})})
    if cfg.register_.gate is not None:
        return cfg
    return cfg.model_copy(update={"register_": cfg.register_.model_copy(update={"gate": True})})


def validate_dir(cfg, version: str) -> Path:
    """Where the DAG's validate_data task ingests data version `version` (its documents table is
    <this>/ingest/documents.parquet)."""
    return Path(cfg.workdir) / "airflow" / "validate" / version.replace(".", "_")


def write_replay(cfg, documents: Path) -> Path | None:
    """The held-out documents of `documents` (documents.parquet) as the next run's replay suite (module doc);
    None when the table is not there."""
    import numpy as np
    import pyarrow.parquet as pq

    from packtrain.data.token_store import SPLIT_EVAL
    from packtrain.data.tokenize import split_eval
    from packtrain.publish import atomic_write_text

    if not documents.is_file():
        return None
    t = pq.read_table(documents, columns=["doc_id", "text"]).to_pydict()
    held = split_eval(np.asarray(t["doc_id"], np.int64), cfg.tokenize.eval_fraction) == SPLIT_EVAL
    texts = [x for x, h in zip(t["text"], held, strict=True) if h and x and x.strip()][:REPLAY_MAX_DOCS]
    if not texts:
        return None
    out = Path(cfg.workdir) / REPLAY_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "".join(json.dumps({"text": x}, ensure_ascii=False) + "\n" for x in texts))
    return out


def check_gate(cfg, name: str, version: str | None) -> dict:
    """The gate verdict the register stage tagged on `version`: {} when it was not gated (first champion, lost
    on loss, deferred); raises GateFailed when the gate did not pass (the champion stayed where it was)."""
    if not version:
        return {}
    import mlflow
    from mlflow.exceptions import MlflowException

    from packtrain.gate import GateFailed
    from packtrain.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(cfg)
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    try:
        mv = client.get_model_version(name, version)
    except MlflowException:
        return {}
    t = mv.tags
    if "gate" not in t:
        return {}
    # the register run holds gate/gate.md; versions registered before the train run owned the model had it as run
    register_run = t.get("packtrain.register_run_id") or mv.run_id
    gate = {"verdict": t["gate"], "exit_code": int(t.get("gate_exit_code", 0)), "baseline": t.get("gate_baseline"),
            "failed": t.get("gate_failed", ""), "register_run_id": register_run}
    if gate["exit_code"] != 0:
        raise GateFailed(
            f"scheduled run: {name} v{version} did not pass the gate against the champion {gate['baseline']}: "
            f"{gate['verdict']} — {gate['failed']}. The champion alias stays where it was; v{version} is "
            f"challenger. Table: artifact gate/gate.md of register run {register_run}", gate["exit_code"])
    return gate


def warm_start_of(cfg, name: str, version: str | None) -> dict:
    """{"init_from", "resolved", "parent_version", "fallback_reason"} from a registered version's
    packtrain.* tags (set by the register stage from train_result.json); {} when unknown or unreachable."""
    if not version:
        return {}
    import mlflow
    from mlflow.exceptions import MlflowException

    from packtrain.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(cfg)
    try:
        tags = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version(name, version).tags
    except MlflowException:
        return {}
    out = {"init_from": tags.get("packtrain.init_from"), "resolved": tags.get("packtrain.init_resolved"),
           "parent_version": tags.get("packtrain.parent_model_version"),
           "fallback_reason": tags.get("packtrain.init_fallback_reason")}
    return {k: v for k, v in out.items() if v} if out["init_from"] else {}


def registered_model(cfg) -> dict:
    """{"model_name", "version", "alias"} of the newest version of `register.model_name` in the registry."""
    import mlflow

    from packtrain.tracking import resolve_tracking_uri
    from packtrain.tracking.run_lifecycle import open_fluent_store

    open_fluent_store(resolve_tracking_uri(cfg))
    client = mlflow.MlflowClient()
    name = cfg.register_.model_name
    versions = client.search_model_versions(f"name = '{name}'")
    if not versions:
        return {"model_name": name, "version": None, "alias": None}
    newest = max(versions, key=lambda v: int(v.version))
    aliases = list(getattr(newest, "aliases", []) or [])
    return {"model_name": name, "version": str(newest.version), "alias": aliases[0] if aliases else None}


def record_version(cfg, version: str, registered: dict | None) -> Path:
    """Remember the version trained on (after a successful run only), and keep its held-out documents as the
    next run's replay suite."""
    from packtrain.publish import write_json

    write_replay(cfg, validate_dir(cfg, version) / "ingest" / "documents.parquet")
    p = state_path(cfg)
    write_json(p, {"version": version, "registered": registered, "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
    return p
