"""The CLI's help says what each command does: every command and subcommand has a description, every option a
help text; `plan` chooses rows (not the budget) and says what it assumed on a machine without a GPU; `mlflow replay`
and `mlflow resolve` each have their own help."""

from __future__ import annotations

import argparse

import pytest

from packtrain.cli import build_parser, main


def _subparsers(p: argparse.ArgumentParser):
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            yield from a.choices.items()


def _walk(p: argparse.ArgumentParser, path: str = "packtrain"):
    yield path, p
    for name, child in _subparsers(p):
        yield from _walk(child, f"{path} {name}")


def test_every_command_has_a_description_and_every_option_a_help():
    missing = []
    for path, p in _walk(build_parser()):
        if not p.description:
            missing.append(f"{path}: no description")
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not a.help:
                missing.append(f"{path} {'/'.join(a.option_strings) or a.dest}: no help")
    assert not missing, missing


def test_plan_help_names_rows_not_the_budget(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "rows per micro-batch" in out and "token budget" not in out


def test_mlflow_subcommands_have_their_own_help(capsys):
    with pytest.raises(SystemExit):
        main(["mlflow", "replay", "--help"])
    replay = capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["mlflow", "resolve", "--help"])
    resolve = capsys.readouterr().out
    assert "--buffer" in replay and "--tracking-uri" in replay and "REF" not in replay and "--stage" not in replay
    assert "REF" in resolve and "--stage" in resolve and "--buffer" not in resolve
    assert main(["mlflow"]) == 2   # no action: a ConfigError naming both
    assert "choose an action: replay or resolve REF" in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the assumption is made without a CUDA device")
def test_plan_says_what_it_assumed_without_a_gpu(capsys):
    assert main(["plan", "--set", "train.device=auto"]) == 0
    out = capsys.readouterr().out
    assert "assumed: no CUDA device here: planned for one GPU of 80 GiB" in out
    assert "--set train.device=cpu to plan for this host's CPU" in out
    assert "attention flex is what train.attention auto picks on CUDA" in out
    assert main(["plan"]) == 0   # the CPU recipe says it plans a CPU process
    out = capsys.readouterr().out
    assert "assumed: train.device cpu: one CPU process's step, against the default 80 GiB" in out
    # a CPU host's plan speaks of the CPU, never of a GPU, and says how to plan for this host or a GPU
    assert "GPU:" not in out.splitlines()[0] and "CPU (train.device cpu): 2048 tokens per step" in out
    assert "· torch · CPU" in out and "1 GPU" not in out and "CUDA context" not in out
    assert "of 80.0 GiB for the CPU process" in out and "e.g. this host's " in out
    assert "--set train.device=cuda to plan for a GPU" in out
    assert "attention sdpa is what train.attention auto picks on the CPU" in out
    assert main(["plan", "--device-memory-gib", "40", "--set", "train.attention=sdpa"]) == 0
    out = capsys.readouterr().out
    assert "assumed:" not in out and "of 40.0 GiB" in out
    assert main(["plan", "--json"]) == 0
    assert '"device_memory_source": "default"' in capsys.readouterr().out
