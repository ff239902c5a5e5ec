"""`packtrain run` reaches a stage's own code in 5 calls (packtrain.pipeline.local.run_local's docstring,
docs/architecture.md "The run path"): the stack while a stage runs, recorded from a real run whose ingest stage
fails at once (a missing corpus; tracking off: no MLflow)."""

from __future__ import annotations

import sys
from pathlib import Path

RUN_PATH = [
    ("packtrain/cli.py", "main"),
    ("packtrain/commands/run.py", "run"),
    ("packtrain/pipeline/local.py", "run_local"),
    ("packtrain/pipeline/dag.py", "run_dag"),
    ("packtrain/pipeline/runtime.py", "run_stage"),
    ("packtrain/stages/ingest.py", "run_ingest"),
]


def _where(frame) -> tuple[str, str]:
    path = Path(frame.f_code.co_filename).as_posix()
    return path[path.rfind("packtrain/"):], frame.f_code.co_name


def test_run_reaches_a_stage_in_five_calls(tmp_path, capsys):
    from packtrain.cli import main

    stacks: list[list[tuple[str, str]]] = []

    def on_call(frame, event, arg) -> None:
        if event == "call" and frame.f_code.co_name == "run_ingest" and not stacks:
            stack = []
            while frame is not None:
                stack.append(_where(frame))
                if stack[-1] == RUN_PATH[0]:
                    break
                frame = frame.f_back
            stacks.append(stack[::-1])

    argv = ["run", "--set", f"workdir={tmp_path / 'wd'}", "--set", f"ingest.source={tmp_path / 'no_corpus'}",
            "--set", "tracking.enabled=false"]
    sys.setprofile(on_call)
    try:
        code = main(argv)
    finally:
        sys.setprofile(None)
    assert code != 0 and "stage ingest failed" in capsys.readouterr().err   # the run got there, then stopped
    assert stacks == [RUN_PATH], "the calls from `packtrain run` to the stage runner changed: update " \
        "run_local's docstring and docs/architecture.md, and keep it at most 6"
