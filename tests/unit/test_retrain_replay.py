"""Scheduled retraining keeps the trained data version's held-out documents as the next run's replay suite."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packtrain.config import load_run_config
from packtrain.data.token_store import SPLIT_EVAL
from packtrain.data.tokenize import split_eval
from packtrain.pipeline.retrain import REPLAY_FILE, scheduled, validate_dir, write_replay


def test_replay_suite_from_the_previous_version(tmp_path):
    cfg = load_run_config("retrain-cpu", [f"workdir={tmp_path / 'wd'}", "tokenize.eval_fraction=0.2"])
    assert [s.name for s in scheduled(cfg).evaluate.suites] == ["wordorder"]   # first run: nothing earlier
    docs = validate_dir(cfg, "abc.dir") / "ingest" / "documents.parquet"
    docs.parent.mkdir(parents=True)
    texts = [f"document {i} " * 5 for i in range(50)]
    pq.write_table(pa.table({"doc_id": np.arange(50), "text": texts}), docs)
    out = write_replay(cfg, docs)
    assert out == tmp_path / "wd" / REPLAY_FILE
    held = split_eval(np.arange(50), 0.2) == SPLIT_EVAL
    assert [json.loads(x)["text"] for x in out.read_text().splitlines()] == [t for t, h in zip(texts, held, strict=True) if h]
    s = scheduled(cfg)
    replay = [x for x in s.evaluate.suites if x.name == "replay"]
    assert len(replay) == 1 and replay[0].role == "regression" and replay[0].path == str(out.resolve())
    assert s.register_.gate is True
    own = load_run_config("retrain-cpu", [f"workdir={tmp_path / 'wd'}",
                                          "evaluate.suites=[{name: replay, role: primary, path: x.jsonl}]"])
    assert [(x.name, x.role) for x in scheduled(own).evaluate.suites] == [("replay", "primary")]
