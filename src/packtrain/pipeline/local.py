"""`packtrain run`: the whole KFP DAG on this machine through `kfp.local.SubprocessRunner(use_venv=False)`.

    run_local(cfg) → {"stages": {stage: stats}, "summary": {...}, "parent_run_id", "parent_run_short",
                      "tracking_uri", "mlflow_ui", "seconds", "log"}
    every stage's stats carry "mlflow_run": {"run_id", "tracking_uri"} (its MLflow run in this pipeline run)

1. Opens the parent MLflow run (embedded sqlite store <workdir>/mlflow.db unless MLFLOW_TRACKING_URI is
   set) and exports PACKTRAIN_PARENT_RUN_ID + MLFLOW_TRACKING_URI so every component's stage run nests
   under it.
2. Runs the same pipeline that is compiled for the cluster (pipelines/kfp_pipeline.py), each component in
   a subprocess of this venv; artifacts under <workdir>/kfp/<run>/<task>/.
3. Stage cache (PACKTRAIN_STAGE_CACHE_DIR=<workdir>/cache, see packtrain.pipeline.cache): a second run on
   unchanged data, config and code restores every stage from the cache (~5 s a stage: process start +
   imports). Its MLflow stage run is still complete: a copy of the run that produced the cached output
   (metrics with histories, params, tags, datasets, artifacts; packtrain.tracking.restore), tagged
   packtrain.cache=hit and packtrain.restored_from=<origin run id> — also when the origin sits in another
   store (a run after switching from the embedded sqlite store to a server).
4. A failing stage (e.g. validation) stops the DAG before the next stage; the component writes its
   error to <workdir>/kfp/last_error.json and this raises the same PacktrainError (message names the
   report, exit code 4 for a failed validation).
5. The ingested documents are versioned in a DVC repo (<workdir>/dataset) and pushed to a local DVC remote
   (<workdir>/dvc-remote); the summary shows their md5.
6. The component logs go to <workdir>/logs/run-<time>-<pid>.log (never reused); the terminal shows one line
   per stage (plus a progress line of a long stage every `progress_s` seconds: step, loss, tok/s, ETA;
   packtrain.pipeline.progress), then the summary, where to look in MLflow for this store kind
   (packtrain.tracking.links), the pipeline run id (short and full) and the `packtrain compare` /
   `packtrain gate` lines to type next. The whole run holds the workdir lock (packtrain.pipeline.lock): a
   second `packtrain run` in the same workdir stops with exit 7.
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
PROGRESS_S = 10.0
"""Default seconds between two progress lines of a running stage (`packtrain run --progress S`)."""


class _StageLog:
    """A stdout stand-in: everything goes to the log file; the terminal gets one line per stage, plus a progress
    line of the running stage at most every `progress_s` seconds (packtrain.pipeline.progress)."""

    def __init__(self, path: Path, out, verbose: bool, progress_s: float = PROGRESS_S):
        from packtrain.pipeline.progress import Progress

        self.path, self.out, self.verbose = path, out, verbose
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "x", encoding="utf-8")   # never truncates another run's log
        self.buf = ""
        self.t0: dict[str, float] = {}
        self.hits: set[str] = set()
        self.tail: list[str] = []
        self.progress = Progress(progress_s)
        self.stage: str | None = None      # the running stage
        self.label = ""                    # "[5/7] train     "
        self.open_line = False             # the label is written, its status not yet

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
            self.stage = m.group(1)
            self.progress.start()
            i = STAGES.index(self.stage) + 1 if self.stage in STAGES else 0
            self.label = f"[{i}/{len(STAGES)}] {self.stage:<9} "
            self._say(self.label, end="")
            self.open_line = True
        elif m := _HIT.search(line):
            self.hits.add(m.group(1))
        elif m := _END.search(line):
            stage, status = m.groups()
            dt = time.perf_counter() - self.t0.get(stage, time.perf_counter())
            note = " (cached)" if stage in self.hits else ""
            self._say(("" if self.open_line else self.label) + f"{status.lower()} in {dt:.1f} s{note}")
            self.open_line, self.stage = False, None
        elif self.stage and (p := self.progress.line(line, self.stage)):
            # "[5/7] train     step 120/600 (20%) · loss 4.21 · 10,456 tok/s · 0:10 elapsed · ETA 0:40"
            self._say(("" if self.open_line else self.label) + p)
            self.open_line = False

    def _say(self, text: str, end: str = "\n") -> None:
        """The terminal's one line per stage (+ progress lines); --verbose streams the whole log instead."""
        if not self.verbose:
            self.out.write(text + end)
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
    """A stage restored from the cache still gets its run under the parent, and a complete one: a copy of the
    run that produced the cached output (`stats["mlflow_run"]`, recorded when the stage really ran) — metrics
    with their histories, params, tags, datasets, artifacts (packtrain.tracking.restore) — tagged
    packtrain.cache=hit, packtrain.restored_from=<origin run id>, the key and the KFP run id. Params of the
    stage's config section the origin lacks are added; without a readable origin the cached stats are logged
    as metrics. Updates `stats["mlflow_run"]` to the new run and sets `stats["restored_from"]`.
    Returns the new run ids."""
    from packtrain.config import flatten
    from packtrain.pipeline.runtime import stage_section
    from packtrain.tracking import StageRun
    from packtrain.tracking.context import base_tags
    from packtrain.tracking.restore import restore_run
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
        origin = stats.get("mlflow_run") if isinstance(stats.get("mlflow_run"), dict) else None
        copy = restore_run(client, run_id, origin)
        section = stage_section(stage, cfg)
        if section is not None:
            own = {f"{stage}.{k}": v for k, v in flatten(section.model_dump(mode="json")).items()}
            handle.log_params({k: v for k, v in own.items() if k not in copy.get("param_keys", ())})
        if not copy["copied"]:
            handle.log_metrics(_flat_numbers(stats))
        client.set_terminated(run_id, "FINISHED")
        stats["restored_from"] = origin
        stats["mlflow_run"] = {"run_id": client.resolve(run_id), "tracking_uri": client.shown_uri}
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


def run_local(cfg, *, verbose: bool = False, use_cache: bool | None = None, out=None,
              progress_s: float = PROGRESS_S) -> dict:
    """Run the whole DAG locally on `cfg` (see the module docstring); prints progress + summary to `out`
    (a progress line of the running stage every `progress_s` seconds). Holds the workdir lock throughout (a
    no-op when the calling CLI already holds it)."""
    from packtrain.pipeline.lock import workdir_lock

    with workdir_lock(cfg.workdir, "run"):
        return _run_local(cfg, verbose=verbose, use_cache=use_cache, out=out, progress_s=progress_s)


def _run_local(cfg, *, verbose: bool, use_cache: bool | None, out, progress_s: float) -> dict:
    from packtrain.pipeline.kfp_ops import load_pipeline, pipeline_arguments
    from packtrain.pipeline.summary import build_summary, format_summary
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
           # tqdm's updates feed the progress lines: at least two per progress interval, at most one per 5 s
           "TQDM_MININTERVAL": os.environ.get("TQDM_MININTERVAL", str(min(5.0, progress_s / 2)))}
    log = _StageLog(log_path, out, verbose, progress_s)
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
        else:   # no run of ours: a restored stage's "mlflow_run" is its origin's
            for st in stages.values():
                if st.get("cache") == "hit":
                    st["restored_from"] = st.pop("mlflow_run", None)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        log.close()
        if parent:
            metrics = {f"{s}.{k}": v for s, st in stages.items() for k, v in _flat_numbers(st).items()}
            _end_parent(cfg, parent, status, metrics, {"packtrain.log": str(log_path), **_stage_run_tags(stages)})
    summary = build_summary(stages)
    try:
        summary["dataset"] = snapshot_documents(workdir)
    except Exception as e:  # the run succeeded; versioning the data is a bonus, never a failure
        summary["dataset"] = None
        out.write(f"warning: could not version the documents in DVC: {type(e).__name__}: {e}\n")
    seconds = time.perf_counter() - t_start
    footer = _footer(cfg, tracking_uri, parent, stages) if tracking_uri else []
    out.write("\n".join([format_summary(cfg.name, summary, seconds, len(stages), None), *footer]) + "\n")
    from packtrain.secrets import redact_uri
    from packtrain.tracking.refs import short_id

    return {"stages": stages, "summary": summary, "parent_run_id": parent, "tracking_uri": redact_uri(tracking_uri),
            "parent_run_short": short_id(parent) if parent else None,
            "mlflow_ui": footer[0].removeprefix("  MLflow     ") if footer else None, "seconds": seconds,
            "log": str(log_path)}


def _stage_run_tags(stages: dict[str, dict]) -> dict[str, str]:
    """packtrain.stage_run.<stage> = <run id> on the pipeline run: compare/gate find its train run by tag."""
    return {f"packtrain.stage_run.{s}": st["mlflow_run"]["run_id"] for s, st in stages.items()
            if isinstance(st.get("mlflow_run"), dict) and st["mlflow_run"].get("run_id")}


def _footer(cfg, tracking_uri: str, parent: str | None, stages: dict[str, dict]) -> list[str]:
    """The MLflow hint, the run id and the copy-pasteable compare/gate lines (packtrain.tracking.links)."""
    from packtrain.tracking.links import run_footer, store_args
    from packtrain.tracking.run import get_client

    client = get_client(cfg)
    run_id = client.resolve(parent) if parent else None
    exp_id = previous = None
    if run_id and not run_id.startswith("pending-"):
        try:
            run = client._client.get_run(run_id)
            exp_id = run.info.experiment_id
            prev = client._client.search_runs(
                [exp_id], filter_string=f"tags.`packtrain.kind` = 'pipeline' and tags.`packtrain.recipe` = "
                                        f"'{cfg.name}' and attributes.status = 'FINISHED'",
                order_by=["attributes.start_time DESC"], max_results=2)
            previous = next((r.info.run_id for r in prev if r.info.run_id != run_id), None)
        except Exception:  # the store went away after the run: the hint without the run's address
            pass
    reg = stages.get("register") or {}
    return run_footer(tracking_uri, exp_id, run_id, previous=previous,
                      model=reg.get("model_name") or cfg.register_.model_name,
                      champion=reg.get("decision") == "champion",
                      extra_args=store_args(cfg, bool(os.environ.get("MLFLOW_TRACKING_URI"))))


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
