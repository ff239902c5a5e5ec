"""`packtrain run`: the whole DAG on this machine — in this process (default), through kfp.local or in containers.

    run_local(cfg, runner="in-process") → {"stages": {stage: stats}, "summary": {...}, "parent_run_id",
                      "parent_run_short", "tracking_uri", "mlflow_ui", "seconds", "log", "runner"}
    every stage's stats carry "mlflow_run": {"run_id", "tracking_uri"} (its MLflow run in this pipeline run)

The frame of a run (`run_local`, whose docstring draws the calls down to a stage), the same for every runner:
1. Opens the parent MLflow run (embedded sqlite store <workdir>/mlflow.db unless MLFLOW_TRACKING_URI is
   set) and exports PACKTRAIN_PARENT_RUN_ID + MLFLOW_TRACKING_URI so every stage run nests under it.
2. Runs the stages, artifacts under <workdir>/kfp/packtrain-<time>/<stage>/<artifact>/:
   - "in-process" (packtrain.pipeline.dag.run_dag): the stage table walked in this process, each stage as if
     in its own process;
   - "kfp" (packtrain.pipeline.kfp_local): the pipeline compiled for the cluster (pipelines/kfp_pipeline.py),
     each component in a subprocess of this venv, as a pod runs it;
   - "docker" (the same, packtrain.pipeline.containers): each component in its container image over the Docker
     API (podman's service or Docker's daemon); its preflight (runtime, images, a workdir the containers can
     write) runs before the parent MLflow run opens, so a refused run registers nothing.
3. Stage cache (<workdir>/cache, packtrain.pipeline.cache): a second run on unchanged data, config and code
   restores every stage. Its MLflow stage run is still complete: a copy of the run that produced the cached
   output (packtrain.pipeline.runtime.log_cache_hit: metrics with histories, params, tags, datasets, artifacts),
   tagged packtrain.cache=hit and packtrain.restored_from=<origin run id>, also when the origin sits in another
   store. In process it is logged as the stage runs; kfp's components do not import MLflow for it (~2.5 s a
   component): their hits are logged when the DAG is done. Both runners key a stage the same way.
4. A failing stage (e.g. validation) stops the DAG before the next stage and raises StageFailed: the stage's
   own message, the log's path and the stage's exit code (4 for a failed validation).
5. The ingested documents are versioned in the DVC repo that holds the workdir (the checkout's, the one
   `dvc repro` uses) and pushed to its default remote; outside every DVC repo in <workdir>/dataset with the
   remote <workdir>/dvc-remote (snapshot_documents). The summary shows their md5 and the remote.
6. What the stages print goes to <workdir>/logs/run-<time>-<pid>.log (never reused); the terminal shows one
   line per stage (plus a progress line of a long stage every `progress_s` seconds: step, loss, tok/s, ETA;
   packtrain.pipeline.progress), then the summary, where to look in MLflow (packtrain.tracking.links), the
   pipeline run id and the `packtrain compare` / `packtrain gate` lines to type next. The whole run holds the
   workdir lock (packtrain.pipeline.lock): a second `packtrain run` in the same workdir stops with exit 7.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO, cast

from packtrain.errors import PacktrainError, StageFailed
from packtrain.paths import patched_env
from packtrain.pipeline.progress import EventSink, StageEvent
from packtrain.pipeline.runtime import REFRESH_ENV, flat_numbers
from packtrain.tracking.context import PARENT_ENV

PROGRESS_S = 10.0
"""Default seconds between two progress lines of a running stage (`packtrain run --progress S`)."""
Runner = Literal["in-process", "kfp", "docker"]
RUNNERS: tuple[str, ...] = ("in-process", "kfp", "docker")
"""`packtrain run --runner`: in-process (default: one process, the stage table walked in it), kfp (the
compiled KFP DAG through kfp.local, one subprocess per component, as pods run it) or docker (the same DAG, each
component in its image: packtrain.pipeline.containers)."""
RUNNER_TAGS = {"in-process": "in-process", "kfp": "kfp.local", "docker": "kfp.local.docker"}
"""The parent run's tag packtrain.runner for each runner."""


def _start_parent(cfg, runner: str) -> str | None:
    """The parent run (packtrain.tracking.start_pipeline_run: flattened config as params, exports
    PACKTRAIN_PARENT_RUN_ID so every component's stage run nests under it)."""
    import mlflow  # noqa: F401  (imported first: its import resets the "mlflow" logger to INFO)

    from packtrain.tracking import StageRun, start_pipeline_run
    from packtrain.tracking.run_lifecycle import get_client
    from packtrain.versioning import code_version

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # not "Creating initial MLflow database tables"
    parent = start_pipeline_run(cfg)
    if parent:
        StageRun(get_client(cfg), parent, "pipeline").set_tags(
            {"packtrain.runner": RUNNER_TAGS[runner], "packtrain.code_version": code_version()})
    return parent


def _end_parent(cfg, run: _Run, status: str) -> None:
    """Every stage's final numbers as `<stage>.<key>` (those a stage or a restored stage already logged there
    are not logged twice: one point per number), the tags (the log, each stage's run, the name after the data
    version), then the end."""
    from packtrain.tracking import StageRun, end_pipeline_run
    from packtrain.tracking.layout import data_version_of, pipeline_run_name
    from packtrain.tracking.run_lifecycle import get_client

    stages, parent = run.stages, cast(str, run.parent)
    metrics = {f"{s}.{k}": v for s, st in stages.items() for k, v in flat_numbers(st).items()}
    name = pipeline_run_name(cfg.name, data_version_of(stages.get("ingest")))   # kfp: ingest ran elsewhere
    tags = {"packtrain.log": str(run.log_path), **_stage_run_tags(stages),
            **({"mlflow.runName": name} if stages.get("ingest") else {})}
    client = get_client(cfg)
    handle = StageRun(client, parent, "pipeline")
    have = _logged_metrics(client, parent)
    handle.log_metrics({k: v for k, v in metrics.items() if have.get(k) != float(v)})
    handle.set_tags(tags)
    end_pipeline_run(parent, status, cfg)


def _logged_metrics(client, run_id: str) -> dict[str, float]:
    """The run's latest metric values ({} when the store cannot say: then everything is logged)."""
    rid = client.resolve(run_id)
    if not rid or rid.startswith("pending-") or client.down:
        return {}
    try:
        return dict(client._client.get_run(rid).data.metrics)
    except Exception:   # the store went away: log all of it (buffered)
        return {}


def snapshot_documents(workdir: Path) -> dict | None:
    """Version the ingested documents of the newest local run in DVC, in the one repository `dvc repro` uses too
    (docs/data.md, "One repository, one remote"):

        workdir inside a DVC repo    that repo (the checkout: its root)    .dvc/cache + its default remote; no .dvc
                                                                          file, .dvc/config untouched
        outside every DVC repo       <workdir>/dataset/ (dvc init --no-scm) documents.parquet + .dvc, pushed to
                                     <workdir>/dvc-remote/                 its default remote

    Returns {"md5", "pushed", "repo", "remote" (None: the repo has no default remote, cached only), "legacy"
    (inside a repo: {"repo", "remote"} of the <workdir>/dataset/ repo older versions made there, left as it is,
    or None)}; idempotent (an unchanged table pushes 0 files).
    """
    from packtrain.versioning import default_remote, dvc_repo_of, push_file

    runs = sorted((workdir / "kfp").glob("packtrain-*/ingest/documents/documents.parquet"),
                  key=lambda p: p.stat().st_mtime)
    if not runs:
        return None
    root, own = dvc_repo_of(workdir), workdir / "dataset"
    if root is None:
        return _snapshot_in_own_repo(runs[-1], own, workdir / "dvc-remote")
    legacy = None
    if (own / ".dvc").is_dir():   # never deleted: it may hold the only copy of what older runs pushed
        remote = default_remote(own)
        legacy = {"repo": str(own), "remote": remote[1] if remote else None}
    return {**push_file(runs[-1], root), "repo": str(root), "legacy": legacy}


def _snapshot_in_own_repo(documents: Path, root: Path, remote: Path) -> dict:
    """No DVC repo holds the workdir: `root` becomes one of its own (no git: never `dvc init --subdir` into a
    user's git) with the local remote `remote`; the documents are copied there, `dvc add`-ed and pushed."""
    import shutil

    from packtrain.versioning import data_md5, default_remote, ensure_dvc_repo, push

    if not (root / ".dvc").is_dir():
        import io

        from dvc.repo import Repo

        root.mkdir(parents=True, exist_ok=True)
        logging.getLogger("dvc").setLevel(logging.WARNING)
        with contextlib.redirect_stdout(io.StringIO()):  # not DVC's "Initialized DVC repository." banner
            Repo.init(str(root), no_scm=True).close()
    ensure_dvc_repo(root, remote_dir=remote)
    dst = root / "documents.parquet"
    if not dst.exists() or data_md5(dst) != data_md5(documents):
        tmp = root / ".documents.parquet.tmp"
        shutil.copyfile(documents, tmp)
        tmp.replace(dst)
    pushed = push([dst], root)
    url = default_remote(root)
    return {"md5": data_md5(dst), "pushed": pushed, "repo": str(root), "remote": url[1] if url else None,
            "legacy": None}


def new_log_path(logs: Path) -> Path:
    """logs/run-<date>-<time>-<pid>.log, with -2, -3 ... if that name exists (two runs in one second of one
    process never share a file; the file is created with mode "x")."""
    base = f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    path, k = logs / f"{base}.log", 1
    while path.exists():
        k += 1
        path = logs / f"{base}-{k}.log"
    return path


def run_name() -> str:
    """packtrain-<date>-<time>-<µs>: the folder of one run under <workdir>/kfp/ (kfp.local's own naming, which
    the in-process runner follows so that both leave the same tree)."""
    import datetime

    return f"packtrain-{datetime.datetime.now().strftime('%Y-%m-%d-%H-%M-%S-%f')}"


def run_local(cfg, *, runner: Runner = "in-process", verbose: bool = False, use_cache: bool | None = None,
              out: TextIO | None = None, progress_s: float = PROGRESS_S) -> dict:
    """Run the whole DAG locally on `cfg` with `runner` (see the module docstring); prints progress + summary
    to `out` (a progress line of the running stage every `progress_s` seconds). Holds the workdir lock
    throughout (a no-op when the calling CLI already holds it).

    From the command line to a stage's own code, 5 calls (the stack while a stage runs in process):

        cli.main                      packtrain/cli.py        parse, load the recipe, take the workdir lock
        → run                         commands/run.py         check the flags
          → run_local                 pipeline/local.py       log file, parent MLflow run, summary (this)
            → run_dag                 pipeline/dag.py         the stage table in order, each as its own process
              → run_stage             pipeline/runtime.py     stage cache (a hit is logged here) or the runner
                → run_<stage>         stages/<stage>.py       the stage: its MLflow run, its output directory
    """
    from packtrain.pipeline.dag import Tee, run_dag, terminal
    from packtrain.pipeline.early_imports import early_imports, start_early_imports, worth_importing_early
    from packtrain.pipeline.lock import workdir_lock
    from packtrain.pipeline.progress import StageLines
    from packtrain.versioning import code_version

    if runner not in RUNNERS:
        from packtrain.errors import ConfigError

        raise ConfigError(f"runner {runner!r}: must be one of {', '.join(RUNNERS)}")
    from packtrain.pipeline.preflight import refuse_before_stages

    refuse_before_stages(cfg, here=True)   # what would fail only after training fails now (packtrain.pipeline.preflight)
    out = out or sys.stdout
    with workdir_lock(cfg.workdir, "run"), contextlib.ExitStack() as stack:
        t_start = time.perf_counter()
        # kfp's and docker's stages are processes of their own: nothing imported here reaches them
        if runner == "in-process" and worth_importing_early(cfg):
            start_early_imports(early_imports(cfg))
        workdir = Path(cfg.workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = cfg.model_copy(update={"workdir": str(workdir)})
        # use_cache False (--no-cache): nothing is restored, every stage's fresh output is stored (REFRESH_ENV)
        refresh = use_cache is False and cfg.pipeline.stage_cache
        cache_dir = workdir / "cache" if cfg.pipeline.stage_cache else None
        engine = None
        if runner == "docker":   # preflight before the parent run: a refused run registers nothing
            from packtrain.pipeline.containers import open_engine

            engine = stack.enter_context(open_engine(cfg, workdir))
        with _pipeline_run(cfg, runner, workdir, refresh, progress_s) as run:
            if runner != "in-process":
                from packtrain.pipeline.kfp_local import run_kfp_local

                run.stages = run_kfp_local(cfg, workdir, run.log, out, verbose=verbose, cache_dir=cache_dir,
                                           progress_s=progress_s, engine=engine)
            else:   # the stages print into the log (fds 1/2 too); the terminal gets the stage lines
                with terminal(out) as term:   # (--verbose: the log itself, stage lines among it)
                    output = cast(TextIO, Tee(run.log, term)) if verbose else run.log
                    lines = StageLines(output if verbose else term)
                    run.stages = run_dag(cfg, workdir / "kfp" / run_name(), cache_dir=cache_dir, parent=run.parent,
                                         on_event=_stage_events(run.log, verbose, lines), output=output,
                                         capture_fds=not verbose, progress_s=progress_s, code_version=code_version())
        return _summary(cfg, run, workdir, out, t_start)


@dataclass
class _Run:
    """One pipeline run as `_pipeline_run` opens it: its log, its parent MLflow run, the stages' stats."""

    runner: Runner
    log_path: Path
    tracking_uri: str | None
    parent: str | None
    log: TextIO = cast(TextIO, None)   # the open log file, set as the block starts
    stages: dict[str, dict] = field(default_factory=dict)


@contextlib.contextmanager
def _pipeline_run(cfg, runner: Runner, workdir: Path, refresh: bool, progress_s: float) -> Iterator[_Run]:
    """The frame of the stages: a new log file, the parent MLflow run (ended FINISHED, FAILED or KILLED as the
    block ends) and the environment every stage reads (the parent's id, the tracking URI). A failure in the block
    names the log; a stage restored from the cache that the runner did not log (kfp) is logged after it."""
    from packtrain.pipeline.early_imports import drain
    from packtrain.tracking import resolve_tracking_uri

    log_path = new_log_path(workdir / "logs")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tracking_uri = resolve_tracking_uri(cfg) if cfg.tracking.enabled else None
    run = _Run(runner, log_path, tracking_uri, _start_parent(cfg, runner) if tracking_uri else None)
    env = {PARENT_ENV: run.parent, "MLFLOW_TRACKING_URI": tracking_uri,
           # tqdm's updates feed the progress lines: at least two per progress interval, at most one per 5 s
           "TQDM_MININTERVAL": os.environ.get("TQDM_MININTERVAL", str(min(5.0, progress_s / 2))),
           REFRESH_ENV: "1" if refresh else None}
    status = "FAILED"
    try:
        # mode "x": never truncates another run's log; line-buffered: in order with what reaches its fd directly
        with patched_env(**env), open(log_path, "x", encoding="utf-8", buffering=1) as log:
            run.log = log
            drain(log)
            try:
                yield run
            except StageFailed as e:
                raise StageFailed(e.stage, e.cause, str(log_path)) from None
            except PacktrainError as e:   # kfp: a failure no component recorded (kfp's message + the log tail)
                raise PacktrainError(f"{e}\n(full log: {log_path})", exit_code=e.exit_code) from None
            finally:
                drain(log)
        _restored_runs(cfg, run.parent, run.stages)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if run.parent and status == "FINISHED":
            _end_parent(cfg, run, status)
        elif run.parent:   # the stage's own error is the one to report, also when the store cannot take the end now
            try:
                _end_parent(cfg, run, status)
            except Exception as e:   # noqa: BLE001 - e.g. the disk that filled up holds the store too
                logging.getLogger(__name__).warning("could not mark the pipeline run %s %s: %s", run.parent, status,
                                                    str(e).splitlines()[0][:200] if str(e) else type(e).__name__)


def _restored_runs(cfg, parent: str | None, stages: dict[str, dict]) -> None:
    """A stage restored from the cache that no one logged yet gets its run under the parent
    (packtrain.pipeline.runtime.log_cache_hit): the in-process runner logged each as it ran, a kfp component
    does not (importing MLflow costs ~2.5 s a component). Without a parent a restored stage's "mlflow_run" is
    its origin's."""
    from packtrain.pipeline.runtime import log_cache_hit

    for stage, stats in stages.items():
        if stats.get("cache") != "hit" or "restored_from" in stats:
            continue
        if parent:
            log_cache_hit(parent, cfg, stage, stats)
        else:
            stats["restored_from"] = stats.pop("mlflow_run", None)


def _stage_events(log: TextIO, verbose: bool, lines: EventSink) -> EventSink:
    """The in-process runner's StageEvents: the stage lines, and (without --verbose) where each stage's output
    starts and ends in the log."""

    def on_event(ev: StageEvent) -> None:
        if not verbose and ev.kind != "progress":
            log.write(f"--- [{ev.index}/{ev.total}] {ev.stage}: " + (
                "started ---\n" if ev.kind == "start" else f"{ev.status} in {ev.seconds:.1f} s ---\n"))
        lines(ev)

    return on_event


def _summary(cfg, run: _Run, workdir: Path, out: TextIO, t_start: float) -> dict:
    """The summary printed to `out` after the run, and the dict `run_local` returns."""
    from packtrain.pipeline.summary import build_summary, format_summary
    from packtrain.secrets import redact_uri
    from packtrain.tracking.refs import short_id

    stages, tracking_uri, parent = run.stages, run.tracking_uri, run.parent
    summary = build_summary(stages)
    reg = stages.get("register") or {}
    if tracking_uri and isinstance(reg, dict) and reg.get("cache") == "hit" and reg.get("version") is not None:
        from packtrain.pipeline.summary import registry_now

        summary["registry_now"] = registry_now(tracking_uri, str(reg.get("model_name")), str(reg["version"]))
    try:
        summary["dataset"] = snapshot_documents(workdir)
    except Exception as e:  # the run succeeded; versioning the data is a bonus, never a failure
        summary["dataset"] = None
        out.write(f"warning: could not version the documents in DVC: {type(e).__name__}: {e}\n")
    seconds = time.perf_counter() - t_start
    footer = _footer(cfg, tracking_uri, parent, stages) if tracking_uri else []
    out.write("\n".join([format_summary(cfg.name, summary, seconds, len(stages), None), *footer]) + "\n")
    out.flush()
    return {"stages": stages, "summary": summary, "parent_run_id": parent, "tracking_uri": redact_uri(tracking_uri),
            "parent_run_short": short_id(parent) if parent else None,
            "mlflow_ui": footer[0].removeprefix("  MLflow     ") if footer else None, "seconds": seconds,
            "log": str(run.log_path), "runner": run.runner}


def _stage_run_tags(stages: dict[str, dict]) -> dict[str, str]:
    """packtrain.stage_run.<stage> = <run id> on the pipeline run: compare/gate find its train run by tag."""
    return {f"packtrain.stage_run.{s}": st["mlflow_run"]["run_id"] for s, st in stages.items()
            if isinstance(st.get("mlflow_run"), dict) and st["mlflow_run"].get("run_id")}


def _footer(cfg, tracking_uri: str, parent: str | None, stages: dict[str, dict]) -> list[str]:
    """The MLflow hint, the run id and the copy-pasteable compare/gate lines (packtrain.tracking.links)."""
    from packtrain.tracking.links import run_footer, store_args
    from packtrain.tracking.run_lifecycle import get_client
    from packtrain.tracking.transport import short_http

    client = get_client(cfg)
    run_id = client.resolve(parent) if parent else None
    exp_id = previous = None
    if run_id and not run_id.startswith("pending-"):
        try:   # a store that went down during the run answers at once, not after MLflow's retries (~4 min)
            with short_http(client.uri, 10):
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
