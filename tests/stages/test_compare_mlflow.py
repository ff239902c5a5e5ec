"""`packtrain compare` on a real sqlite MLflow store: table of differing params + key metrics, a
self-contained HTML report whose embedded images are real, non-blank PNG plots, logged to a "compare" run."""

from __future__ import annotations

import base64
import io
import json
import re

import pytest

from packtrain.cli import main


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("compare")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    c = MlflowClient(uri)
    exp = c.create_experiment("bench", artifact_location=str(root / "artifacts"))
    ids = []
    for i, (precision, ckpt) in enumerate([("bf16", "none"), ("bf16", "full"), ("fp32", "none")]):
        run = c.create_run(exp, run_name="train")
        rid = run.info.run_id
        metrics = []
        for step in range(12):
            t = 1_700_000_000_000 + step
            metrics += [Metric("train.loss", 8.0 / (1 + 0.3 * step) + 0.1 * i, t, step),
                        Metric("train.tokens_per_s", 70_000 + 5_000 * i + 300 * (step % 3), t, step),
                        Metric("train.gpu_utilization", 0.9 + 0.02 * i, t, step),
                        Metric("train.peak_alloc_gib", 30.0 - 8 * (ckpt == "full") + step * 0.01, t, step)]
        metrics += [Metric("pack.fill", 0.995, 1_700_000_000_100, 0), Metric("train.useful_mfu", 0.4 + 0.01 * i,
                                                                              1_700_000_000_100, 0)]
        params = [Param("train.precision", precision), Param("train.activation_checkpointing", ckpt),
                  Param("pack.budget", "2048"), Param("train.rows", "8")]
        c.log_batch(rid, metrics=metrics, params=params)
        c.set_terminated(rid)
        ids.append(rid)
    other = c.create_run(exp, run_name="evaluate")
    c.log_batch(other.info.run_id, metrics=[Metric("eval_loss", 3.0, 1_700_000_000_000, 0)])
    c.set_terminated(other.info.run_id)
    return {"uri": uri, "ids": ids, "client": c}


def _png_ok(data: bytes) -> bool:
    """A decodable PNG with real content: many distinct colours, not a blank canvas."""
    import matplotlib.image as mpimg
    import numpy as np

    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000
    img = mpimg.imread(io.BytesIO(data), format="png")
    assert img.shape[0] > 100 and img.shape[1] > 100
    return len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 20


def test_compare_runs_table_report_and_artifact(store, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", *store["ids"], "--set", f"tracking.tracking_uri={store['uri']}", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    # params that differ are listed, equal ones are not
    assert "param train.precision" in text and "param train.activation_checkpointing" in text
    assert "param pack.budget" not in text and "2 params differ, 2 equal" in text
    for metric in ("train.loss", "train.tokens_per_s", "train.useful_mfu", "train.peak_alloc_gib", "pack.fill"):
        assert metric in text

    html = (out / "compare.html").read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    assert len(images) == 5        # loss, tokens/s, utilization, memory curves + the bar chart
    assert all(_png_ok(base64.b64decode(b)) for b in images)
    assert "<table>" in html and "train.precision" in html and "src='http" not in html
    saved = json.loads((out / "compare.json").read_text())
    assert saved["params_differ"]["train.precision"] == ["bf16", "bf16", "fp32"]

    c = store["client"]
    m = re.search(r"logged to MLflow run (\w+)", text)
    run = c.get_run(m.group(1))
    assert run.info.run_name == "compare" and run.data.tags["packtrain.compare.runs"] == ",".join(store["ids"])
    assert {a.path for a in c.list_artifacts(run.info.run_id, "compare")} == \
        {"compare/compare.html", "compare/compare.json", "compare/compare.md"}
    # the compared runs are untouched
    assert all(not c.list_artifacts(rid) for rid in store["ids"])


def test_compare_experiment_with_filter(store, tmp_path, capsys):
    argv = ["compare", "--experiment", "bench", "--filter", "attributes.run_name = 'train'", "--no-log",
            "--set", f"tracking.tracking_uri={store['uri']}", "--out", str(tmp_path)]
    assert main(argv) == 0
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert sorted(r["run_id"] for r in saved["runs"]) == sorted(store["ids"])
    assert "eval_loss" not in saved["metrics"]


@pytest.mark.parametrize("extra,code,needle", [
    (["--experiment", "nope"], 2, "no such experiment"),
    (["--experiment", "bench", "--filter", "this is not a filter"], 2, "--filter"),
    (["--experiment", "bench", "--filter", "attributes.run_name = 'nothing'"], 2, "no runs match"),
    (["0123456789abcdef0123456789abcdef"], 2, "not found"),
    ([], 2, "give run ids or --experiment"),
])
def test_compare_bad_input(store, tmp_path, capsys, extra, code, needle):
    argv = ["compare", *extra, "--no-log", "--set", f"tracking.tracking_uri={store['uri']}", "--out", str(tmp_path)]
    assert main(argv) == code
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "compare.html").exists()
