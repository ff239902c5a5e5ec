"""Chat records → tokens + loss mask → packs → labels, with the mask visibly right.

A character-level tokenizer (a byte-level BPE with no merges: one token per character) makes the tables
literal: every row of the printed table is one character, its mask and its label.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtrain.config import IngestConfig, TokenizeConfig, ValidateConfig
from packtrain.config.packing import PackConfig
from packtrain.data.chat import CHECKS, record_checks, render_builtin
from packtrain.data.ingest import ingest_documents
from packtrain.data.token_store import TokenStore, write_token_store
from packtrain.data.tokenize import tokenize_documents
from packtrain.data.tokenizer_setup import train_tokenizer
from packtrain.packing.batches import IGNORE, PackedLoader
from packtrain.packing.dataset import pack_dataset
from packtrain.packing.store import PackStore


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory) -> Path:
    """Byte-level BPE with vocab 258 = 256 bytes + <|endoftext|> + <|pad|>: no merges, 1 token per ASCII char."""
    d = tmp_path_factory.mktemp("chartok")
    train_tokenizer(["abc"], 258, d)
    return d


def _chat_corpus(tmp_path: Path) -> Path:
    src = tmp_path / "src" / "chat.jsonl"
    src.parent.mkdir(parents=True)
    rows = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]},
            {"prompt": "1+1=", "completion": "2"}]
    # two files: one chat, one prompt/completion (the format is detected per file)
    src.write_text(json.dumps(rows[0]) + "\n", encoding="utf-8")
    (src.parent / "pc.jsonl").write_text(json.dumps(rows[1]) + "\n", encoding="utf-8")
    (src.parent / "plain.txt").write_text("ok", encoding="utf-8")
    return src.parent


def _table(tokens: list[str], mask: list[int], labels: list[int]) -> str:
    lines = ["slot  token         mask  label"]
    for i, (t, m, lab) in enumerate(zip(tokens, mask, labels, strict=True)):
        lines.append(f"{i:4d}  {t!r:12s}  {m:4d}  {'-100' if lab == IGNORE else repr(tokens[i])}")
    return "\n".join(lines)


def test_chat_round_trip_table(tmp_path, char_tokenizer):
    """ingest → tokenize → pack → PackedLoader(loss_on="assistant"): only the assistant's reply, its
    end-of-turn marker and the final EOS are learned; the prompt's tokens and the template are not."""
    src = _chat_corpus(tmp_path)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    stats = ingest_documents(src, tmp_path / "ingest", IngestConfig())
    assert stats.records_by_format == {"messages": 1, "prompt_completion": 1, "text": 1}
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before, "input changed"
    tok = tokenize_documents(tmp_path / "ingest", tmp_path / "tok",
                             TokenizeConfig(tokenizer_dir=str(char_tokenizer), eval_fraction=0.0),
                             prompt_budget=128)
    assert tok.loss_mask and tok.chat_template == "builtin"
    pack_dataset(tmp_path / "tok", tmp_path / "pack", PackConfig(budget=128, strategy="sequential"))
    loader = PackedLoader(tmp_path / "pack" / "train", rows=1, loss_on="assistant", shuffle=False, epochs=1,
                          drop_last=False)
    (batch,) = list(loader)
    store = PackStore.open(tmp_path / "pack" / "train")
    n = int(store.pack_lengths()[0])
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tmp_path / "tok" / "tokenizer"))
    ids = batch.input_ids[0, :n].tolist()
    tokens = [hf.decode([i]) for i in ids]
    mask = store.pack_mask(0).tolist()
    labels = batch.labels[0, :n].tolist()
    table = _table(tokens, mask, labels)
    # documents in file order: chat.jsonl, pc.jsonl, plain.txt (sequential packing keeps it)
    chat_prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    chat = chat_prompt + "Yo<|im_end|>\n"
    want_tokens = list(chat) + ["<|endoftext|>"] + list("1+1=2") + ["<|endoftext|>"] + list("ok") + ["<|endoftext|>"]
    want_mask = ([0] * len(chat_prompt) + [1] * len("Yo<|im_end|>") + [0] + [1]    # chat: reply, end-of-turn, EOS
                 + [0, 0, 0, 0, 1, 1]                                               # "1+1=" | "2" EOS
                 + [1, 1, 1])                                                       # plain text: all learned
    assert tokens == want_tokens, table
    assert mask == want_mask, table
    starts = {0, len(chat) + 1, len(chat) + 1 + 6}                                 # each document's first token
    want_labels = [IGNORE if (i in starts or not m) else ids[i] for i, m in enumerate(want_mask)]
    assert labels == want_labels, table
    learned = "".join(t for t, lab in zip(tokens, labels, strict=True) if lab != IGNORE)
    assert learned == "Yo<|im_end|><|endoftext|>2<|endoftext|>k<|endoftext|>", table
    assert batch.n_label_tokens == 17 == len("Yo<|im_end|>") + 1 + 2 + 2, table   # reply+EOS, "2"+EOS, "k"+EOS
    # loss_on="all" ignores the mask: only document starts and padding are -100
    (full,) = list(PackedLoader(tmp_path / "pack" / "train", rows=1, shuffle=False, epochs=1, drop_last=False))
    assert full.n_label_tokens == n - 3, _table(tokens, mask, full.labels[0, :n].tolist())


def test_builtin_template_literal():
    """The built-in template, piece by piece, with a fake 1-char encoder: the mask covers the reply and
    <|im_end|>, never the newline after it or any system/user text."""
    r = render_builtin([{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                        {"role": "assistant", "content": "A"}], lambda s: [ord(c) for c in s])
    text = "".join(map(chr, r.ids))
    assert text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                    "<|im_start|>assistant\nA<|im_end|>\n")
    learned = "".join(chr(i) for i, m in zip(r.ids, r.mask, strict=True) if m)
    assert learned == "A<|im_end|>"


def test_own_chat_template_prefix_diff(tmp_path, char_tokenizer):
    """A tokenizer with its own chat_template (no {% generation %}): assistant spans found by prefix renders."""
    from transformers import AutoTokenizer

    from packtrain.data.chat import render_record

    hf = AutoTokenizer.from_pretrained(str(char_tokenizer))
    hf.chat_template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}</s>{% endfor %}"
                        "{% if add_generation_prompt %}[assistant]{% endif %}")
    msgs = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}]
    r = render_record("messages", msgs, hf, use_own_template=True)
    text = "".join(hf.decode([i]) for i in r.ids)
    assert text == "[user]Q1</s>[assistant]A1</s>[user]Q2</s>[assistant]A2</s>"
    learned = "".join(hf.decode([i]) for i, m in zip(r.ids, r.mask, strict=True) if m)
    assert learned == "A1</s>A2</s>", list(zip(text, r.mask, strict=True))


def test_own_chat_template_with_generation_tags(char_tokenizer):
    """A template that marks assistant text with {% generation %}: transformers' assistant mask is used."""
    from transformers import AutoTokenizer

    from packtrain.data.chat import render_record

    hf = AutoTokenizer.from_pretrained(str(char_tokenizer))
    hf.chat_template = ("{% for m in messages %}[{{ m['role'] }}]{% if m['role'] == 'assistant' %}{% generation %}"
                        "{{ m['content'] }}</s>{% endgeneration %}{% else %}{{ m['content'] }}</s>{% endif %}"
                        "{% endfor %}")
    r = render_record("messages", [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}], hf,
                      use_own_template=True)
    assert "".join(hf.decode([i]) for i in r.ids) == "[user]Q</s>[assistant]A</s>"
    assert "".join(hf.decode([i]) for i, m in zip(r.ids, r.mask, strict=True) if m) == "A</s>"


def test_tokenize_uses_the_tokenizers_own_template(tmp_path, char_tokenizer):
    """tokenize.chat_template=auto with a tokenizer that ships a chat_template: rendered by it (no extra BOS),
    the mask on the reply + its end marker + EOS; =builtin overrides it."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(char_tokenizer))
    hf.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}</s>{% endfor %}" \
                       "{% if add_generation_prompt %}[assistant]{% endif %}"
    hf.save_pretrained(str(tmp_path / "own"))
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "Q"},
                                            {"role": "assistant", "content": "A"}]}) + "\n", encoding="utf-8")
    ingest_documents(src, tmp_path / "ing", IngestConfig())
    for mode, text, learned in (("auto", "[user]Q</s>[assistant]A</s><|endoftext|>", "A</s><|endoftext|>"),
                                ("builtin", "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
                                 "<|endoftext|>", "A<|im_end|><|endoftext|>")):
        stats = tokenize_documents(tmp_path / "ing", tmp_path / mode, TokenizeConfig(
            tokenizer_dir=str(tmp_path / "own"), eval_fraction=0.0, chat_template=mode))
        assert stats.chat_template == ("tokenizer" if mode == "auto" else "builtin")
        ts = TokenStore.open(tmp_path / mode)
        toks = [hf.decode([int(i)]) for i in ts.doc(0)]
        assert "".join(toks) == text
        assert "".join(t for t, m in zip(toks, ts.doc_mask(0), strict=True) if m) == learned


def test_pack_refuses_a_prompt_longer_than_the_budget(tmp_path):
    """Split, the answer would land in a pack without its question: refused, naming the doc_id."""
    from packtrain.errors import InputDataError

    write_token_store(tmp_path / "tok", [np.arange(2, 14, dtype=np.uint32), np.arange(2, 6, dtype=np.uint32)],
                      np.array([41, 42]), np.zeros(2, np.uint8), {"vocab_size": 32, "eos_id": 0, "pad_id": 1},
                      masks=[np.array([0] * 10 + [1, 1], np.uint8), np.array([0, 1, 1, 1], np.uint8)])
    with pytest.raises(InputDataError, match=r"does not fit pack.budget 8: doc_ids \[41\]"):
        pack_dataset(tmp_path / "tok", tmp_path / "pack", PackConfig(budget=8))
    stats = pack_dataset(tmp_path / "tok", tmp_path / "pack", PackConfig(budget=16))
    assert stats.train.loss_tokens == 5 and stats.train.n_tokens == 16


def test_record_checks_name_each_problem():
    assert record_checks("messages", [{"role": "bot", "content": "x"}, {"role": "assistant", "content": "y"}]) == {
        "record_shape": None, "roles_allowed": 'messages[0].role is "bot", allowed: system, user, assistant, tool',
        "has_assistant_turn": None, "content_not_empty": None}
    assert record_checks("messages", {"role": "user"})["record_shape"] == \
        "messages is an object, expected a list of {role, content}"
    assert record_checks("messages", [{"role": "user", "content": "q"}])["has_assistant_turn"]
    assert record_checks("messages", [{"role": "assistant"}])["record_shape"] == "messages[0].content is missing"
    assert record_checks("prompt_completion", {"prompt": "p", "completion": " "})["content_not_empty"]


# ---- property: the mask stays aligned through every strategy, overlong mode and batch layout --------------

docs_st = st.lists(st.integers(1, 40), min_size=1, max_size=25)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=docs_st, budget=st.integers(4, 24), strategy=st.sampled_from(["bfd", "mbs", "ffd", "sequential"]),
       overlong=st.sampled_from(["split", "truncate"]), rows=st.integers(1, 3), seed=st.integers(0, 3))
def test_mask_aligned_through_every_strategy_and_layout(tmp_path_factory, lengths, budget, strategy, overlong,
                                                        rows, seed):
    rng = np.random.default_rng(seed)
    tmp = tmp_path_factory.mktemp("prop")
    toks = [rng.integers(2, 500, n).astype(np.uint32) for n in lengths]
    masks = [(rng.random(n) < 0.5).astype(np.uint8) for n in lengths]
    masks = [np.concatenate([[0], m[1:]]) if i % 3 == 0 else m for i, m in enumerate(masks)]
    # longer than the budget: an all-learned text row (split / truncated by pack.overlong); a record longer than
    # the budget (masked tokens) is refused by pack: tokenize fits records to the budget (tokenize.long_records)
    masks = [np.ones(n, np.uint8) if n > budget and i % 4 else m for i, (n, m) in enumerate(zip(lengths, masks, strict=True))]
    doc_ids = np.arange(len(lengths), dtype=np.int64) * 7 + 3
    write_token_store(tmp / "tok", toks, doc_ids, np.zeros(len(lengths), np.uint8),
                      {"vocab_size": 512, "eos_id": 0, "pad_id": 1}, masks=masks)
    try:
        pack_dataset(tmp / "tok", tmp / "pack", PackConfig(budget=budget, strategy=strategy, overlong=overlong,
                                                           seed=seed))
    except Exception as e:   # the guards for records longer than the budget are the one allowed refusal
        assert "does not fit pack.budget" in str(e) or "record(s) longer than pack.budget" in str(e)
        return
    store = PackStore.open(tmp / "pack" / "train")
    by_id = {int(d): i for i, d in enumerate(doc_ids)}
    for p in range(store.n_packs):            # the store: every segment's tokens and mask are its document's
        off = 0
        tk, mk = store.pack_tokens(p), store.pack_mask(p)
        for doc, start, n in store.pack_segments(p):
            i = by_id[int(doc)]
            assert np.array_equal(tk[off:off + n], toks[i][start:start + n])
            assert np.array_equal(mk[off:off + n], masks[i][start:start + n])
            off += n
    for loss_on in ("all", "assistant"):     # every batch: labels = ids where (not a segment start) and learned
        loader = PackedLoader(tmp / "pack" / "train", rows=rows, loss_on=loss_on, epochs=1, drop_last=False,
                              seed=seed)
        for pack_ids, batch in zip((loader.rank_packs(0, s) for s in range(len(loader))), loader, strict=True):
            flat = batch.labels.view(-1).numpy()
            grid = batch.as_rows()["labels"].numpy()
            assert np.array_equal(grid.reshape(-1), flat)   # rows and flat layouts are the same labels
            want = np.full(rows * budget, IGNORE, np.int64)
            for r, p in enumerate(pack_ids):
                if p < 0:
                    continue
                off = r * budget
                for doc, start, n in store.pack_segments(int(p)):
                    i = by_id[int(doc)]
                    ids, m = toks[i][start:start + n].astype(np.int64), masks[i][start:start + n]
                    lab = np.where((m == 1) | (loss_on == "all"), ids, IGNORE)
                    lab[0] = IGNORE
                    want[off:off + n] = lab
                    off += n
            assert np.array_equal(flat, want)
            assert batch.n_label_tokens == int((want != IGNORE).sum())


def test_old_store_without_mask_reads_as_all_learned(tmp_path):
    """A token store from before masks (no loss_mask.bin): every token learned, loss_on has nothing to drop."""
    write_token_store(tmp_path / "tok", [np.arange(2, 8, dtype=np.uint32)], np.array([0]), np.zeros(1, np.uint8),
                      {"vocab_size": 16, "eos_id": 0, "pad_id": 1})
    ts = TokenStore.open(tmp_path / "tok")
    assert ts.loss_mask is None and ts.doc_mask(0).tolist() == [1] * 6
    pack_dataset(tmp_path / "tok", tmp_path / "pack", PackConfig(budget=8))
    assert not (tmp_path / "pack" / "train" / "loss_mask.bin").exists()
    (b,) = list(PackedLoader(tmp_path / "pack" / "train", rows=1, loss_on="assistant", epochs=1))
    assert b.n_label_tokens == 5


def test_validate_names_malformed_rows(tmp_path):
    """GX record checks through the library: each bad row named by file:line and its problem."""
    from packtrain.data.validate import validate_documents

    src = tmp_path / "c.jsonl"
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    lines = [good, {"messages": [{"role": "bot", "content": "x"}, {"role": "assistant", "content": "y"}]},
             {"messages": "hello"}, {"messages": [{"role": "user", "content": "only a question"}]},
             {"messages": [{"role": "user"}, {"role": "assistant", "content": "y"}]}]
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    ingest_documents(src, tmp_path / "ing", IngestConfig())
    rep = validate_documents(tmp_path / "ing", tmp_path / "val", ValidateConfig(min_rows=1, max_duplicate_ratio=1),
                             raise_on_failure=False)
    got = {r.name: [(x["source"], x["problem"]) for x in r.offending_rows]
           for r in rep.results if not r.success and r.name in CHECKS}
    assert not rep.success
    assert got == {
        "record_shape": [("c.jsonl:3", "messages is a JSON string, expected a list of {role, content}"),
                         ("c.jsonl:5", "messages[0].content is missing")],
        "roles_allowed": [("c.jsonl:2", 'messages[0].role is "bot", allowed: system, user, assistant, tool')],
        "has_assistant_turn": [("c.jsonl:4", "no assistant turn (a conversation needs one to learn from)")],
    }, got
