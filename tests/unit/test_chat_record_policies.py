"""Record policies: split_with_prompt as a property (every chunk ≤ budget, every learned token once, each chunk with
learned tokens opens with the record's prompt or its turn's question), control strings typed in content never
become control ids in the learned span (built-in and own template), and an own template's refusal is caught by
validate, where ingest.on_bad_record=skip can drop it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtrain.data.chat import encode_row
from packtrain.data.long_records import fit_record, learned_runs
from packtrain.data.tokenizer_setup import _document_ids, special_tokens_rule


@settings(max_examples=200, deadline=None)
@given(turns=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 40)), min_size=1, max_size=4),
       head=st.integers(1, 10), budget=st.integers(8, 48))
def test_split_with_prompt_keeps_every_learned_token_with_its_question(turns, head, budget):
    ids, mask = list(range(1000, 1000 + head)), [0] * head        # the record's prompt
    for k, (q, a) in enumerate(turns):
        if k:                                                     # a later turn's question
            ids += [2000 + len(ids) + j for j in range(q)]
            mask += [0] * q
        ids += [3000 + len(ids) + j for j in range(a)]
        mask += [1] * a
    fit = fit_record(ids, mask, budget, "split_with_prompt")
    runs = learned_runs(mask)
    questions = [ids[:runs[0][0]]] + [ids[runs[k - 1][1]:runs[k][0]] for k in range(1, len(runs))]
    if fit.problem:   # only when the prompt, or a later turn's question alone, leaves no room for 2 tokens
        assert "leaves no room" in fit.problem
        assert head + 2 > budget or any(len(q) + 2 > budget for q in questions[1:]), fit.problem
        return
    learned = [t for t, m in zip(ids, mask, strict=True) if m]
    got = []
    for d_ids, d_mask in fit.docs:
        assert len(d_ids) == len(d_mask) <= budget
        got += [t for t, m in zip(d_ids, d_mask, strict=True) if m]
        if any(d_mask):   # the first learned token's question (or the record's prompt) is in the chunk, masked
            t = d_ids[d_mask.index(1)]
            k = next(k for k, (s, e) in enumerate(runs) if ids.index(t) < e)
            q = questions[k]
            where = [i for i in range(len(d_ids) - len(q) + 1) if d_ids[i:i + len(q)] == q]
            assert where and not any(d_mask[where[0]:where[0] + len(q)]), (d_ids, d_mask, q)
    assert got == learned     # every answer token learned exactly once, in order


def _wrap(hf):
    prefix, suffix = special_tokens_rule(hf)
    return _document_ids(prefix, suffix, hf.eos_token_id, True), prefix


def test_control_text_in_content_is_never_a_control_id(marker_tokenizer_chatml, char_tok):
    typed = "say <|im_end|> then <|endoftext|> ok"
    record = [{"role": "user", "content": f"Q {typed}"}, {"role": "assistant", "content": f"A {typed}"}]
    for hf, own in ((marker_tokenizer_chatml, True), (char_tok, False)):
        wrap, prefix = _wrap(hf)
        ids, mask = encode_row(hf, "messages", json.dumps(record), "", wrap, prefix, own)
        specials = {hf.convert_tokens_to_ids(t) for t in hf.all_special_tokens}
        learned = [i for i, m in zip(ids, mask, strict=True) if m]
        content_ids = learned[:-2] if own else learned[:-1]   # the end-of-turn marker (and EOS) are the template's
        assert not specials & set(content_ids), (own, [hf.decode([i]) for i in learned])
        assert hf.decode(content_ids).endswith(f"A {typed}" + ("" if own else "<|im_end|>")), hf.decode(content_ids)
        assert [i for i in ids if i in specials] == [i for i in encode_row(
            hf, "messages", json.dumps([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]),
            "", wrap, prefix, own)[0] if i in specials]       # exactly the template's control ids, no more
        # the old behaviour, as_text off: the typed string becomes the control id
        ids_raw, _ = encode_row(hf, "messages", json.dumps(record), "", wrap, prefix, own, as_text=False)
        assert len([i for i in ids_raw if i in specials]) > len([i for i in ids if i in specials])


@pytest.fixture(scope="module")
def char_tok(tmp_path_factory):
    from packtrain.data.tokenizer_setup import train_tokenizer

    return train_tokenizer(["abc"], 258, tmp_path_factory.mktemp("chartok"))


@pytest.fixture(scope="module")
def marker_tokenizer_chatml():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tests.unit.test_chat_templates import CHATML

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    markers = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(["abc"], trainer=trainers.BpeTrainer(
        vocab_size=256 + len(markers), special_tokens=markers,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, eos_token="<|endoftext|>")
    hf.chat_template = CHATML
    return hf


def test_run_summary_names_long_records_and_the_policy():
    from packtrain.pipeline.summary import _data

    line = _data({"documents": 10, "tokens": 900, "records_over_budget": 2, "long_records": "split_with_prompt"})[0]
    assert line.endswith("· 2 long record(s): split_with_prompt"), line
    assert "long record" not in _data({"documents": 10, "tokens": 900, "records_over_budget": 0})[0]
