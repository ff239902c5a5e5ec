"""Records longer than the pack budget through the real CLI (ingest → validate → tokenize → pack), one literal
corpus, the trained tiny BPE: under every tokenize.long_records policy, no learned token is in a pack without its
prompt (or the policy refuses and says so), and what the policy did is counted and said."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from packtrain.cli import main
from packtrain.data.chat import encode_row
from packtrain.data.synthetic_chat import synthetic_conversations
from packtrain.data.tokenizer_setup import _document_ids, load_tokenizer, special_tokens_rule
from packtrain.packing.store import PackStore

BUDGET = 256
SMALL = ["--set", "tracking.enabled=false", "--set", "validate.min_rows=4", "--set", "tokenize.vocab_size=300",
         "--set", "tokenize.eval_fraction=0.2", "--set", f"pack.budget={BUDGET}"]
LONG = " ".join(f"step {i} adds one." for i in range(90))   # ~400 tokens of answer
ROWS = [
    *synthetic_conversations(8),
    {"messages": [{"role": "system", "content": "Explain slowly."}, {"role": "user", "content": "Count to 90?"},
                  {"role": "assistant", "content": LONG}]},                                    # line 9
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                  {"role": "user", "content": "And now count?"}, {"role": "assistant", "content": LONG}]},   # line 10
]


def _corpus(tmp_path: Path) -> list[str]:
    src = tmp_path / "in" / "c.jsonl"
    src.parent.mkdir()
    src.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n", encoding="utf-8")
    return ["--set", f"workdir={tmp_path}", *SMALL, "--set", f"ingest.source={src}"]


def _records(tmp_path: Path) -> dict[int, tuple[list[int], list[int]]]:
    """doc_id → (ids, mask) of the whole record, rendered by tokenize's own code with the store's tokenizer."""
    hf = load_tokenizer(tmp_path / "tokenize" / "tokenizer")
    prefix, suffix = special_tokens_rule(hf)
    wrap = _document_ids(prefix, suffix, hf.eos_token_id, True)
    t = pq.read_table(tmp_path / "ingest" / "documents.parquet").to_pydict()
    return {d: encode_row(hf, f, r, x, wrap, prefix, False)
            for d, f, r, x in zip(t["doc_id"], t["format"], t["record"], t["text"], strict=True)}


def _prompt(mask: list[int]) -> int:
    return next(i for i, m in enumerate(mask) if m)


def test_long_answers_split_with_their_prompt_in_every_pack(tmp_path, capsys):
    common = _corpus(tmp_path)
    for stage in ("ingest", "validate", "tokenize", "pack"):
        tracked = ["--set", "tracking.enabled=true", "--set", "tracking.system_metrics=false"] * (stage == "tokenize")
        assert main([stage, *common, *tracked]) == 0, (stage, capsys.readouterr().err)
    out = capsys.readouterr().out
    stats = json.loads((tmp_path / "tokenize" / "tokenize_result.json").read_text())
    records = _records(tmp_path)
    long_ids = {d for d, (ids, _) in records.items() if len(ids) > BUDGET}
    assert long_ids == {8, 9}, {d: len(i) for d, (i, _) in records.items()}
    assert stats["long_records"] == "split_with_prompt" and stats["records_over_budget"] == 2
    assert stats["records_split"] == 2 and stats["split_chunks"] > 4 and stats["split_context_tokens"] > 0
    assert "2 record(s) longer than pack.budget 256 split with their prompt" in out, out
    assert f"tokenize: {len(ROWS)} rows → {stats['documents']} documents" in out, out
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.search_runs([e.experiment_id for e in client.search_experiments()],
                             filter_string="attributes.run_name = 'tokenize'")[0]
    assert run.data.metrics["records_split"] == 2 and run.data.metrics["split_chunks"] == stats["split_chunks"]
    assert run.data.params["tokenize.long_records"] == "split_with_prompt"
    assert (f"appended to 0 text row(s) and {stats['record_rows']} of {stats['record_rows']} record(s)") in out, out
    learned_seen: dict[int, int] = {}
    n_segments = 0
    for split in ("train", "eval"):
        store = PackStore.open(tmp_path / "pack" / split)
        for p in range(store.n_packs):
            tk, mk, off = store.pack_tokens(p), store.pack_mask(p), 0
            for doc, start, n in store.pack_segments(p):
                seg, m = tk[off:off + n].tolist(), mk[off:off + n].tolist()
                off += n
                n_segments += 1
                assert start == 0, "a record was cut by pack: its continuation would have no prompt"
                ids, mask = records[int(doc)]
                head = _prompt(mask)
                if any(m):   # every learned token's document starts with its record's prompt, not learned
                    assert seg[:head] == ids[:head] and not any(m[:head]), (doc, seg[:head], ids[:head])
                learned_seen[int(doc)] = learned_seen.get(int(doc), 0) + sum(m)
    assert n_segments == stats["documents"]
    # no answer token lost: each record's learned tokens are all in the packs, once
    assert learned_seen == {d: sum(mask) for d, (_, mask) in records.items()}


def test_truncate_and_refuse_are_applied_counted_and_said(tmp_path, capsys):
    common = _corpus(tmp_path)
    assert main(["ingest", *common]) == 0
    assert main(["tokenize", *common, "--set", "tokenize.long_records=truncate"]) == 0
    out = capsys.readouterr().out
    stats = json.loads((tmp_path / "tokenize" / "tokenize_result.json").read_text())
    records = _records(tmp_path)
    cut = sum(len(ids) - BUDGET for ids, _ in records.values() if len(ids) > BUDGET)
    assert (stats["records_truncated"], stats["record_truncated_tokens"]) == (2, cut)
    assert f"2 record(s) longer than pack.budget 256 truncated to it (tokenize.long_records=truncate): {cut:,}" in out
    assert stats["documents"] == len(ROWS) and stats["length_tokens"]["max"] == BUDGET

    refuse = [*common, "--set", "tokenize.long_records=refuse"]
    assert main(["validate", *refuse]) == 4
    err = capsys.readouterr().err
    assert "record_fits_budget" in err and "c.jsonl:9 record of at least" in err and "c.jsonl:10" in err, err
    before = (tmp_path / "tokenize" / "tokenize_result.json").read_bytes()
    assert main(["tokenize", *refuse]) == 3
    err = capsys.readouterr().err
    assert "c.jsonl:9 (doc_id 8): record of" in err and "c.jsonl:10 (doc_id 9)" in err, err
    assert (tmp_path / "tokenize" / "tokenize_result.json").read_bytes() == before   # the earlier output stays
    # skip drops them at ingest, counted, and the rest tokenizes
    assert main(["ingest", *refuse, "--set", "ingest.on_bad_record=skip"]) == 0
    ingest = json.loads((tmp_path / "ingest" / "ingest_result.json").read_text())
    assert ingest["records_skipped"] == 2
    assert {r["source"] for r in ingest["skipped_records"]} == {"c.jsonl:9", "c.jsonl:10"}
    assert main(["tokenize", *refuse]) == 0
    assert json.loads((tmp_path / "tokenize" / "tokenize_result.json").read_text())["documents"] == len(ROWS) - 2
