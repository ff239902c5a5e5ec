"""The gpu-throughput suite's goals: a speedup goal is the packtrain row over a baseline row of the same run."""

from bench.suites.gpu_throughput import GOALS, speedups


def test_speedup_is_taken_within_one_run_and_a_failed_baseline_gives_none():
    ours = {"variant": "packtrain", "real_tok_per_s": 132_000.0}
    rows = [{"variant": "hf_packed", "real_tok_per_s": 60_000.0}, ours,
            {"variant": "packtrain_alt", "error": "OutOfMemoryError: ..."}]
    assert speedups(ours, rows) == {"speedup_vs_hf_packed": 2.2}
    assert speedups(ours, [ours]) == {}
    assert GOALS["qwen2-0.5b"] == {"speedup_vs_hf_packed": 2.2, "useful_mfu": 0.55}
