"""`packtrain run`: the whole KFP DAG on this machine through `kfp.local.SubprocessRunner(use_venv=False)`.

    run_local(cfg) → {"stages": {stage: stats}, "summary": {...}, "parent_run_id", "tracking_uri",
                      "mlflow_ui", "seconds", "log"}

1. Opens the parent MLflow run (embedded sqlite store <workdir>/mlflow.db unless MLFLOW_TRACKING_URI is
   set) and exports PACKTRAIN_PARENT_RUN_ID + MLFLOW_TRACKING_URI so every component's stage run nests
   under it.
2. Runs the same pipeline that is compiled for the cluster (pipelines/kfp_pipeline.py), each component in
   a subprocess of this venv; artifacts under <workdir>/kfp/<run>/<task>/.
3. Stage cache (PACKTRAIN_STAGE_CACHE_DIR=<workdir>/cache, see packtrain.pipeline.cache): a second run on
   unchanged data, config and code restores every stage from the cache (~5 s a stage: process start +
   imports + an MLflow stage run tagged packtrain.cache=hit).
4. A failing stage (e.g. validation) stops the DAG before the next stage; the component writes its
   error to <workdir>/kfp/last_error.json and this raises the same PacktrainError (message names the
   report, exit code 4 for a failed validation).
5. The ingested documents are versioned in a DVC repo (<workdir>/dataset) and pushed to a local DVC remote
   (<workdir>/dvc-remote); the summary shows their md5.
6. The component logs go to <workdir>/logs/run-<time>-<pid>.log (never reused); the terminal shows one line
   per stage, then the summary and the `mlflow ui --backend-store-uri ...` command. The whole run holds the
   workdir lock (packtrain.pipeline.lock): a second `packtrain run` in the same workdir stops with exit 7.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
import warnings
from pathlib import Path

from packtrain import STAGES
from packtrain.errors import PacktrainError
from packtrain.paths import patched_env
from packtrain.pipeline.runtime import CACHE_ENV, ERROR_ENV, PARENT_ENV

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_START = re.compile(r"Executing task '([\w-]+)'")
_END = re.compile(r"Task '([\w-]+)' finished with status (\w+)")
_HIT = re.compile(r"\[packtrain\] ([\w-]+): cache hit")


class _StageLog:
    """A stdout stand-in: everything goes to the log file; the terminal gets one line per stage."""

    def __init__(self, path: Path, out, verbose: bool):
        self.path, self.out, self.verbose = path, out, verbose
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "x", encoding="utf-8")   # never truncates another run's log
        self.buf = ""
        self.t0: dict[str, float] = {}
        self.hits: set[str] = set()
        self.tail: list[str] = []

    def write(self, s: str) -> int:
        self.f.write(s)
        if self.verbose:
            self.out.write(s)
        self.buf += s
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            self._line(_ANSI.sub("", line))
        return len(s)

    def _line(self, line: str) -> None:
        self.tail = (self.tail + [line])[-60:]
        if m := _START.search(line):
            self.t0[m.group(1)] = time.perf_counter()
            self.tail = []
            if not self.verbose:
                i = STAGES.index(m.group(1)) + 1 if m.group(1) in STAGES else 0
                self.out.write(f"[{i}/{len(STAGES)}] {m.group(1):<9} ")
                self.out.flush()
        elif m := _HIT.search(line):
            self.hits.add(m.group(1))
        elif m := _END.search(line):
            stage, status = m.groups()
            dt = time.perf_counter() - self.t0.get(stage, time.perf_counter())
            if not self.verbose:
                note = " (cached)" if stage in self.hits else ""
                self.out.write(f"{status.lower()} in {dt:.1f} s{note}\n")
                self.out.flush()

    def flush(self) -> None:
        self.f.flush()
        self.out.flush()

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        if self.buf:
            self._line(_ANSI.sub("", self.buf))
        self.f.close()


_env = patched_env


def _start_parent(cfg) -> str | None:
    """The parent run (packtrain.tracking.start_pipeline_run: flattened config as params, exports
    PACKTRAIN_PARENT_RUN_ID so every component's stage run nests under it)."""
    import mlflow  # noqa: F401  (imported first: its import resets the "mlflow" logger to INFO)

    from packtrain.pipeline.cache import code_version
    from packtrain.tracking import StageRun, start_pipeline_run
    from packtrain.tracking.run import get_client

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # not "Creating initial MLflow database tables"
    parent = start_pipeline_run(cfg)
    if parent:
        StageRun(get_client(cfg), parent, "pipeline").set_tags(
            {"packtrain.runner": "kfp.local", "packtrain.code_version": code_version()})
    return parent


def _end_parent(cfg, parent: str, status: str, metrics: dict, tags: dict) -> None:
    from packtrain.tracking import StageRun, end_pipeline_run
    from packtrain.tracking.run import get_client

    handle = StageRun(get_client(cfg), parent, "pipeline")
    handle.log_metrics(metrics)
    handle.set_tags(tags)
    end_pipeline_run(parent, status, cfg)


def log_cached_stage_runs(parent: str, cfg, stages: dict[str, dict]) -> list[str]:
    """A stage restored from the cache still gets its run under the parent: params = its config section,
    metrics = the cached stats, tags = the usual stage tags + packtrain.cache=hit, the key and the KFP run
    id. Returns the new run ids."""
    from packtrain.config import flatten
    from packtrain.pipeline.runtime import stage_section
    from packtrain.tracking import StageRun
    from packtrain.tracking.context import base_tags
    from packtrain.tracking.run import get_client

    client = get_client(cfg)
    ids = []
    for stage, stats in stages.items():
        if stats.get("cache") != "hit":
            continue
        tags = {**base_tags("stage", cfg.name, stage), "mlflow.parentRunId": client.resolve(parent),
                "packtrain.cache": "hit", "packtrain.cache_key": stats.get("cache_key", ""),
                "kfp.run_id": stats.get("kfp_run_id", "")}
        run_id = client.create_run(cfg.tracking.experiment, stage, {k: v for k, v in tags.items() if v})
        handle = StageRun(client, run_id, stage)
        section = stage_section(stage, cfg)
        if section is not None:
            handle.log_params({f"{stage}.{k}": v for k, v in flatten(section.model_dump(mode="json")).items()})
        handle.log_metrics(_flat_numbers(stats))
        client.set_terminated(run_id, "FINISHED")
        ids.append(run_id)
    return ids


def snapshot_documents(workdir: Path) -> dict | None:
    """Version the ingested documents of the newest local run in a DVC repo with a local remote.

        <workdir>/dataset/            DVC repo (no git: core.no_scm), documents.parquet + documents.parquet.dvc
        <workdir>/dvc-remote/         its default remote (`dvc push` target; point it at S3/GCS to share)

    Returns {"md5", "pushed", "repo", "remote"}; idempotent (an unchanged table pushes 0 files).
    """
    import shutil

    from packtrain.versioning import data_md5, ensure_dvc_repo, push

    runs = sorted((workdir / "kfp").glob("packtrain-*/ingest/documents/documents.parquet"),
                  key=lambda p: p.stat().st_mtime)
    if not runs:
        return None
    root, remote = workdir / "dataset", workdir / "dvc-remote"
    if not (root / ".dvc").is_dir():  # our own repo, never `dvc init --subdir` into the user's git
        import io

        from dvc.repo import Repo

        root.mkdir(parents=True, exist_ok=True)
        logging.getLogger("dvc").setLevel(logging.WARNING)
        with contextlib.redirect_stdout(io.StringIO()):  # not DVC's "Initialized DVC repository." banner
            Repo.init(str(root), no_scm=True).close()
    ensure_dvc_repo(root, remote_dir=remote)
    dst = root / "documents.parquet"
    if not dst.exists() or data_md5(dst) != data_md5(runs[-1]):
        tmp = root / ".documents.parquet.tmp"
        shutil.copyfile(runs[-1], tmp)
        tmp.replace(dst)
    pushed = push([dst], root)
    return {"md5": data_md5(dst), "pushed": pushed, "repo": str(root), "remote": str(remote)}


def new_log_path(logs: Path) -> Path:
    """logs/run-<date>-<time>-<pid>.log, with -2, -3 ... if that name exists (two runs in one second of one
    process never share a file; the file is created with mode "x")."""
    base = f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path, k = logs / f"{base}.log", 1
    while path.exists():
        k += 1
        path = logs / f"{base}-{k}.log"
    return path


def _read_error(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def run_local(cfg, *, verbose: bool = False, use_cache: bool | None = None, out=None) -> dict:
    """Run the whole DAG locally on `cfg` (see the module docstring); prints progress + summary to `out`.
    Holds the workdir lock throughout (a no-op when the calling CLI already holds it)."""
    from packtrain.pipeline.lock import workdir_lock

    with workdir_lock(cfg.workdir, "run"):
        return _run_local(cfg, verbose=verbose, use_cache=use_cache, out=out)


def _run_local(cfg, *, verbose: bool, use_cache: bool | None, out) -> dict:
    from packtrain.pipeline.kfp_ops import load_pipeline, pipeline_arguments
    from packtrain.pipeline.summary import build_summary, format_summary, mlflow_ui_command
    from packtrain.tracking import resolve_tracking_uri

    out = out or sys.stdout
    t_start = time.perf_counter()
    workdir = Path(cfg.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = cfg.model_copy(update={"workdir": str(workdir)})
    use_cache = cfg.pipeline.stage_cache if use_cache is None else use_cache
    error_file = workdir / "kfp" / "last_error.json"
    error_file.unlink(missing_ok=True)
    log_path = new_log_path(workdir / "logs")

    tracking_uri = resolve_tracking_uri(cfg) if cfg.tracking.enabled else None
    parent = _start_parent(cfg) if tracking_uri else None
    env = {PARENT_ENV: parent, "MLFLOW_TRACKING_URI": tracking_uri,
           CACHE_ENV: str(workdir / "cache") if use_cache else None, ERROR_ENV: str(error_file),
           "TQDM_MININTERVAL": os.environ.get("TQDM_MININTERVAL", "5")}
    log = _StageLog(log_path, out, verbose)
    status, stages = "FAILED", {}
    try:
        with _env(**env), contextlib.redirect_stdout(log), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*non-Python base image.*")
            warnings.filterwarnings("ignore", message=".*no effect in the current local runner.*")
            from kfp import local

            local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(workdir / "kfp"),
                       raise_on_error=True)
            # kfp.local honours set_retry: locally a failure is deterministic (bad data, a bug), so no retries
            pipeline = load_pipeline(cfg.pipeline.model_copy(update={"retries": 0}))
            try:
                task = pipeline(**pipeline_arguments(cfg))
            except Exception as e:  # kfp.local raises RuntimeError naming the failed task
                raise _failure(e, error_file, log) from None
        stages = {s: json.loads(task.outputs[s]) for s in STAGES if task.outputs.get(s)}
        if parent:
            log_cached_stage_runs(parent, cfg, stages)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        log.close()
        if parent:
            metrics = {f"{s}.{k}": v for s, st in stages.items() for k, v in _flat_numbers(st).items()}
            _end_parent(cfg, parent, status, metrics, {"packtrain.log": str(log_path)})
    summary = build_summary(stages)
    try:
        summary["dataset"] = snapshot_documents(workdir)
    except Exception as e:  # the run succeeded; versioning the data is a bonus, never a failure
        summary["dataset"] = None
        out.write(f"warning: could not version the documents in DVC: {type(e).__name__}: {e}\n")
    seconds = time.perf_counter() - t_start
    out.write(format_summary(cfg.name, summary, seconds, len(stages), tracking_uri) + "\n")
    from packtrain.secrets import redact_uri

    return {"stages": stages, "summary": summary, "parent_run_id": parent, "tracking_uri": redact_uri(tracking_uri),
            "mlflow_ui": mlflow_ui_command(tracking_uri) if tracking_uri else None, "seconds": seconds,
            "log": str(log_path)}


def _failure(err: Exception, error_file: Path, log: _StageLog) -> PacktrainError:
    """The failed stage's own PacktrainError when it wrote one, else the kfp error + the log tail."""
    rec = _read_error(error_file)
    if rec:
        return PacktrainError(f"stage {rec['stage']} failed: {rec['message']}\n(full log: {log.path})",
                              exit_code=int(rec.get("exit_code", 1)))
    tail = "\n".join(log.tail[-25:])
    return PacktrainError(f"{_ANSI.sub('', str(err))}\n--- last log lines ---\n{tail}\n(full log: {log.path})")


def _flat_numbers(stats: dict) -> dict:
    from packtrain.config import flatten

    return {k: v for k, v in flatten(stats).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
