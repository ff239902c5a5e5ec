"""Every GPU figure as a record with its card and goals: the README's headline rows name the card their record was
measured on, the rows of one card stand together, and a ratio across cards or runs is refused (bench/headline.py);
a record's `limits` (what limited a goal not met) is checked when written and shown by the results page
(bench/harness.py, bench/report.py)."""

from __future__ import annotations

import json

import pytest

from bench import headline, report
from bench.harness import Record, check_record, write_record


def test_every_headline_row_names_the_card_of_its_record():
    body = headline.table()[2:]
    cards = [line.split(" | ")[1] for line in body]
    for row, card in zip(headline.ROWS, cards, strict=True):
        doc = json.loads((headline.RESULTS / row.ours[0]).read_text(encoding="utf-8"))
        machine = doc["machine"] if isinstance(doc, dict) else doc[0]["machine"]
        assert card == (machine.get("device") or machine["gpu"]).removeprefix("NVIDIA ")
    assert {"H200", "H100 80GB HBM3"} <= set(cards)
    runs = [c for k, c in enumerate(cards) if k == 0 or cards[k - 1] != c]
    assert len(runs) == len(set(runs)), f"the rows of one card are split: {cards}"


def test_a_ratio_across_cards_or_runs_is_refused():
    across_cards = headline.Row("x", ("gpu_bench_350m.json", "variant=packtrain.real_tok_per_s"),
                                ("fp8_bench_3b_h100.json", "variant=bf16.real_tokens_per_s"), "bf16",
                                ("gpu_bench_350m.json", "variant=packtrain.useful_mfu"))
    with pytest.raises(ValueError, match="different cards"):
        headline.card(across_cards)
    across_runs = headline.Row("y", ("gpu_bench_350m.json", "variant=packtrain.real_tok_per_s"),
                               ("gpu_bench_1b.json", "variant=hf_packed.real_tok_per_s"), "hf",
                               ("gpu_bench_350m.json", "variant=packtrain.useful_mfu"))
    with pytest.raises(ValueError, match="not one run"):
        headline.card(across_runs)
    # the lora suite writes one file per variant of one run: that pair is one run
    assert headline.card(next(r for r in headline.ROWS if r.theirs and r.theirs[0] != r.ours[0])) == "H200"


def _record(**kw) -> Record:
    return Record(suite="fp8", command="python -m bench fp8", machine={"device": "NVIDIA H100 80GB HBM3"},
                  rows=[{"variant": "bf16", "real_tokens_per_s": 1.0}], goals={"tok_s_ratio_min": 1.25,
                  "steps_min": 200}, goal_met={"speedup": False, "steps": True}, **kw)


def test_limits_name_goals_not_met_and_say_what_was_tried():
    ok = {"speedup": {"limit": "an example limit", "tried": ["fp8_nomix", "rowwise"]}}
    assert check_record(_record(limits=ok).to_dict()) == []
    assert check_record(_record().to_dict()) == [] and _record().to_dict()["limits"] == {}
    met_goal = check_record(_record(limits={"steps": ok["speedup"]}).to_dict())
    assert met_goal == ["limits['steps']: not a goal of goal_met that is not met (True)"]
    no_tried = check_record(_record(limits={"speedup": {"limit": "x"}}).to_dict())
    assert len(no_tried) == 1 and no_tried[0].startswith("limits['speedup']: want")


def _goal_rows(tmp_path, monkeypatch, name: str, rec) -> list[str]:
    """The results page's goals table rows (no header) of record `rec`, written as `name` into a folder of its own."""
    write_record(tmp_path / name, rec)
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    return report.goals(name)[2:]


def test_the_results_page_shows_the_limit_of_a_goal_not_met(tmp_path, monkeypatch):
    rec = _record(limits={"speedup": {"limit": "an example limit", "tried": ["fp8_nomix", "rowwise"]}})
    assert _goal_rows(tmp_path, monkeypatch, "fp8.json", rec) == [
        "| fp8.json | speedup | 1.25 | **not met** | an example limit | fp8_nomix; rowwise |",
        "| fp8.json | steps | 200 | met | – | – |"]


def test_the_results_page_lists_every_run_of_a_pipeline_record_linked_from_its_folder():
    name = "gpu_pipeline_350m_h100.json"
    runs = json.loads((report.RESULTS / name).read_text(encoding="utf-8"))["rows"]
    body = report.pipeline(name)[2:]
    assert len(body) == len(runs) and all(line.startswith(f"| {r['steps']:,} steps (")
                                          for r, line in zip(runs, body, strict=True))
    assert all(line.endswith(f"[{name}]({name}) |") for line in body)          # GPU_RESULTS.md sits beside it
    assert headline.pipeline_table(((name, 0),))[-1].endswith(f"[{name}](bench/results/{name}) |")   # README


def test_the_fp8_goals_show_their_own_targets(tmp_path, monkeypatch):
    """loss is judged on loss_rel_diff_last_n_max (not loss_last_n, the window), planner_<variant> on
    planner_error_abs_max."""
    rec = Record(suite="fp8", command="python -m bench fp8", machine={"device": "NVIDIA H100 80GB HBM3"},
                 rows=[{"variant": "bf16", "real_tokens_per_s": 1.0}],
                 goals={"loss_last_n": 50, "loss_rel_diff_last_n_max": 0.01, "planner_error_abs_max": 0.1},
                 goal_met={"loss": True, "planner_fp8_nomix": True})
    assert _goal_rows(tmp_path, monkeypatch, "fp8.json", rec) == [
        "| fp8.json | loss | 0.01 | met | – | – |", "| fp8.json | planner_fp8_nomix | 0.1 | met | – | – |"]


def test_the_throughput_goals_show_the_targets_of_the_records_model(tmp_path, monkeypatch):
    """gpu-throughput records hold GOALS for every model; the row takes its own model's."""
    rec = Record(suite="gpu-throughput", command="python -m bench gpu-throughput --model qwen2-0.5b",
                 machine={"device": "NVIDIA H100 80GB HBM3"}, settings={"model": "qwen2-0.5b"},
                 rows=[{"variant": "packtrain", "real_tok_per_s": 1.0}],
                 goals={"1b": {"useful_mfu": 0.55}, "qwen2-0.5b": {"speedup_vs_hf_packed": 2.2, "useful_mfu": 0.5}},
                 goal_met={"speedup_vs_hf_packed": True, "useful_mfu": True})
    assert _goal_rows(tmp_path, monkeypatch, "t.json", rec) == [
        "| t.json | speedup_vs_hf_packed | 2.2 | met | – | – |", "| t.json | useful_mfu | 0.5 | met | – | – |"]


def test_the_lora_budget_goals_show_their_own_targets(tmp_path, monkeypatch):
    """tok_per_s_at_budget and offload_and_recompute_bound are judged on tok_per_s, offload_within_host_link on
    offload_gbs_max (the host link the record priced the offload against)."""
    rec = Record(suite="lora-budget", command="python -m bench lora-budget", machine={"device": "cpu"},
                 rows=[{"policy": "full", "tok_per_s_bound": 1.0}],
                 goals={"tok_per_s": 16000, "peak_gib_max": 40.0, "offload_gbs_max": 55.0},
                 goal_met={"tok_per_s_at_budget": False, "offload_within_host_link": True,
                           "offload_and_recompute_bound": True},
                 limits={"tok_per_s_at_budget": {"limit": "recompute alone", "tried": ["every policy"]}})
    assert _goal_rows(tmp_path, monkeypatch, "b.json", rec) == [
        "| b.json | tok_per_s_at_budget | 16000 | **not met** | recompute alone | every policy |",
        "| b.json | offload_within_host_link | 55 | met | – | – |",
        "| b.json | offload_and_recompute_bound | 16000 | met | – | – |"]
