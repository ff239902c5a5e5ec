"""An own chat template's refusals and control text typed in content, caught at validate (before tokenize), through
the real CLI: fail names the record and the template's message; ingest.on_bad_record=skip drops and counts them."""

from __future__ import annotations

import json

from packtrain.cli import main
from tests.unit.test_chat_templates import GEMMA, MARKERS

SMALL = ["--set", "tracking.enabled=false", "--set", "validate.min_rows=4", "--set", "tokenize.eval_fraction=0",
         "--set", "pack.budget=256"]


def _gemma_dir(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["abc"], trainer=trainers.BpeTrainer(
        vocab_size=256 + len(MARKERS), special_tokens=MARKERS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, bos_token="<bos>",
                                 eos_token="<eos>")
    hf.chat_template = GEMMA
    hf.save_pretrained(str(tmp_path / "gemma"))
    return tmp_path / "gemma"


def _chat(q: str, a: str, system: str | None = None) -> dict:
    msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return {"messages": ([{"role": "system", "content": system}] if system else []) + msgs}


def test_template_refusal_and_typed_control_text_caught_at_validate(tmp_path, capsys):
    rows = [_chat(f"What is {i}+{i}?", f"{2 * i}.") for i in range(5)]
    rows.insert(2, _chat("Hi?", "Hello.", system="Be terse."))               # line 3: Gemma refuses a system turn
    rows.insert(4, _chat("Echo it", "Sure: <end_of_turn> done."))            # line 5: a typed turn marker
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    common = ["--set", f"workdir={tmp_path}", *SMALL, "--set", f"tokenize.tokenizer_dir={_gemma_dir(tmp_path)}",
              "--set", f"ingest.source={src}"]
    assert main(["ingest", *common]) == 0
    assert main(["validate", *common, "--set", "tokenize.control_text=refuse"]) == 4
    err = capsys.readouterr().err
    assert "template_renders" in err and "c.jsonl:3" in err and "System role not supported" in err, err
    assert 'control_text' in err and 'c.jsonl:5 messages[1].content holds "<end_of_turn>"' in err, err
    # skip drops the refused record at ingest, counted and named — under as_text (the default) the typed marker is
    # plain text, kept — and the rest tokenizes with the own template
    assert main(["ingest", *common, "--set", "ingest.on_bad_record=skip"]) == 0
    stats = json.loads((tmp_path / "ingest" / "ingest_result.json").read_text())
    assert stats["records_skipped"] == 1 and stats["skipped_records"][0]["source"] == "c.jsonl:3"
    assert "System role not supported" in stats["skipped_records"][0]["reason"]
    assert main(["tokenize", *common]) == 0
    out = capsys.readouterr().out
    tok = json.loads((tmp_path / "tokenize" / "tokenize_result.json").read_text())
    assert tok["chat_template"] == "tokenizer" and tok["control_text_records"] == 1 and tok["documents"] == 6
    assert "control strings typed in the content of 1 record(s) encoded as plain text" in out, out
