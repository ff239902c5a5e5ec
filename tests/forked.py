"""`packtrain ...` in a process of its own that starts from this test process's imports: a fork (multiprocessing's
"fork" context) that runs `packtrain.cli.main(args)` and exits with its code.

    proc = Forked(["train", ...], env={**os.environ, "PACKTRAIN_FAULT": "checkpoint.manifest"}, log=tmp / "err")
    proc.wait(timeout=300)    # → -9: the fault SIGKILLed it;  proc.pid, proc.poll(), proc.kill() as on a Popen

A real process, as `subprocess.run([sys.executable, "-m", "packtrain.cli", ...])` starts: its own pid (the locks
name it, PACKTRAIN_FAULT's kill points SIGKILL it, a test's SIGKILL lands on it alone), its own environment,
stdout and stderr on file descriptors 1 and 2 (`log`, default /dev/null), exit code or -signal as a Popen's. What
it skips is the fresh interpreter's ~4-5 CPU-s of importing torch, transformers and MLflow (packtrain.cli's own
entry: `python -m packtrain.cli` is proved by the tests that start it). The child leaves pytest's capture,
warning recorder and log handlers for what a fresh interpreter has (its default warning filters, printed to
stderr; logging's last-resort handler), makes its own tracking clients and its own connections to the sqlite
stores this process has open (SQLAlchemy's `dispose(close=False)` after a fork; MLflow's HTTP sessions are per
pid already), and runs its own atexit handlers, not this process's, before it exits.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path


def _cli(args: list[str]) -> int:
    from packtrain.cli import main

    return main(args)


def _child(args: list[str] | Callable[[], int], env: dict[str, str], log: str, err: str | None,
           cwd: str | None) -> None:
    import atexit
    import logging
    import sys
    import warnings

    def redirect(path: str, fds: tuple[int, ...]) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        for to in fds:
            os.dup2(fd, to)
        os.close(fd)

    redirect(log, (1, 2) if err is None else (1,))
    if err is not None:
        redirect(err, (2,))
    if cwd is not None:
        os.chdir(cwd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)   # noqa: SIM115 - fds 1/2 live as long as the process
    sys.stderr = open(2, "w", buffering=1, closefd=False)   # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    atexit._clear()                                          # this test process's handlers are not the child's
    warnings.resetwarnings()   # a fresh interpreter's filters (no -W): DeprecationWarning shown in __main__ only
    for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    warnings._showwarnmsg_impl = lambda msg: sys.stderr.write(warnings._formatwarnmsg(msg))
    logging.root.handlers.clear()
    lifecycle = sys.modules.get("packtrain.tracking.run_lifecycle")
    if lifecycle is not None:   # this process's tracking clients (their buffer files, their threads) are not the child's
        lifecycle._clients.clear()
        lifecycle._pipeline_clients.clear()
    publish = sys.modules.get("packtrain.publish")
    if publish is not None:   # PACKTRAIN_FAULT=publish@N counts this process's publish points from 0, as a fresh one does
        import itertools

        publish._fault_counter = itertools.count()
    if "sqlalchemy" in sys.modules:   # MLflow's cached sqlite stores: new connections here, the parent's left alone
        import gc

        from sqlalchemy.engine import Engine

        for engine in [o for o in gc.get_objects() if isinstance(o, Engine)]:
            engine.dispose(close=False)
    code = 1
    try:
        code = args() if callable(args) else _cli(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


def preload() -> None:
    """What every `packtrain train` imports and this process may not have yet (a no-op once imported: every worker
    of a whole `make test` has): torch and transformers' Llama (~4.5 CPU-s), MLflow (~2). Imported here once before
    a `packtrain` fork, not in each fork; a function's fork imports what it needs itself."""
    import mlflow  # noqa: F401
    from transformers import LlamaForCausalLM  # noqa: F401


class Forked:
    """One forked `packtrain` (module doc); Popen's pid / poll / wait / kill / returncode."""

    def __init__(self, args: list[str] | Callable[[], int], env: dict[str, str] | None = None,
                 log: Path | str = os.devnull, err: Path | str | None = None, cwd: Path | str | None = None):
        """`packtrain ARGS`, or `args()` (a function of the test returning the exit code: a stage that a test runs
        in another process); stdout to `log`, stderr there too or to `err`; in `cwd` (default: this process's)."""
        if not callable(args):
            preload()
        self._p = multiprocessing.get_context("fork").Process(
            target=_child, args=(args if callable(args) else list(args), dict(os.environ if env is None else env), str(log),
                                 None if err is None else str(err), None if cwd is None else str(cwd)), daemon=False)
        self._p.start()
        self.pid = self._p.pid

    @property
    def returncode(self) -> int | None:
        return self._p.exitcode

    def poll(self) -> int | None:
        self._p.join(0)
        return self._p.exitcode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (-N: killed by signal N); TimeoutError if still running after `timeout` seconds."""
        self._p.join(timeout)
        if self._p.exitcode is None:
            raise TimeoutError(f"packtrain (pid {self.pid}) still running after {timeout} s")
        return self._p.exitcode

    def kill(self) -> None:
        if self._p.exitcode is None:
            self._p.kill()


def run_forked(args: list[str] | Callable[[], int], env: dict[str, str] | None = None, log: Path | str = os.devnull,
               timeout: float = 600, err: Path | str | None = None, cwd: Path | str | None = None) -> int:
    """Run to the end (killed after `timeout` s: TimeoutError); the exit code."""
    proc = Forked(args, env, log, err, cwd)
    try:
        return proc.wait(timeout)
    except TimeoutError:
        proc.kill()
        proc.wait()
        raise
