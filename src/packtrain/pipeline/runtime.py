"""Running one stage of the table: what both runners of `packtrain run` and the KFP components call.

    stats = run_stage("pack", cfg, {"tokens": tokens_dir}, packs_dir, cache_dir=workdir / "cache", parent=run_id)
    stats = run_stage_component("pack", config_json, {"tokens": tokens.path}, packs.path, kfp_run_id=...)
    return publish_stats(stats, packs, metrics)      # artifact metadata + Metrics artifact + JSON string

`run_stage` (the in-process runner, packtrain.pipeline.dag, calls it once per stage):
1. with a `cache_dir`, looks the stage up in the stage cache (packtrain.pipeline.cache) and restores the output
   on a hit; with a `parent` it logs the stage run under it right there (`log_cache_hit`), tagged
   `packtrain.cache=hit`: a copy of the run that produced the output, whose id the runner's stats carry as
   `mlflow_run` (packtrain.tracking.restore);
2. otherwise calls the stage runner, `RUNNERS[stage]` (packtrain.stages.<stage>.run_<stage>), with the artifact
   directories, and stores its output in the cache.
A stage's PacktrainError propagates unchanged (its class carries the exit code).

`run_stage_component` (one KFP pod, or one kfp.local subprocess under `packtrain run --runner kfp`):
1. writes the RunConfig (one JSON/YAML string, the pipeline's `config` parameter) to a temp file and
   loads it with `load_run_config` (same validation as the CLI);
2. exports KFP_RUN_ID (MLflow tag `kfp.run_id`) and, on a cluster, finds or opens the pipeline's parent
   MLflow run (tag `packtrain.pipeline_run=<kfp run id>`) so stage runs nest under it; it is named after the
   recipe, and `<recipe> · data <8 hex>` once the ingest stage ran (packtrain.tracking.layout);
3. calls `run_stage`, with the stage cache when PACKTRAIN_STAGE_CACHE_DIR is set (only `packtrain run
   --runner kfp` sets it);
4. on a PacktrainError writes the error record (packtrain.error_record.write_error_record: stage, message, exit
   code, class) to PACKTRAIN_ERROR_FILE when set, so `packtrain run --runner kfp` re-raises the same error
   from another process without parsing logs, then re-raises.

Inputs are named by artifact, the names of the stage table (packtrain.stages.table: the KFP components'
parameter names); `runner_args` maps them onto the runner's positional directories:

    ingest   ()                        validate ("documents",)       tokenize ("documents",)
    pack     ("tokens",)               train    ("packs", "tokens")  evaluate ("model", "packs")
    register ("model", "evaluation")   — "model" is the train stage's output dir; its saved model is model/model
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from packtrain.error_record import ERROR_FILE_ENV, write_error_record
from packtrain.errors import ConfigError, MissingDataError, PacktrainError
from packtrain.stages.evaluate import run_evaluate
from packtrain.stages.ingest import run_ingest
from packtrain.stages.pack import run_pack
from packtrain.stages.register import run_register
from packtrain.stages.table import STAGE_NAMES, stage_spec
from packtrain.stages.tokenize import run_tokenize
from packtrain.stages.train import run_train
from packtrain.stages.validate import run_validate
from packtrain.tracking.context import PARENT_ENV

CACHE_ENV = "PACKTRAIN_STAGE_CACHE_DIR"
REFRESH_ENV = "PACKTRAIN_STAGE_CACHE_REFRESH"
"""Set to 1 (`packtrain run --no-cache`): every stage runs, and its fresh output replaces its cache entry."""
ERROR_ENV = ERROR_FILE_ENV
"""Where a KFP component writes the error record of a failed stage (`packtrain run --runner kfp` sets it)."""
CODE_ENV = "PACKTRAIN_CODE_VERSION"

RUNNERS: dict[str, Callable[..., Any]] = {
    "ingest": run_ingest, "validate": run_validate, "tokenize": run_tokenize, "pack": run_pack,
    "train": run_train, "evaluate": run_evaluate, "register": run_register,
}
"""The runner of each stage of the table: `run_<stage>(cfg, *input dirs, out_dir)` (packtrain.stages)."""
assert tuple(RUNNERS) == STAGE_NAMES, "one runner per stage of the table, in its order"


def config_from_text(text: str):
    """RunConfig from the pipeline's `config` string (JSON or YAML of `RunConfig.to_dict()`)."""
    from packtrain.config import load_run_config

    if not text or not text.strip():
        raise ConfigError("pipeline parameter 'config' is empty: pass the RunConfig as JSON/YAML "
                          "(packtrain pipeline submit does this from --recipe/--set)")
    with tempfile.TemporaryDirectory(prefix="packtrain-cfg-") as d:
        path = Path(d) / "run_config.yaml"
        path.write_text(text, encoding="utf-8")
        return load_run_config(path)


def config_parts(stage: str, cfg, inputs: dict[str, str] | None = None) -> dict[str, Any]:
    """The config a stage's output depends on: its cache key and nothing else.

    Exactly the sections/fields its stage-table entry declares (`StageSpec.config`, keyed by dotted path),
    plus what no recipe field says but the output depends on:
    - ingest: `source`, the md5 of the source directory (or the default corpus' Python installation) in place
      of the `ingest.source` path: the same documents in another directory are the same key;
    - tokenize, train with `model.init_from` not scratch: `init`, what it resolves to
      (packtrain.registry.source.cache_identity: the init tokenizer's hash; the registered version or
      the directory's fingerprint), so a new champion is a miss and the same one a hit; train then also
      holds its `init_config` (the step-0 evaluation's `evaluate` section);
    - validate, tokenize: what the contamination check reads (contamination_sources.sources_identity): the
      md5 of each suite's files (a task's data files too) and `against` entry, and `champion_domain`, the
      champion version whose held-out documents it reads and their md5 now, so an edited eval file or a new
      champion (or a first one) is a miss;
    - evaluate: `against`, the champion version it scores next to the model and every suite's files' md5
      (packtrain.evaluate.paired_scores.evaluate_identity);
    - register: `tracking.resolved_uri`, where the registry really is (MLFLOW_TRACKING_URI wins), redacted
      because the key parts are written to disk (cache entry.json); a password never changes the registry.

    >>> sorted(config_parts("train", load_run_config("tiny-cpu")))
    ['model', 'pack.budget', 'plan', 'telemetry', 'train']
    """
    spec = stage_spec(stage)
    d = cfg.to_dict()
    parts: dict[str, Any] = {path: _at(d, path) for path in spec.config}
    if "ingest" in parts:   # the source by content, not by where it lies: a copy elsewhere is the same key
        parts["source"] = _source_fingerprint(cfg.ingest.source)   # (ingest; evaluate for its seed-spread match)
        parts["ingest"] = {k: v for k, v in parts["ingest"].items() if k != "source"}
    if stage in ("tokenize", "train"):
        from packtrain.registry.source import cache_identity

        init = cache_identity(cfg, stage)
        if init is not None:
            parts["init"] = init
            parts.update({path: _at(d, path) for path in spec.init_config})
    if stage in ("validate", "tokenize"):   # what the contamination check reads: eval files, the champion
        from packtrain.data.contamination_sources import sources_identity

        parts.update(sources_identity(cfg, (inputs or {}).get("documents")))
    if stage == "evaluate":   # the champion it is compared with and the suite files' md5 (a new champion: a miss)
        from packtrain.evaluate.paired_scores import evaluate_identity
        from packtrain.versioning import data_md5

        model = Path(inputs["model"]) / "model" if inputs and "model" in inputs else None
        parts["against"] = evaluate_identity(cfg, data_md5(model) if model is not None and model.is_dir() else None)
    if stage == "register":
        from packtrain.secrets import redact_uri
        from packtrain.tracking import resolve_tracking_uri

        parts["tracking.resolved_uri"] = redact_uri(resolve_tracking_uri(cfg))
    return parts


def _at(d: dict, path: str) -> Any:
    """`_at({"pack": {"budget": 512}}, "pack.budget")` → 512 (a stage table path into RunConfig.to_dict())."""
    for part in path.split("."):
        d = d[part]
    return d


def _source_fingerprint(src: str | None) -> str:
    """md5 of the ingest source; the default corpus is fixed by the Python installation."""
    import sys

    from packtrain.pipeline.cache import dir_md5

    if src is None:
        import sysconfig

        return f"default-corpus:{sys.version.split()[0]}:{sysconfig.get_paths()['stdlib']}"
    return dir_md5(src)


def read_inputs(stage: str, inputs: dict[str, str]) -> dict[str, Path]:
    """{`artifact[/path]`: path} of what the stage's runner reads (StageSpec.read_paths): the stage cache key's
    inputs. A train output's checkpoints/ key nothing downstream.

    >>> read_inputs("evaluate", {"model": "/a/model", "packs": "/a/packs"})
    {'model/model': PosixPath('/a/model/model'), 'packs': PosixPath('/a/packs')}
    """
    out = {}
    for arg in stage_spec(stage).read_paths:
        name, _, sub = arg.partition("/")
        out[arg] = Path(inputs[name]) / sub if sub else Path(inputs[name])
    return out


def runner_args(stage: str, inputs: dict[str, str]) -> list[Path]:
    """Positional input directories of `run_<stage>` from the named artifact paths (`StageSpec.args`).

    >>> runner_args("register", {"model": "/a/model", "evaluation": "/a/eval"})
    [PosixPath('/a/model/model'), PosixPath('/a/eval'), PosixPath('/a/model')]
    """
    spec = stage_spec(stage)
    missing = [n for n in spec.inputs if not inputs.get(n)]
    if missing:
        unknown = sorted(set(inputs) - set(spec.inputs))
        raise MissingDataError(f"stage {stage}: missing input(s) {missing} (needs {list(spec.inputs)}"
                               + (f"; got unknown {unknown}" if unknown else "") + ")")
    out = []
    for arg in spec.args:
        name, _, sub = arg.partition("/")
        out.append(Path(inputs[name]) / sub if sub else Path(inputs[name]))
    return out


def run_stage(stage: str, cfg, inputs: Mapping[str, str | Path], out_dir: str | Path, *,
              cache_dir: Path | None = None, parent: str | None = None, code_version: str = "",
              data_version: str = "") -> dict:
    """Run one stage on the named artifact directories (see the module docstring); returns its stats dict
    (+ "cache": "hit" | "miss" | "skipped (...)" and "cache_key" with a `cache_dir`). `parent`: the pipeline's
    MLflow run, under which a cache hit is logged here (`log_cache_hit`); without it a hit logs nothing (a KFP
    component: `packtrain run --runner kfp` logs its hits after the DAG, MLflow's import costs ~2.5 s a
    component). `train` resumes from its own checkpoints: a retried pod (same output dir) continues its killed
    attempt instead of being refused; a fresh output dir starts at step 0."""
    from packtrain.registry import install_handlers
    from packtrain.tracking.run_lifecycle import stage_run_record

    install_handlers()   # a buffered registration can be replayed by any stage's tracked run
    paths = {k: str(v) for k, v in inputs.items()}
    args = runner_args(stage, paths)
    if cache_dir is not None:
        from packtrain.pipeline.cache import StageCache

        key, parts, key_s = _cache_key(stage, cfg, paths, code_version)
        cache = StageCache(Path(cache_dir))
        hit = None if os.environ.get(REFRESH_ENV) == "1" else cache.lookup(stage, key)
        if hit is not None:
            cache.restore(hit, out_dir)
            print(f"[packtrain] {stage}: cache hit {key[:12]} (inputs, config and code unchanged)", flush=True)
            stats = {**hit.stats, "cache": "hit", "cache_key": key, "cache_key_s": key_s}
            if parent:
                log_cache_hit(parent, cfg, stage, stats)
            return stats
    before = stage_run_record(stage)   # an earlier stage run of this process (an earlier in-process DAG run)
    stats = stats_dict(RUNNERS[stage](cfg, *args, Path(out_dir), **({"resume": True} if stage == "train" else {})))
    if stage == "ingest":   # the data version is known now: the pipeline run's name says it
        from packtrain.tracking.layout import data_version_of
        from packtrain.tracking.run_lifecycle import name_pipeline_run

        name_pipeline_run(cfg, data_version_of(stats))
    rec = stage_run_record(stage)
    # + "mlflow_run" {run_id, tracking_uri}: a cache hit later copies that run (packtrain.tracking.restore);
    # only the run this call opened (tracking off or rank ≠ 0: none)
    stats = _with_versions({**stats, "mlflow_run": rec} if rec is not None and rec != before else stats,
                           code_version, data_version)
    if cache_dir is None:
        return stats
    if stats.get("decision") == "deferred":   # a buffered registration is not a result to restore next time
        return {**stats, "cache": "skipped (registration deferred)", "cache_key_s": key_s}
    cache.store(stage, key, out_dir, stats, parts)
    return {**stats, "cache": "miss", "cache_key_s": key_s}


def run_stage_component(stage: str, config_text: str, inputs: dict[str, str], out_dir: str, *,
                        kfp_run_id: str = "", code_version: str = "", data_version: str = "") -> dict:
    """Run one stage as a pipeline step (see the module docstring); returns the stage's stats dict."""
    from packtrain.process_exit import freeze_heap_at_exit
    from packtrain.registry import install_handlers

    freeze_heap_at_exit()   # a pod's process ends after this step
    install_handlers()   # before the parent run's client: it may replay a buffered registration
    try:
        cfg = config_from_text(config_text)
        if kfp_run_id:
            os.environ["KFP_RUN_ID"] = kfp_run_id
        _ensure_parent_run(cfg, kfp_run_id)
        cache_dir = os.environ.get(CACHE_ENV)
        stats = run_stage(stage, cfg, inputs, out_dir, cache_dir=Path(cache_dir) if cache_dir else None,
                          code_version=code_version, data_version=data_version)
        return {**stats, "kfp_run_id": os.environ.get("KFP_RUN_ID", "")} if stats.get("cache") == "hit" else stats
    except PacktrainError as e:
        write_error_record(os.environ.get(ERROR_ENV), e, stage)
        raise


def _cache_key(stage: str, cfg, inputs: dict[str, str], code_version: str) -> tuple[str, dict, float]:
    """(key, its parts, seconds spent hashing) of the stage cache entry (packtrain.pipeline.cache).
    PACKTRAIN_CODE_VERSION pins the code part (set in the images; tests pin it too), else the package version +
    git sha + md5 of the package source, so an uncommitted edit also invalidates the cache."""
    from packtrain.pipeline.cache import source_md5, stage_cache_key
    from packtrain.versioning import code_version as cur_code

    t_key = time.perf_counter()
    code = os.environ.get(CODE_ENV) or f"{code_version or cur_code()}:{source_md5()}"
    key, parts = stage_cache_key(stage, read_inputs(stage, inputs), config_parts(stage, cfg, inputs), code)
    return key, parts, round(time.perf_counter() - t_key, 3)   # hashing what the stage reads: part of its wall time


def log_cache_hit(parent: str, cfg, stage: str, stats: dict) -> str:
    """A stage restored from the cache still gets its run under the parent, and a complete one: a copy of the
    run that produced the cached output (`stats["mlflow_run"]`, recorded when the stage really ran) — metrics
    with their histories, params, tags, datasets, artifacts (packtrain.tracking.restore) — tagged
    packtrain.cache=hit, packtrain.restored_from=<origin run id>, the key and the KFP run id. Params of the
    stage's config section the origin lacks are added; without a readable origin the cached stats are logged
    as metrics. Updates `stats["mlflow_run"]` to the new run and sets `stats["restored_from"]`.
    The stage's final numbers go to the parent at once (`<stage>.<key>`, as a stage that runs logs them), and a
    restored ingest names the parent after the data version; the register stage then finds the pipeline's train
    run (the model's owner) and its numbers even when train was cached. Returns the new run id."""
    from packtrain.config import flatten
    from packtrain.tracking import StageRun
    from packtrain.tracking.context import base_tags
    from packtrain.tracking.layout import data_version_of
    from packtrain.tracking.restore import restore_run
    from packtrain.tracking.run_lifecycle import get_client, name_pipeline_run

    client = get_client(cfg)
    tags = {**base_tags("stage", cfg.name, stage), "mlflow.parentRunId": client.resolve(parent),
            "packtrain.cache": "hit", "packtrain.cache_key": stats.get("cache_key", ""),
            "kfp.run_id": stats.get("kfp_run_id", "")}
    run_id = client.create_run(cfg.tracking.experiment, stage, {k: v for k, v in tags.items() if v})
    handle = StageRun(client, run_id, stage)
    origin = stats.get("mlflow_run") if isinstance(stats.get("mlflow_run"), dict) else None
    copy = restore_run(client, run_id, origin)
    section = stage_section(stage, cfg)
    if section is not None:
        own = {f"{stage}.{k}": v for k, v in flatten(section.model_dump(mode="json")).items()}
        handle.log_params({k: v for k, v in own.items() if k not in copy.get("param_keys", ())})
    if not copy["copied"]:
        handle.log_metrics(flat_numbers(stats))
    client.set_terminated(run_id, "FINISHED")
    StageRun(client, parent, "pipeline").log_metrics({f"{stage}.{k}": v for k, v in flat_numbers(stats).items()})
    if stage == "ingest":
        name_pipeline_run(cfg, data_version_of(stats), parent)
    stats["restored_from"] = origin
    stats["mlflow_run"] = {"run_id": client.resolve(run_id), "tracking_uri": client.shown_uri}
    return run_id


def flat_numbers(stats: dict) -> dict:
    """The numeric leaves of a stats dict, flattened: {'train.fill': 0.998, 'seconds': 1.2, ...}."""
    from packtrain.config import flatten

    return {k: v for k, v in flatten(stats).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def stats_dict(result: Any) -> dict:
    """A runner's result as a plain dict: typed results (packtrain.stages.results) through their `as_dict`;
    dicts (older runners) as they are."""
    if result is None:
        return {}
    if isinstance(result, dict):
        return dict(result)
    from packtrain.stages.results import as_dict

    return as_dict(result)


def _with_versions(stats: dict, code_version: str, data_version: str) -> dict:
    stats = dict(stats or {})
    if code_version:
        stats.setdefault("code_version", code_version)
    if data_version:
        stats.setdefault("data_version", data_version)
    return stats


def stage_section(stage: str, cfg):
    """The config section a stage logs as params (`validate`/`register` are `validate_`/`register_`)."""
    return {"validate": cfg.validate_, "register": cfg.register_, "train": cfg.train}.get(
        stage, getattr(cfg, stage, None))


def _ensure_parent_run(cfg, kfp_run_id: str) -> None:
    """On a cluster nobody opened the parent run: the first stage opens it, later stages find it by tag.

    Locally (`packtrain run`, Airflow) PACKTRAIN_PARENT_RUN_ID is already set and this does nothing.
    """
    if os.environ.get(PARENT_ENV) or not cfg.tracking.enabled or not kfp_run_id:
        return
    import mlflow

    from packtrain.tracking import resolve_tracking_uri
    from packtrain.tracking.run_lifecycle import open_fluent_store

    open_fluent_store(resolve_tracking_uri(cfg))
    exp = mlflow.set_experiment(cfg.tracking.experiment)
    client = mlflow.MlflowClient()
    found = client.search_runs([exp.experiment_id],
                               filter_string=f"tags.`packtrain.pipeline_run` = '{kfp_run_id}'", max_results=1)
    if found:
        os.environ[PARENT_ENV] = found[0].info.run_id
        return
    from packtrain.tracking.layout import pipeline_run_name

    run = client.create_run(exp.experiment_id, run_name=pipeline_run_name(cfg.name, None),   # + data: after ingest
                            tags={"packtrain.pipeline_run": kfp_run_id, "kfp.run_id": kfp_run_id,
                                  "packtrain.recipe": cfg.name})
    os.environ[PARENT_ENV] = run.info.run_id


def metadata_of(stats) -> dict:
    """Flat scalar view of stats (a dict or a typed result) for KFP artifact metadata:
    {'fill': 0.998, 'train.tokens_per_s': ...}."""
    from packtrain.config import flatten

    out: dict[str, Any] = {}
    for k, v in flatten(stats_dict(stats)).items():
        if isinstance(v, bool) or isinstance(v, (int, float, str)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)) and len(v) <= 16 and all(isinstance(x, (int, float, str)) for x in v):
            out[k] = list(v)
    return out


def publish_stats(stats, artifact, metrics) -> str:
    """Stats → `artifact.metadata`, numeric leaves → `metrics.log_metric`; returns the stats as JSON."""
    stats = stats_dict(stats)
    meta = metadata_of(stats)
    artifact.metadata.update(meta)
    for k, v in meta.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            metrics.log_metric(k, float(v))
    return json.dumps(stats, default=str, sort_keys=True)
