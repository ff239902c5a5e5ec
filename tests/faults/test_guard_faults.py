"""The utilization guard on real tiny training runs with injected faults (packtrain.faults): a throttled loader is a
data_wait event with its share, an injected recompile names dynamo's failed guard, a step past hang_s checkpoints and
exits 6 and `--resume` ends bit-identical to an uninterrupted run, and a fallback finishes the run with the event and
the change in MLflow (sqlite) while training on the same tokens, once, in order.

Reference: one uninterrupted 20-step run (`straight`, checkpoints every 5, guard on: no events), whose micro-batches
are recorded as it trains. Guard intervals of 2 steps, steady state over 2 intervals (steps 3-6), a drop below 40%
of it (a shared 2-core machine swings tiny CPU steps by 2×; the injected faults slow them 3×)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from packtrain.cli import main

V = 128
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_heads=2", "train.rows=4",
        "train.max_steps=20", "train.warmup_steps=2", "train.checkpoint.every_steps=5",
        "train.checkpoint.keep_last=2", "train.threads=1", "telemetry.interval_s=5", "telemetry.peak_tflops=1",
        "telemetry.guard.interval_steps=2", "telemetry.guard.window=2", "telemetry.guard.drop_fraction=0.6",
        "tracking.enabled=false"]
EAGER_COMPILE = ["train.compile=true", "train.compile_backend=eager"]


def _args(data: Path, out: Path, *extra: str, sets: tuple[str, ...] = ()) -> list[str]:
    all_sets = [*TINY, f"workdir={out.parent / 'work'}", *sets]
    return ["train", "--packs", str(data / "pack"), "--tokens", str(data / "tokenize"), "--out", str(out),
            *[x for s in all_sets for x in ("--set", s)], *extra]


def _result(out: Path) -> dict:
    return json.loads((out / "train_result.json").read_text())


def _weights_equal(a: Path, b: Path) -> bool:
    from safetensors.torch import load_file

    x, y = load_file(a / "model" / "model.safetensors"), load_file(b / "model" / "model.safetensors")
    return x.keys() == y.keys() and all((x[k] == y[k]).all() for k in x)


class TokenTrail:
    """Records every micro-batch `run_step` trains on (a digest of its input ids and labels), in order."""

    def __init__(self, mp: pytest.MonkeyPatch):
        from packtrain.train import loop

        self.digests: list[str] = []
        real = loop.run_step

        def spy(m, window, *a, **kw):
            for b in window:
                h = hashlib.sha256(b.input_ids.numpy().tobytes() + b.labels.numpy().tobytes())
                self.digests.append(h.hexdigest())
            return real(m, window, *a, **kw)

        mp.setattr(loop, "run_step", spy)


@pytest.fixture
def fresh_dynamo():
    """Compiled runs in one process share dynamo's cache (the decoder layer's code object): without a reset, the
    second run finds both graphs cached and compiles nothing (packtrain.testing.gpu_smoke resets it the same way)."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    root = tmp_path_factory.mktemp("guard_data")
    make_synthetic_inputs(root, n_docs=200, vocab_size=V, budget=128, seed=1)
    return root


@pytest.fixture(scope="module")
def straight(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "train"
    with pytest.MonkeyPatch.context() as mp:
        trail = TokenTrail(mp)
        assert main(_args(data, out)) == 0
    assert _result(out)["guard"]["events"] == [] and len(trail.digests) == 20
    return out, trail.digests


def test_a_throttled_loader_is_a_data_wait_event_with_the_share_measured(data, straight, tmp_path, monkeypatch,
                                                                          capsys):
    out = tmp_path / "train"
    monkeypatch.setenv("PACKTRAIN_FAULT", "train.slow_data@11-=0.05")   # 50 ms a micro-batch from step 11 on
    assert main(_args(data, out)) == 0
    g = _result(out)["guard"]
    waits = [e for e in g["events"] if e["signal"] == "data_wait"]
    assert len(waits) == 1 and not [e for e in g["events"] if e["signal"] == "throughput"]   # told once
    e = waits[0]
    assert 12 <= e["step"] <= 16                                    # within 3 intervals of the first slow step
    share = e["measured"]["wait_share"]
    assert share > 0.5 and e["measured"]["wait_s"] >= 0.05 and e["measured"]["steady_wait_share"] < 0.2
    assert f"{share:.0%} of the step time waiting for input" in e["detail"] and e["outcome"] == "warned"
    assert f"guard: step {e['step']} data_wait (data_wait): {e['detail']} → warned" in capsys.readouterr().err
    assert g["steady"]["from_step"] == 3 and g["overhead_frac"] < 0.05
    assert _result(out)["loss_curve"] == _result(straight[0])["loss_curve"]   # waiting changes no number


def test_an_injected_recompile_names_the_guard_that_failed(data, tmp_path, monkeypatch, fresh_dynamo):
    out = tmp_path / "train"
    monkeypatch.setenv("PACKTRAIN_FAULT", "train.recompile@12")
    assert main(_args(data, out, sets=tuple(EAGER_COMPILE))) == 0
    r = _result(out)
    events = [e for e in r["guard"]["events"] if e["signal"] == "recompile"]
    assert len(events) == 1 and events[0]["step"] == 12, r["guard"]["events"]
    reasons = events[0]["measured"]["reasons"]
    assert any("GLOBAL_STATE changed: grad_mode" in x for x in reasons), reasons    # dynamo's own guard failure
    assert "1 compilation(s) after the warm-up" in events[0]["detail"] and reasons[0] in events[0]["detail"]
    assert r["recompiles"] == 1                                   # the run's own counter agrees


def test_a_step_past_hang_s_checkpoints_exits_6_and_resume_is_bit_exact(data, straight, tmp_path, monkeypatch,
                                                                       capsys):
    out = tmp_path / "train"
    hang = ("telemetry.guard.hang_s=1", "telemetry.guard.actions.hang=checkpoint_and_stop")
    monkeypatch.setenv("PACKTRAIN_FAULT", "train.slow_step@12=1.6")
    assert main(_args(data, out, sets=hang)) == 6
    err = capsys.readouterr().err
    assert "guard: rank 0 step 12 has been running" in err                     # the watchdog, while it ran
    assert "the utilization guard stopped training after step 12: hang (slow_step) at step 12" in err
    assert f"Checkpoint {out / 'checkpoints' / 'step_000012'} is kept: `packtrain train --resume`" in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000010", "step_000012"]
    assert not (out / "model").exists() and not (out / "train_result.json").exists()
    stopped = json.loads((out / "guard_events.json").read_text())
    assert stopped["stopped"]["signal"] == "hang" and stopped["events"][0]["measured"]["step_time_s"] > 1.0
    monkeypatch.delenv("PACKTRAIN_FAULT")
    assert main(_args(data, out, "--resume", sets=hang)) == 0
    r = _result(out)
    assert r["setup"]["resumed_from"] == 12
    assert r["loss_curve"] == _result(straight[0])["loss_curve"] and _weights_equal(out, straight[0])
    assert [e["signal"] for e in r["guard"]["events"]] == ["hang"]               # the first attempt's, kept


def test_a_step_stuck_past_twice_hang_s_ends_the_process_with_exit_6_and_says_why(data, tmp_path, monkeypatch):
    """A step that does not return cannot be checkpointed: after 2 × hang_s the watchdog writes the event and the error
    record (what a launcher or KFP reads) and ends the process, exit 6. Here os._exit records the code instead, so
    the stalled step returns later and the loop stops it as a slow step too."""
    import os

    from packtrain.error_record import ERROR_FILE_ENV

    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    monkeypatch.setenv(ERROR_FILE_ENV, str(tmp_path / "error.json"))
    monkeypatch.setenv("PACKTRAIN_FAULT", "train.slow_step@12=3.5")
    out = tmp_path / "train"
    hang = ("telemetry.guard.hang_s=1", "telemetry.guard.actions.hang=checkpoint_and_stop")
    assert main(_args(data, out, sets=hang)) == 6
    assert exits == [6]
    ended = json.loads((out / "guard_events.json").read_text())["events"][0]
    assert ended["signal"] == "hang" and re.match(r"process ended \(exit 6\) after [23]\.\d s", ended["outcome"])
    assert f"`packtrain train --resume` continues from {out / 'checkpoints' / 'step_000010'}" in ended["outcome"]
    record = json.loads((tmp_path / "error.json").read_text())
    assert (record["type"], record["exit_code"]) == ("GuardStopped", 6) and "step 12 stuck for " in record["message"]


def test_fallback_finishes_with_the_event_and_change_in_mlflow_and_the_same_tokens(data, straight, tmp_path,
                                                                                 monkeypatch, fresh_dynamo):
    out, work = tmp_path / "train", tmp_path / "work"
    monkeypatch.setenv("PACKTRAIN_FAULT", "train.recompile@12")
    trail = TokenTrail(monkeypatch)
    sets = (*EAGER_COMPILE, "telemetry.guard.actions.recompile=fallback", "tracking.enabled=true",
            f"workdir={work}", "tracking.system_metrics=false")
    assert main(_args(data, out, sets=sets)) == 0
    assert trail.digests == straight[1]                           # same micro-batches, once each, in order
    r = _result(out)
    (f,) = r["guard"]["fallbacks"]
    assert (f["step"], f["change"], Path(f["checkpoint"]).name) == (12, "compile_off", "step_000012")
    assert f["after"]["compiles"] == r["compiles"] == 2           # nothing compiled after the change
    import mlflow

    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("packtrain").experiment_id])
    history = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
               for k in ("guard.events", "guard.recompile", "guard.fallback")}
    assert history == {"guard.events": [(12, 1.0)], "guard.recompile": [(12, 1.0)], "guard.fallback": [(12, 1.0)]}
    tags = run.data.tags
    assert tags["packtrain.guard.events"] == ("1; last: recompile at step 12 (recompile) → fallback compile_off "
                                              "(checkpoint step_000012)")
    assert tags["packtrain.guard.fallbacks"] == "compile_off@12"
    assert run.data.metrics["guard.fallbacks_total"] == 1.0
    logged = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="guard_events.json",
                                                 tracking_uri=uri, dst_path=str(tmp_path))
    assert json.loads(Path(logged).read_text())["fallbacks"][0]["change"] == "compile_off"


def test_release_cache_fallback_keeps_the_loss_curve_and_max_fallbacks_caps_it(data, straight, tmp_path,
                                                                             monkeypatch):
    out = tmp_path / "train"
    monkeypatch.setenv("PACKTRAIN_FAULT", "train.alloc_retry@11,train.alloc_retry@15")
    sets = ("telemetry.guard.actions.alloc_retries=fallback", "telemetry.guard.max_fallbacks=1")
    assert main(_args(data, out, sets=sets)) == 0
    r = _result(out)
    e1, e2 = [e for e in r["guard"]["events"] if e["signal"] == "alloc_retries"]
    assert (e1["step"], e1["outcome"]) == (12, "fallback release_cache (checkpoint step_000012)")
    assert (e2["step"], e2["outcome"]) == (16, "warned: telemetry.guard.max_fallbacks 1 reached")
    (f,) = r["guard"]["fallbacks"]
    assert f["change"] == "release_cache" and f["after"] is not None and f["before"]["alloc_retries"] == 0
    assert r["loss_curve"] == _result(straight[0])["loss_curve"] and _weights_equal(out, straight[0])
