"""The in-process runner's parts (packtrain.pipeline.dag, packtrain.pipeline.progress): progress read from the live
tqdm object equals what the bar draws, the events render as `packtrain run`'s lines, a stage's changes to the
process are put back, and a failing stage stops the walk as StageFailed carrying its own error and exit code."""

from __future__ import annotations

import io
import logging
import os

import pytest

from packtrain.errors import InputDataError, MissingDataError, StageFailed
from packtrain.pipeline.progress import StageEvent, StageLines, bar_state, parse_bar


def test_bar_state_reads_what_the_bar_draws():
    from tqdm import tqdm

    drawn = io.StringIO()
    bar = tqdm(total=6, desc="train", unit="step", file=drawn, mininterval=0, ascii=False)
    bar.update(2)
    bar.set_postfix(loss="5.3648", tok_s="10,233")
    last = drawn.getvalue().split("\r")[-1]
    want, got = parse_bar(last), bar_state(bar)
    bar.close()
    assert want is not None
    for key in ("desc", "n", "total", "pct", "postfix"):
        assert got[key] == want[key], key
    assert (got["n"], got["total"], got["pct"], got["postfix"]) == (2, 6, 33, {"loss": "5.3648", "tok_s": "10,233"})


def test_stage_lines_render_the_events():
    out = io.StringIO()
    lines = StageLines(out)
    bar = {"desc": "train", "n": 1, "total": 2, "pct": 50, "elapsed": "0:07", "remaining": "0:07",
           "postfix": {"loss": "5.7373", "tok_s": "18"}}
    for ev in (StageEvent("start", "pack", 4, 7), StageEvent("end", "pack", 4, 7, "success", 1.23),
               StageEvent("start", "train", 5, 7), StageEvent("progress", "train", 5, 7, bar=bar),
               StageEvent("end", "train", 5, 7, "success", 16.84, cached=True),
               StageEvent("start", "evaluate", 6, 7), StageEvent("end", "evaluate", 6, 7, "failure", 0.5)):
        lines(ev)
    assert out.getvalue().splitlines() == [
        "[4/7] pack      success in 1.2 s",
        "[5/7] train     step 1/2 (50%) · loss 5.7373 · 18 tok/s · 0:07 elapsed · ETA 0:07",
        "[5/7] train     success in 16.8 s (cached)",
        "[6/7] evaluate  failure in 0.5 s"]


def test_own_process_puts_the_process_back(tmp_path, monkeypatch):
    import torch

    from packtrain.pipeline.dag import FRESH_TORCH_SEED, own_process

    monkeypatch.setenv("PACKTRAIN_TEST_KEPT", "1")
    cwd, threads = os.getcwd(), torch.get_num_threads()
    lib = logging.getLogger("packtrain.test.lib")
    lib.setLevel(logging.INFO)
    root_handlers = list(logging.getLogger().handlers)
    torch.manual_seed(1)
    with own_process():
        assert torch.initial_seed() == FRESH_TORCH_SEED   # each stage starts from a fresh process's generator
        os.environ["PACKTRAIN_TEST_ADDED"] = "x"
        os.environ["PACKTRAIN_TEST_KEPT"] = "changed"
        os.chdir(tmp_path)
        torch.set_num_threads(1)
        torch.set_grad_enabled(False)
        lib.setLevel(logging.ERROR)
        logging.getLogger().addHandler(logging.StreamHandler(io.StringIO()))
    assert "PACKTRAIN_TEST_ADDED" not in os.environ and os.environ["PACKTRAIN_TEST_KEPT"] == "1"
    assert os.getcwd() == cwd and torch.get_num_threads() == threads and torch.is_grad_enabled()
    assert lib.level == logging.INFO and logging.getLogger().handlers == root_handlers


def test_a_failing_stage_stops_the_walk_with_its_own_exit_code(tmp_path):
    from packtrain.config import load_run_config
    from packtrain.pipeline.dag import run_dag

    missing = tmp_path / "no_such_corpus"
    cfg = load_run_config("tiny-cpu", [f"workdir={tmp_path / 'wd'}", f"ingest.source={missing}",
                                       "tracking.enabled=false"])
    events: list[StageEvent] = []
    log = io.StringIO()
    with pytest.raises(StageFailed) as e:
        run_dag(cfg, tmp_path / "run", on_event=events.append, output=log)
    assert e.value.stage == "ingest" and isinstance(e.value.cause, (InputDataError, MissingDataError))
    assert e.value.exit_code == e.value.cause.exit_code in (3, 5)
    assert str(missing) in str(e.value) and str(e.value).startswith("stage ingest failed: ")
    assert [(ev.kind, ev.stage, ev.status) for ev in events] == [("start", "ingest", None),
                                                                   ("end", "ingest", "failure")]
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["ingest"]   # nothing after ingest started
    assert not missing.exists()
