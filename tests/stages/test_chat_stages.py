"""Chat records through the real CLI: malformed records named by file and row (validate exit 4,
tokenize exit 3 for a prompt longer than the pack budget), nothing crashes, no input byte changes; the
synthetic chat set runs ingest → validate → tokenize → pack with the mask in the packs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from packtrain.cli import main
from packtrain.data.synthetic_chat import synthetic_conversations, write_synthetic_chat
from packtrain.packing.batches import IGNORE, PackedLoader
from packtrain.packing.store import PackStore

SMALL = ["--set", "tracking.enabled=false", "--set", "validate.min_rows=4", "--set", "tokenize.vocab_size=300",
         "--set", "tokenize.eval_fraction=0.1", "--set", "pack.budget=256"]


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_malformed_records_named_by_file_and_row(tmp_path, capsys):
    src = tmp_path / "in"
    src.mkdir()
    good = synthetic_conversations(6)
    bad = [
        ("wrong role", {"messages": [{"role": "bot", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
         'messages[0].role is "bot"'),
        ("missing content", {"messages": [{"role": "user"}, {"role": "assistant", "content": "yo"}]},
         "messages[0].content is missing"),
        ("non-list messages", {"messages": "user: hi"}, "messages is a JSON string, expected a list"),
        ("assistant-free", {"messages": [{"role": "user", "content": "anyone?"}]}, "no assistant turn"),
        ("empty content", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]},
         "messages[1].content is empty"),
    ]
    rows = good[:3] + [b[1] for b in bad] + good[3:]
    (src / "chat.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    pq_rows = {"prompt": ["2+2=", "3+3="], "completion": ["4", None]}   # row 1: completion missing
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(pq_rows), src / "pc.parquet")
    before = _bytes(src)
    common = ["--set", f"workdir={tmp_path}", *SMALL]
    assert main(["ingest", "--source", str(src), *common]) == 0
    code = main(["validate", *common])
    err = capsys.readouterr().err
    assert code == 4, err
    for i, (case, _, problem) in enumerate(bad):
        where = f"chat.jsonl:{4 + i}"      # lines 1-3 are good conversations
        assert f"{where} {problem}" in err, (case, err)
    assert "pc.parquet#1 completion is missing" in err, err
    report = json.loads((tmp_path / "validate.failed" / "report.json").read_text())
    named = {r["source"] for res in report["results"] for r in res.get("offending_rows", [])}
    assert {f"chat.jsonl:{4 + i}" for i in range(len(bad))} | {"pc.parquet#1"} <= named
    assert _bytes(src) == before, "an input file changed"


def test_prompt_longer_than_budget_named_at_tokenize(tmp_path, capsys):
    src = tmp_path / "in"
    src.mkdir()
    rows = synthetic_conversations(6)
    long = {"messages": [{"role": "user", "content": "why " * 200}, {"role": "assistant", "content": "because"}]}
    rows.insert(2, long)
    (src / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    before = _bytes(src)
    common = ["--set", f"workdir={tmp_path}", *SMALL, "--set", "tokenize.eval_fraction=0"]
    assert main(["ingest", "--source", str(src), *common]) == 0
    assert main(["validate", *common]) == 0
    code = main(["tokenize", *common, "--set", "pack.budget=128"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "c.jsonl:3 (doc_id 2)" in err and "does not fit the pack budget 128" in err, err
    assert not (tmp_path / "tokenize").exists(), "a failed tokenize published something"
    assert _bytes(src) == before


def test_synthetic_chat_through_the_cli(tmp_path):
    src = write_synthetic_chat(tmp_path / "in" / "chat.jsonl", n=40)
    assert src.read_bytes() == write_synthetic_chat(tmp_path / "again.jsonl", n=40).read_bytes()   # deterministic
    common = ["--set", f"workdir={tmp_path}", *SMALL]
    for stage in (["ingest", "--source", str(src)], ["validate"], ["tokenize"], ["pack"]):
        assert main([*stage, *common]) == 0, stage
    stats = json.loads((tmp_path / "tokenize" / "tokenize_result.json").read_text())
    assert stats["loss_mask"] and stats["chat_template"] == "builtin"
    assert 0 < stats["loss_tokens"] < stats["tokens"] / 2, stats    # prompts and markup are most of the tokens
    store = PackStore.open(tmp_path / "pack" / "train")
    assert store.loss_mask is not None and int(store.loss_mask.sum()) > 0
    batch = next(iter(PackedLoader(tmp_path / "pack" / "train", rows=1, loss_on="assistant")))
    learned = (batch.labels != IGNORE).sum().item()
    all_on = next(iter(PackedLoader(tmp_path / "pack" / "train", rows=1, loss_on="all")))
    assert batch.n_label_tokens == learned < all_on.n_label_tokens
    assert np.array_equal(batch.input_ids.numpy(), all_on.input_ids.numpy())
