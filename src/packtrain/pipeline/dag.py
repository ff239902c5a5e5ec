"""`packtrain run`'s default runner: the stage table walked in this process, one runner call per stage.

    stages = run_dag(cfg, run_dir, cache_dir=workdir / "cache", on_event=StageLines(sys.stdout), output=log)
      → {"ingest": {...stats}, "validate": {...}, ..., "register": {...}}
      <run_dir>/<stage>/<artifact>/        each stage's output (documents, validation, tokens, ...)

For each stage of packtrain.stages.table.STAGES, in table order: its inputs are the outputs of the stages
before it (by artifact name), `packtrain.pipeline.runtime.run_stage` runs it (stage cache first; a hit is
logged under the pipeline's MLflow run `parent` there), and
`on_event` hears a StageEvent when it starts, while its own progress bar moves (packtrain.pipeline.progress:
the live tqdm object, read each time it draws) and when it ends. A stage's PacktrainError stops the walk as
`StageFailed` carrying that error and its exit code (4 for a failed validation); any other exception of a
stage (a bug) is a StageFailed with exit code 1 and its traceback in `output`. Nothing is parsed from logs and
nothing goes through files: the exception is the error channel.

Each stage runs as if in a process of its own (`own_process`): what a stage changes of the process — the
environment, the working directory, logging levels and handlers, warning filters, torch's thread count,
default dtype, grad mode and RNG (reset to a fresh process's seed), compiled graphs, a leftover MLflow fluent
run — is put back before the next one, so the numbers are those of one process per stage (`--runner kfp`;
tests/pipelines/test_kfp_runner.py and
tests/unit/test_run_dag.py check it). A stage that needs processes of its own still starts them
(train with train.gpus > 1 launches its ranks through torchrun: packtrain.train.launch).

`output` receives everything the stages print: their Python-level stdout/stderr, and with `capture_fds` also
what reaches file descriptors 1 and 2 directly (C libraries, the torchrun ranks), as the component log did.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from packtrain.errors import PacktrainError, StageFailed
from packtrain.pipeline.progress import EventSink, Progress, StageEvent, live_bar
from packtrain.pipeline.runtime import run_stage
from packtrain.stages.table import STAGES, StageSpec

FRESH_TORCH_SEED = 67280421310721
"""`torch.initial_seed()` of a fresh process: what torch's default generator starts from before any seeding."""


def run_dag(cfg, run_dir: str | Path, *, cache_dir: Path | None = None, parent: str | None = None,
            on_event: EventSink | None = None, output: TextIO | None = None, capture_fds: bool = False,
            progress_s: float = 10.0, code_version: str = "", data_version: str = "",
            stages: Sequence[StageSpec] = STAGES) -> dict[str, dict]:
    """Run `stages` (default: the whole table) on `cfg` into `run_dir` (module docstring); returns each stage's
    stats dict. Raises StageFailed at the first failing stage (the stages after it do not run). `parent`: the
    pipeline's MLflow run, under which `run_stage` logs a stage restored from the cache."""
    import gc

    run_dir = Path(run_dir)
    emit = on_event or (lambda ev: None)
    outputs: dict[str, Path] = {}
    results: dict[str, dict] = {}
    try:
        for i, spec in enumerate(stages, 1):
            inputs = {a: outputs[a] for a in spec.inputs}
            out_dir = run_dir / spec.name / spec.output
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            progress = Progress(progress_s)
            emit(StageEvent("start", spec.name, i, len(stages)))
            t0 = time.perf_counter()

            def watch(stage=spec.name, index=i, progress=progress) -> None:
                bar = progress.due(live_bar(stage), stage)
                if bar is not None:
                    emit(StageEvent("progress", stage, index, len(stages), bar=bar))

            try:
                with own_process(), stage_output(output, watch, capture_fds):
                    stats = run_stage(spec.name, cfg, inputs, out_dir, cache_dir=cache_dir, parent=parent,
                                      code_version=code_version, data_version=data_version)
            except Exception as e:   # a PacktrainError, or a bug of the stage
                emit(StageEvent("end", spec.name, i, len(stages), "failure", time.perf_counter() - t0))
                if not isinstance(e, PacktrainError) and output is not None:
                    output.write("".join(traceback.format_exception(e)))
                    output.flush()
                raise StageFailed(spec.name, e) from e
            emit(StageEvent("end", spec.name, i, len(stages), "success", time.perf_counter() - t0,
                            cached=stats.get("cache") == "hit"))
            outputs[spec.output] = out_dir
            results[spec.name] = {**stats, "output_dir": str(out_dir)}   # where this run's output is (the summary)
        return results
    finally:
        gc.unfreeze()   # what own_process froze goes back to the collector's oldest generation


class _StageStream:
    """The stages' sys.stdout/sys.stderr: text goes to `output`; every write gives `watch` a look at the
    running stage's progress bar (tqdm draws through this stream: `file=sys.stderr` at its creation)."""

    def __init__(self, output: TextIO, watch):
        self.output, self.watch = output, watch

    def write(self, s: str) -> int:
        self.output.write(s)
        self.output.flush()   # in order with what reaches the same file through fds 1/2
        self.watch()
        return len(s)

    def flush(self) -> None:
        self.output.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return getattr(self.output, "encoding", None) or "utf-8"


@contextlib.contextmanager
def stage_output(output: TextIO | None, watch, capture_fds: bool) -> Iterator[None]:
    """Inside the block the stage prints into `output` (module doc); None: leave stdout/stderr alone and only
    watch progress when something is drawn there."""
    if output is None:
        yield
        return
    stream = _StageStream(output, watch)
    with contextlib.ExitStack() as stack:
        if capture_fds:
            stack.enter_context(_fds_into(output))
        stack.enter_context(contextlib.redirect_stdout(stream))
        stack.enter_context(contextlib.redirect_stderr(stream))
        yield


@contextlib.contextmanager
def _fds_into(output: TextIO) -> Iterator[None]:
    """File descriptors 1 and 2 point at `output`'s file inside the block (what child processes and C code
    write); a stream without a file descriptor, or closed descriptors, leave them as they are."""
    try:
        target = output.fileno()
        saved = [os.dup(1), os.dup(2)]
    except (AttributeError, OSError, ValueError):
        yield
        return
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    os.dup2(target, 1)
    os.dup2(target, 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


class Tee:
    """`packtrain run --verbose`: what the stages print goes to the log and the terminal."""

    def __init__(self, *streams: TextIO):
        self.streams = streams

    def write(self, s: str) -> int:
        for f in self.streams:
            f.write(s)
        return len(s)

    def flush(self) -> None:
        for f in self.streams:
            f.flush()


@contextlib.contextmanager
def terminal(out: TextIO) -> Iterator[TextIO]:
    """`out` as it is now, also once fds 1/2 point at the log (`capture_fds`): a stream on fd 1 or 2 is reopened
    on a copy of that descriptor for the block; any other stream (a StringIO, pytest's capture) as it is."""
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        yield out
        return
    if fd not in (1, 2):
        yield out
        return
    out.flush()
    with os.fdopen(os.dup(fd), "w", encoding=getattr(out, "encoding", None) or "utf-8", buffering=1) as f:
        yield f


@contextlib.contextmanager
def own_process() -> Iterator[None]:
    """Run the block as if in a process of its own (module doc): what it changes of this one is put back."""
    import logging
    import warnings

    env, cwd = dict(os.environ), os.getcwd()
    root = logging.getLogger()
    handlers, levels = list(root.handlers), _logger_levels()
    torch_state = _torch_enter()
    try:
        with warnings.catch_warnings():
            yield
    finally:
        _end_fluent_runs()
        _torch_exit(torch_state)
        for k in set(os.environ) - set(env):
            del os.environ[k]
        for k, v in env.items():
            if os.environ.get(k) != v:
                os.environ[k] = v
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        for h in set(root.handlers) - set(handlers):
            root.removeHandler(h)
        for h in handlers:
            if h not in root.handlers:
                root.addHandler(h)
        now = _logger_levels()
        for name, level in levels.items():   # a logger made by an import in the stage keeps its import-time level
            if now.get(name) != level:
                logging.getLogger(name or None).setLevel(level)


def _logger_levels() -> dict[str, int]:
    import logging

    loggers = [logging.getLogger()] + [x for x in logging.Logger.manager.loggerDict.values()
                                       if isinstance(x, logging.Logger)]
    return {("" if lg is logging.getLogger() else lg.name): lg.level for lg in loggers}


def _torch_enter() -> dict[str, Any] | None:
    """torch's process-wide settings before a stage (None: torch not imported yet, a fresh process's state);
    its default generator reset to a fresh process's seed."""
    if "torch" not in sys.modules:
        return None
    import torch

    torch.manual_seed(FRESH_TORCH_SEED)
    return {"threads": torch.get_num_threads(), "dtype": torch.get_default_dtype(), "grad": torch.is_grad_enabled()}


def _torch_exit(state: dict[str, Any] | None) -> None:
    """Put torch's settings back (a stage that imported torch first leaves them at torch's defaults) and free
    what the stage left: compiled graphs, cached GPU memory."""
    if "torch" not in sys.modules:
        _collect()
        return
    import torch

    if state is not None:
        torch.set_num_threads(state["threads"])
        torch.set_default_dtype(state["dtype"])
        torch.set_grad_enabled(state["grad"])
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
    _collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _collect() -> None:
    """Collect what the stage left (its model, its graphs: cycles refcounting does not free), then freeze the
    survivors — imported modules, caches — so the next stage's collection walks only what that stage made: a full
    collection over torch + transformers + mlflow cost ~0.5 s per stage on 2 cores, ~3.5 s of every run. Objects
    alive at a stage boundary are no longer collected as cycles while the walk lasts; run_dag unfreezes them at the
    end."""
    import gc

    gc.collect()
    gc.freeze()


def _end_fluent_runs() -> None:
    """A fluent MLflow run a stage left active would swallow the next stage's runs as its children."""
    if "mlflow" not in sys.modules:
        return
    import mlflow

    with contextlib.suppress(Exception):
        while mlflow.active_run() is not None:
            mlflow.end_run()
