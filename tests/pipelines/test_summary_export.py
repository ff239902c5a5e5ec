"""The end-of-run summary and the DVC metrics/plots export, on literal stats."""

from __future__ import annotations

import csv
import json
import typing

import pytest
from pipeline_helpers import run_cli

from packtrain.errors import MissingDataError
from packtrain.pipeline.dvc_export import export_stage, numeric_tree
from packtrain.pipeline.summary import FIELDS, LINES, build_summary, format_summary, mlflow_ui_command, pick

STAGES = {
    "pack": {"budget": 512, "fill": 0.9972, "train": {"fill": 0.9972}, "eval": {"fill": 0.99}},
    "train": {"throughput": {"real_tokens_per_s": 12340.0, "useful_mfu": 0.004},
              "memory": {"peak_alloc_gib": 0.0, "cpu_peak_rss_gib": 1.21},
              "system": {"kind": "cpu", "utilization_mean": 0.87}},
    "evaluate": {"eval_loss": 4.06, "perplexity": 58.0, "tokens_per_s": 900.0},
    "register": {"model_name": "packtrain-lm", "version": "3", "decision": "champion", "cache": "hit"},
}


@pytest.mark.parametrize("stats, key, expected", [
    ({"fill": 1.0}, "fill", 1.0),
    ({"train": {"fill": 0.5}}, "train.fill", 0.5),
    ({"train": {"fill": 0.5}}, "fill", None),                  # no suffix guessing: the declared key or nothing
    ({"tokens_per_sec": 3}, "tokens_per_s", None),             # nor aliases
    ({"y": 1}, "y.z", None),
])
def test_pick_reads_the_declared_key_only(stats, key, expected):
    assert pick(stats, key) == expected


def test_summary_fields_are_keys_the_typed_results_declare():
    """Every summary number names a field of its stage's result class (packtrain.stages.results): the class
    its runner declares it returns (`TrainResult | None`: None on ranks other than 0)."""
    from packtrain.pipeline.runtime import RUNNERS

    for field, (stage, key) in FIELDS.items():
        returns = typing.get_type_hints(RUNNERS[stage])["return"]
        result = next(t for t in typing.get_args(returns) or (returns,) if t is not type(None))
        declared = set(result.record_keys())
        assert key.split(".")[0] in declared, f"summary {field}: {stage} result declares no {key.split('.')[0]!r}"


def test_summary_lines_follow_the_stage_table():
    from packtrain.stages.table import STAGE_NAMES

    assert [s for s in STAGE_NAMES if s in LINES] == list(LINES)


def test_summary_reads_every_field():
    s = build_summary(STAGES)
    assert (s["fill"], s["tokens_per_s"], s["mfu"], s["perplexity"]) == (0.9972, 12340.0, 0.004, 58.0)
    assert (s["utilization"], s["utilization_kind"], s["peak_cpu_gib"]) == (0.87, "cpu", 1.21)
    assert (s["model_name"], s["version"], s["alias"], s["cached"]) == ("packtrain-lm", "3", "champion", ["register"])
    text = format_summary("tiny-cpu", s, 95.25, 7, "sqlite:////abs/mlflow.db")
    assert text.splitlines() == [
        "packtrain run — tiny-cpu — 7 stages in 95.2 s (1 from cache: register)",
        "  pack       fill 99.72% (padding 0.28%)",
        "  train      12,340 tok/s · CPU util 87% · MFU 0.40% · peak RSS 1.21 GiB",
        "  evaluate   perplexity 58.00 (loss 4.060)",
        "  register   packtrain-lm v3 → champion",
        f"  MLflow     {mlflow_ui_command('sqlite:////abs/mlflow.db')}",
    ]
    assert mlflow_ui_command("sqlite:////abs/mlflow.db").endswith("mlflow ui --backend-store-uri sqlite:////abs/mlflow.db")


def test_numeric_tree():
    assert numeric_tree({"a": 1, "b": "x", "c": {"d": True, "e": None}, "f": [1]}) == {"a": 1, "c": {"d": 1}}


def test_export_train_writes_metrics_and_plot(tmp_path):
    d = tmp_path / "train"
    d.mkdir()
    (d / "train_result.json").write_text(json.dumps({"steps": 2, "final_loss": 5.5, "setup": {"device": "cpu"}}))
    rows = [{"step": 1, "loss": 6.0, "lr": 0.1, "grad_norm": 1.0, "step_time_s": 0.5, "real_tokens": 64, "x": 0},
            {"step": 2, "loss": 5.5, "lr": 0.2, "grad_norm": 0.9, "step_time_s": 0.4, "real_tokens": 64, "x": 0}]
    (d / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    written = export_stage("train", d, tmp_path / "metrics", tmp_path / "plots")
    assert [p.name for p in written] == ["train.json", "train_steps.csv"]
    assert json.loads(written[0].read_text()) == {"loss": 5.5}   # a few numbers (StageSpec.metrics)
    with open(written[1]) as f:
        got = list(csv.DictReader(f))
    assert [(r["step"], r["loss"]) for r in got] == [("1", "6.0"), ("2", "5.5")] and "x" not in got[0]


def test_export_missing_stats_is_a_clear_error(tmp_path):
    with pytest.raises(MissingDataError, match="pack_result.json does not exist"):
        export_stage("pack", tmp_path, tmp_path / "m")
    r = run_cli(["pipeline", "export", "pack", "--dir", str(tmp_path)], cwd=tmp_path)
    assert r.returncode == 5 and "pack_result.json does not exist" in r.stderr
    assert not (tmp_path / "metrics").exists()


def test_a_cached_register_line_reads_the_registry_as_it_is_now(tmp_path):
    """A run whose register stage is restored from the cache does not repeat the decision it recorded (another
    run may have moved the alias since): its line says the version came from an earlier run and reads the aliases
    from the registry now."""
    from mlflow import MlflowClient

    from packtrain.pipeline.summary import build_summary, format_summary, registry_now

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("lm")
    for _ in range(2):
        client.create_model_version("lm", source=str(tmp_path))
    client.set_registered_model_alias("lm", "champion", "2")
    stages = {"register": {"model_name": "lm", "version": "1", "decision": "champion", "cache": "hit",
                           "reason": "first champion"}}
    summary = build_summary(stages)
    summary["registry_now"] = registry_now(uri, "lm", "1")
    text = format_summary("tiny", summary, 1.0, 1, None)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("  register")]
    assert line == ("  register   lm v1 (registered by an earlier run, restored from cache) · registry now: "
                    "champion v2 (v1 holds no alias)")
    assert "→ champion" not in text
    assert registry_now(f"sqlite:///{tmp_path / 'missing' / 'x.db'}", "lm", "1").startswith("unreadable")
    fresh = build_summary({"register": {"model_name": "lm", "version": "3", "decision": "challenger",
                                        "reason": "recent (primary) not improved: Δ +0.01"}})
    assert format_summary("tiny", fresh, 1.0, 1, None).splitlines()[1:3] == [
        "  register   lm v3 → challenger", "             recent (primary) not improved: Δ +0.01"]


def test_the_footer_of_a_run_whose_store_went_down_comes_at_once(tmp_path, monkeypatch):
    """The store answered when the run started and is gone by its summary (a server stopped mid-run): the footer's
    look-up of the run fails at once and the hint comes without the run's address. With MLflow's default retries
    (7, exponential backoff) a `packtrain run` sat ~4 min here after its last stage had finished."""
    import socket
    import time

    from packtrain.config import load_run_config
    from packtrain.pipeline.local import _footer
    from packtrain.tracking.run_lifecycle import _close_clients

    with socket.socket() as s:   # a port nothing listens on: every request is refused
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = load_run_config("tiny-cpu", [f"workdir={tmp_path}", f"tracking.tracking_uri={uri}"])
    t0 = time.perf_counter()
    try:
        lines = _footer(cfg, uri, "9f" * 16, {"register": {"model_name": "lm", "decision": "deferred"}})
    finally:
        _close_clients()
    assert time.perf_counter() - t0 < 20
    assert lines[0] == f"  MLflow     open {uri}"
