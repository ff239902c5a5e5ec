"""`packtrain run --runner kfp`: the compiled KFP DAG through `kfp.local.SubprocessRunner(use_venv=False)`.

The same pipeline that is compiled for a cluster (pipelines/kfp_pipeline.py, built from the stage table), each
component in a subprocess of this venv as a pod would run it: the RunConfig crosses as one JSON string, every
stage runs `packtrain.pipeline.runtime.run_stage_component`. Artifacts under <workdir>/kfp/<run>/<task>/.

What kfp.local tells about a run is its log, so this adapter reads it: "Executing task 'X'" / "Task 'X'
finished with status S" become the StageEvents of packtrain.pipeline.progress (the same terminal lines as
the in-process runner), a stage's tqdm bar in the component output becomes its progress line. A failed
component writes its error record (packtrain.error_record.write_error_record) to <workdir>/kfp/last_error.json
(PACKTRAIN_ERROR_FILE), which becomes the same StageFailed the in-process runner raises: message and exit code
of the stage's own error.
"""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from pathlib import Path
from typing import TextIO

from packtrain.error_record import read_error_record
from packtrain.errors import PacktrainError, StageFailed
from packtrain.paths import patched_env
from packtrain.pipeline.progress import Progress, StageEvent, StageLines
from packtrain.pipeline.runtime import CACHE_ENV, ERROR_ENV
from packtrain.stages.table import STAGE_NAMES

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_START = re.compile(r"Executing task '([\w-]+)'")
_END = re.compile(r"Task '([\w-]+)' finished with status (\w+)")
_HIT = re.compile(r"\[packtrain\] ([\w-]+): cache hit")


class KfpLog:
    """A stdout stand-in for kfp.local: everything goes to the log file (and to the terminal with --verbose);
    the lines it recognises become StageEvents for `on_event`."""

    def __init__(self, f: TextIO, out: TextIO, verbose: bool, progress_s: float, on_event):
        import time

        self._time = time.perf_counter
        self.f, self.out, self.verbose, self.on_event = f, out, verbose, on_event
        self.buf = ""
        self.t0: dict[str, float] = {}
        self.hits: set[str] = set()
        self.tail: list[str] = []
        self.progress = Progress(progress_s)
        self.stage: str | None = None      # the running stage

    def write(self, s: str) -> int:
        self.f.write(s)
        if self.verbose:
            self.out.write(s)
        self.buf += s
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            self._line(_ANSI.sub("", line))
        return len(s)

    def _event(self, kind: str, stage: str, **kw) -> None:
        i = STAGE_NAMES.index(stage) + 1 if stage in STAGE_NAMES else 0
        self.on_event(StageEvent(kind, stage, i, len(STAGE_NAMES), **kw))   # type: ignore[arg-type]

    def _line(self, line: str) -> None:
        from packtrain.pipeline.progress import parse_bar

        self.tail = (self.tail + [line])[-60:]
        if m := _START.search(line):
            self.t0[m.group(1)] = self._time()
            self.tail = []
            self.stage = m.group(1)
            self.progress.start()
            self._event("start", self.stage)
        elif m := _HIT.search(line):
            self.hits.add(m.group(1))
        elif m := _END.search(line):
            stage, status = m.groups()
            dt = self._time() - self.t0.get(stage, self._time())
            self._event("end", stage, status="success" if status == "SUCCESS" else "failure", seconds=dt,
                        cached=stage in self.hits)
            self.stage = None
        elif self.stage and (bar := self.progress.due(parse_bar(line), self.stage)):
            self._event("progress", self.stage, bar=bar)

    def flush(self) -> None:
        self.f.flush()
        self.out.flush()

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        if self.buf:
            self._line(_ANSI.sub("", self.buf))


def run_kfp_local(cfg, workdir: Path, log: TextIO, out: TextIO, *, verbose: bool, cache_dir: Path | None,
                  progress_s: float, engine=None) -> dict[str, dict]:
    """Run the compiled DAG through kfp.local (module doc); returns each stage's stats dict. Raises StageFailed
    (the failing stage's message and exit code) or, for a failure without an error record, a PacktrainError with
    kfp's message and the last log lines (and, in containers, the component's exit code). `engine`
    (packtrain.pipeline.containers.Engine): every task in its image through kfp's DockerRunner, else
    SubprocessRunner."""
    from packtrain.pipeline.kfp_ops import pipeline_arguments

    error_file = workdir / "kfp" / "last_error.json"
    error_file.unlink(missing_ok=True)
    stream = KfpLog(log, out, verbose, progress_s, StageLines(None if verbose else out))
    env = {CACHE_ENV: str(cache_dir) if cache_dir else None, ERROR_ENV: str(error_file)}
    try:
        with patched_env(**env), contextlib.redirect_stdout(stream), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*non-Python base image.*")
            warnings.filterwarnings("ignore", message=".*no effect in the current local runner.*")
            from kfp import local

            with _runner(engine) as runner:
                local.init(runner=runner, pipeline_root=str(workdir / "kfp"), raise_on_error=True)
                pipeline = local_pipeline(cfg)
                try:
                    task = pipeline(**pipeline_arguments(cfg))
                except Exception as e:  # kfp.local raises RuntimeError naming the failed task
                    raise _failure(e, error_file, stream, engine) from None
    finally:
        stream.close()
    return {s: json.loads(task.outputs[s]) for s in STAGE_NAMES if task.outputs.get(s)}


def local_pipeline(cfg):
    """The pipeline a local kfp/docker run executes: the one compiled for the whole RunConfig (a recipe that trains
    on the CPU names only the CPU image), without retries (kfp.local honours set_retry; locally a failure is
    deterministic: bad data, a bug)."""
    from packtrain.pipeline.kfp_ops import load_pipeline

    return load_pipeline(cfg.model_copy(update={"pipeline": cfg.pipeline.model_copy(update={"retries": 0})}))


@contextlib.contextmanager
def _runner(engine):
    from kfp import local

    if engine is None:
        yield local.SubprocessRunner(use_venv=False)
        return
    from packtrain.pipeline.containers import docker_runner

    with patched_env(DOCKER_HOST=engine.url), docker_runner(engine) as runner:
        yield runner


def _failure(err: Exception, error_file: Path, stream: KfpLog, engine=None) -> PacktrainError:
    """The failed stage's own error when its component recorded one, else the kfp error + the log tail (and the
    failed container's exit code, which becomes packtrain's)."""
    rec = read_error_record(error_file)
    if rec is not None:
        cause, stage = rec
        return StageFailed(str(stage), cause)
    tail = "\n".join(stream.tail[-25:])
    failed = [(t, c) for t, c in (engine.exit_codes.items() if engine else ()) if c != 0]
    if failed:
        task, code = failed[-1]
        return PacktrainError(f"component {task!r} exited with code {code} in its container "
                              f"({_ANSI.sub('', str(err))})\n--- last log lines ---\n{tail}",
                              exit_code=code if 0 < code < 256 else 1)
    return PacktrainError(f"{_ANSI.sub('', str(err))}\n--- last log lines ---\n{tail}")
