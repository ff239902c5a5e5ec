"""The utilization guard's decisions on literal intervals (packtrain.telemetry.guard), its hang watchdog with a real
thread (packtrain.telemetry.watchdog), its config, fault points and summary line. The runs that inject these faults
into real training are tests/faults/test_guard_faults.py."""

from __future__ import annotations

import json
import time

import pytest

from packtrain.config import GuardConfig, load_run_config
from packtrain.errors import ConfigError
from packtrain.faults import FAULT_ENV, fault_arg
from packtrain.telemetry.guard import Guard, IntervalStats, combine, fallback_change, straggler
from packtrain.telemetry.watchdog import Hang, Watchdog

CFG = GuardConfig(interval_steps=10, window=2, drop_fraction=0.3, consecutive=2, max_data_wait=0.2)


def _iv(step: int, step_s: float = 0.100, wait_s: float = 0.002, tokens: float = 4000.0, **kw) -> IntervalStats:
    """An interval whose every step took `step_s` (of it `wait_s` waiting for data) for `tokens` tokens."""
    return IntervalStats(last_step=step, tok_s=tokens / step_s, step_s=step_s, wait_s=wait_s,
                         wait_share=wait_s / step_s, **kw)


def _steady_guard(**kw) -> Guard:
    g = Guard(CFG.model_copy(update=kw), max_fragmentation=0.10)
    g.arm(_iv(2, compiles=4.0))
    for step in (12, 22):
        assert g.check([_iv(step, compiles=4.0)]) == []
    assert g.steady is not None and g.steady.tok_s == pytest.approx(40_000)
    return g


def test_steady_state_is_the_median_of_the_first_window_intervals():
    g = Guard(CFG, 0.10)
    g.arm(_iv(2))
    assert g.check([_iv(12, step_s=0.100)]) == [] and g.steady is None
    assert g.check([_iv(22, step_s=0.200)]) == []
    s = g.steady
    assert s is not None and (s.from_step, s.until_step) == (3, 22)
    assert s.step_s == pytest.approx(0.150) and s.tok_s == pytest.approx((40_000 + 20_000) / 2)


# interval: (step_s, wait_s, extra counters) → the worked example of the module docstring and its siblings
@pytest.mark.parametrize("slow, cause, words", [
    (dict(step_s=0.250, wait_s=0.150), "data_wait", "the data wait grew 0.148 s of the step time's 0.150 s"),
    (dict(step_s=0.250, wait_s=0.002), "compute", "the step's own time (without data wait) grew 0.150 s"),
    (dict(step_s=0.250, wait_s=0.002, sm_clock_mhz=1200.0), "throttle", "SM clock 1200 MHz (steady 1980)"),
])
def test_a_drop_for_consecutive_intervals_is_one_event_with_its_measured_cause(slow, cause, words):
    g = Guard(CFG, 0.10)
    g.arm(_iv(2, sm_clock_mhz=1980.0))
    for step in (12, 22):
        g.check([_iv(step, sm_clock_mhz=1980.0)])
    extra = {"sm_clock_mhz": 1980.0} if "sm_clock_mhz" not in slow else {}
    assert g.check([_iv(32, **slow, **extra)]) == []                        # one slow interval: not yet
    events = g.check([_iv(42, **slow, **extra)])
    drop = [e for e in events if e.signal == "throughput"]
    if cause == "data_wait":   # told once, by the data_wait signal: 60% > max_data_wait 20%
        assert [e.signal for e in events] == ["data_wait"] and events[0].value == pytest.approx(0.6)
        assert "60% of the step time waiting for input" in events[0].detail
        return
    assert len(drop) == 1 and drop[0].cause == cause and words in drop[0].detail, drop
    assert drop[0].value == pytest.approx(0.4) and "16,000 tok/s = 40% of the steady 40,000" in drop[0].detail
    assert g.check([_iv(52, **slow, **extra)]) == []                        # the same episode: not again
    assert g.check([_iv(62, sm_clock_mhz=1980.0)]) == []                    # recovered
    g.check([_iv(72, **slow, **extra)])
    assert [e.signal for e in g.check([_iv(82, **slow, **extra)])] == ["throughput"]   # a new episode


def test_hard_signals_fire_at_once_and_name_their_numbers():
    g = _steady_guard()
    events = g.check([_iv(32, compiles=5.0, alloc_retries=3.0, ooms=0.0, fragmentation=0.25)],
                     reasons=["forward (modeling_llama.py:261): tensor 'x' size mismatch at index 1"])
    by = {e.signal: e for e in events}
    assert set(by) == {"recompile", "alloc_retries", "fragmentation"}
    assert "1 compilation(s) after the warm-up: forward (modeling_llama.py:261): tensor 'x' size" in \
        by["recompile"].detail
    assert by["alloc_retries"].measured["alloc_retries"] == 3 and "steps 23-32" in by["alloc_retries"].detail
    assert by["fragmentation"].value == pytest.approx(0.25) and "25.0% > telemetry.max_fragmentation 10%" in \
        by["fragmentation"].detail
    assert {fallback_change(e) for e in events} == {"compile_off", "release_cache"}


def test_a_drop_caused_by_recompiles_is_told_by_the_recompile_event_only():
    g = _steady_guard()
    slow = dict(step_s=0.400, compiles=4.0)
    g.check([_iv(32, **slow)])
    events = g.check([_iv(42, step_s=0.400, compiles=6.0)])
    assert [e.signal for e in events] == ["recompile"]


def test_intervals_with_a_hard_signal_are_not_learned_as_steady():
    g = Guard(CFG, 0.10)
    g.arm(_iv(2, compiles=1.0))
    assert [e.signal for e in g.check([_iv(12, step_s=1.0, compiles=9.0)])] == ["recompile"]
    g.check([_iv(22, compiles=9.0)])
    g.check([_iv(32, compiles=9.0)])
    assert g.steady is not None and g.steady.step_s == pytest.approx(0.100)


def test_relearn_after_a_fallback_takes_the_new_speed_as_steady():
    g = _steady_guard()
    g.relearn()
    for step in (32, 42, 52, 62):
        assert g.check([_iv(step, step_s=0.300, compiles=4.0)]) == []   # eager is slower: no drop, a new steady
    assert g.steady is not None and g.steady.step_s == pytest.approx(0.300)


def test_a_straggler_is_named_by_rank_and_every_rank_decides_the_same():
    ok, slow_data = _iv(22, step_s=0.400, wait_s=0.010), _iv(22, step_s=0.400, wait_s=0.300)
    lag = straggler([ok, slow_data, ok], 0.3)
    assert lag is not None and lag[0] == 1 and lag[1] == pytest.approx(0.29)
    clocks = [_iv(22, sm_clock_mhz=1980.0), _iv(22, sm_clock_mhz=1980.0), _iv(22, sm_clock_mhz=990.0)]
    assert straggler(clocks, 0.3)[:2] == (2, 990.0)
    assert straggler([ok, ok], 0.3) is None and straggler([slow_data], 0.3) is None
    gathered = [IntervalStats.from_vector(r.vector()) for r in (ok, slow_data)]   # what all_gather hands each rank
    assert gathered == [ok, slow_data]
    decisions = []
    for _rank in range(2):
        g = Guard(CFG, 0.10)
        g.arm(combine([_iv(2), _iv(2)]))
        decisions.append([(e.signal, e.rank, e.detail) for e in g.check(gathered)])
    assert decisions[0] == decisions[1] == [("straggler", 1, "rank 1 waits 0.300 s a step for its input, the "
                                                               "others 0.010 s (step 0.400 s)")]
    c = combine(gathered)
    assert (c.step_s, c.wait_s, c.tok_s) == (0.400, 0.300, 10_000)


def test_watchdog_flags_a_long_step_once_and_ignores_idle_time(tmp_path):
    seen: list[Hang] = []
    w = Watchdog(0.2, seen.append, rank=1, heartbeat_dir=tmp_path / "beats").start()
    try:
        w.begin(7, "data")
        w.begin(7, "step")
        time.sleep(0.6)
        w.idle()                                 # a checkpoint save: not a step
        time.sleep(0.4)
        w.begin(8, "data")
        time.sleep(0.05)
    finally:
        w.stop()
    assert [(h.step, h.phase, h.rank) for h in seen] == [(7, "step", 1)] and seen[0].open_s > 0.2
    assert [(h.step, h.phase) for h in w.take()] == [(7, "step")] and w.take() == []
    assert seen[0].ranks and seen[0].ranks[0]["step"] == 7                # its own heartbeat, written at the flag
    assert not (tmp_path / "beats").exists()                              # the last rank out removes the folder


def test_a_rank_that_ends_first_leaves_the_others_heartbeats_working(tmp_path, capsys):
    """Rank 1 stops before rank 0 wrote a heartbeat: it removes the empty folder; rank 0 still beats (it printed
    'guard: watchdog: FileNotFoundError' and lost its heartbeat for the rest of its run)."""
    beats = tmp_path / "beats"
    w0 = Watchdog(4, rank=0, heartbeat_dir=beats).start()   # its first heartbeat after a poll of 1 s
    w0.begin(3, "step")
    Watchdog(4, rank=1, heartbeat_dir=beats).start().stop()
    assert not beats.exists()
    try:
        time.sleep(1.4)
        assert json.loads((beats / "rank-0.json").read_text())["step"] == 3
    finally:
        w0.stop()
    assert "watchdog" not in capsys.readouterr().err and not beats.exists()


def test_the_stuck_rank_is_named_from_the_heartbeats():
    beats = [{"rank": 0, "step": 13, "phase": "sync", "open_s": 12.0, "done_step": 13},
             {"rank": 1, "step": 13, "phase": "data", "open_s": 12.1, "done_step": 12}]
    assert Hang(13, "sync", 12.0, 0, beats).stuck() == ("rank 1 in data at step 13 for 12.1 s, last step done 12 "
                                                        "(ranks 0 in sync 13)")
    behind = [{"rank": 0, "step": 14, "phase": "step", "open_s": 9.0, "done_step": 13},
              {"rank": 1, "step": 13, "phase": "step", "open_s": 30.0, "done_step": 12},
              {"rank": 2, "step": 14, "phase": "step", "open_s": 9.0, "done_step": 13}]
    assert Hang(14, "step", 9.0, 0, behind).stuck() == ("rank 1 in step at step 13 for 30.0 s, last step done 12 "
                                                        "(ranks 0, 2 in step 14)")


def test_a_step_stuck_past_exit_after_ends_the_process_with_the_guard_code(tmp_path):
    """checkpoint_and_stop on a step that never returns: the watchdog says so and exits (exit 6); the exit function
    is the test's here (os._exit in the product)."""
    exits: list[int] = []
    told: list[Hang] = []
    w = Watchdog(0.1, rank=0, exit_after_s=0.3, before_exit=told.append, exit=exits.append).start()
    try:
        w.begin(3, "data")
        w.begin(3, "step")
        deadline = time.monotonic() + 5
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        w.stop()
    assert exits[:1] == [6] and told[0].step == 3 and told[0].open_s > 0.3


def test_fault_points_take_steps_and_values(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "train.slow_data@11-=0.05,train.slow_step@12=1.5,train.recompile@7,other")
    assert [fault_arg("train.slow_data", s) for s in (10, 11, 500)] == [None, "0.05", "0.05"]
    assert [fault_arg("train.slow_step", s) for s in (11, 12, 13)] == [None, "1.5", None]
    assert fault_arg("train.recompile", 7) == "" and fault_arg("other") == "" and fault_arg("train.nan_loss", 1) is None
    monkeypatch.delenv(FAULT_ENV)
    assert fault_arg("train.slow_data", 11) is None


def test_guard_config_allows_a_fallback_only_where_one_exists():
    cfg = load_run_config("tiny-cpu", ["telemetry.guard.actions.recompile=fallback"]).telemetry.guard
    assert cfg.actions.recompile == "fallback" and cfg.actions.hang == "warn" and cfg.enabled
    for signal in ("hang", "data_wait", "straggler"):
        with pytest.raises(ConfigError, match=rf"telemetry.guard.actions.{signal}: 'fallback' is not allowed: must "
                                              "be one of 'warn', 'checkpoint_and_stop'"):
            load_run_config("tiny-cpu", [f"telemetry.guard.actions.{signal}=fallback"])
    with pytest.raises(ConfigError, match="telemetry.guard.drop_fraction: 1.5 is not allowed"):
        load_run_config("tiny-cpu", ["telemetry.guard.drop_fraction=1.5"])


def test_run_summary_lists_the_guard_events():
    from packtrain.pipeline.summary import build_summary, format_summary

    events = [{"step": 14, "signal": "data_wait", "cause": "data_wait", "outcome": "warned"},
              {"step": 22, "signal": "throughput", "cause": "compute", "outcome": "warned"},
              {"step": 30, "signal": "recompile", "cause": "recompile", "outcome": "fallback compile_off"}]
    s = build_summary({"train": {"guard": {"enabled": True, "events": events}}})
    lines = format_summary("tiny-cpu", s, 1.0, 7, None).splitlines()
    assert lines[-1] == ("  guard      3 event(s): data_wait at step 14 → warned; throughput at step 22 (compute) → "
                         "warned; recompile at step 30 → fallback compile_off")
    quiet = build_summary({"train": {"guard": {"enabled": True, "events": []}}})
    assert not any("guard" in x for x in format_summary("tiny-cpu", quiet, 1.0, 7, None).splitlines())
    assert json.loads(json.dumps(s["guard_events"])) == events
