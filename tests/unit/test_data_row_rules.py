"""packtrain.data.record_rules: the per-document rules as tables, and the prompt lower bound as a property
(never above the real count of a byte-level BPE trained like tokenize trains it, built-in template)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtrain.data.chat import prompt_tokens, render_builtin
from packtrain.data.record_rules import (
    PromptCounter,
    RowRules,
    role_order_problem,
    row_problem,
    visible_text_problem,
)

VISIBLE = [   # (text, visible?)
    ("hello", True), ("\x00" * 1000, False), ("\ufffd\ufffd", False), ("\u200b\u200d\ufeff", False),
    ("\x1b\x07\x7f\x85", False), (" \x00 \n\ufffd", False), ("\x00a", True), ("日本", True), ("\U0001f600", True),
    ("\u00ad", False), ("-", True), ("\ue000", True),   # a private-use character may render: not refused
]


@pytest.mark.parametrize("text,visible", VISIBLE)
def test_visible_text(text, visible):
    assert (visible_text_problem("text", None, text) is None) == visible


def test_visible_text_names_the_field_and_leaves_blanks_and_non_strings_alone():
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\x00\x00"}]
    assert visible_text_problem("messages", chat, "q\n\n\x00\x00") == \
        "messages[1].content has no visible text (2 characters: 2 NUL/control)"
    assert visible_text_problem("prompt_completion", {"prompt": "\ufffd", "completion": "x"}, "") == \
        "prompt has no visible text (1 characters: 1 U+FFFD replacement)"
    assert visible_text_problem("text", None, "   ") is None        # text_not_empty's
    assert visible_text_problem("text", None, None) is None         # text_not_null's


def _msgs(*roles):
    return [{"role": r, "content": "x"} for r in roles]


ORDER = [   # (roles, the offending turn index or None)
    (("user", "assistant"), None), (("system", "user", "assistant"), None),
    (("user", "assistant", "user", "assistant"), None), (("user", "assistant", "tool", "assistant"), None),
    (("user", "assistant", "tool", "tool", "assistant"), None),
    (("assistant",), 0), (("assistant", "user", "assistant"), 0), (("user", "user", "assistant"), 1),
    (("user", "assistant", "assistant"), 2), (("user", "assistant", "user"), 2), (("system", "system", "user", "assistant"), 1),
    (("user", "system", "assistant"), 1), (("user", "tool", "assistant"), 1), (("system", "assistant"), 1),
    (("user", "assistant", "tool"), 2), (("tool", "user", "assistant"), 0),
]


@pytest.mark.parametrize("roles,bad", ORDER)
def test_role_order(roles, bad):
    problem = role_order_problem("messages", _msgs(*roles))
    if bad is None:
        assert problem is None
    else:
        assert problem is not None and problem.startswith(f"messages[{bad}].role is \"{roles[bad]}\""), problem


def test_role_order_leaves_other_problems_to_their_checks():
    assert role_order_problem("messages", _msgs("bot", "assistant")) is None      # roles_allowed
    assert role_order_problem("messages", _msgs("user")) is None                  # has_assistant_turn
    assert role_order_problem("messages", "hi") is None                           # record_shape
    assert role_order_problem("prompt_completion", {"prompt": "a", "completion": "b"}) is None
    assert row_problem("messages", _msgs("assistant", "user", "assistant"), "x",
                       RowRules(role_order="any")) is None


# ---- the prompt lower bound -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE built and trained as packtrain.data.tokenizer_setup.train_tokenizer builds it (the
    tokenizers core, without transformers)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from packtrain.data.tokenizer_setup import EOS_TOKEN, PAD_TOKEN

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=2, special_tokens=[EOS_TOKEN, PAD_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [f"user says {i}: why is the sky blue? assistant: because of Rayleigh scattering." for i in range(300)]
    corpus += ["<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>\n"] * 50
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60) | st.sampled_from(
    ["why " * 40, "<|endoftext|>x<|pad|>", "  spaced   out  ", "2+2=", "user says 7: why"])


@settings(max_examples=80, deadline=None)
@given(prompt=TEXT, turns=st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), TEXT),
                                    min_size=1, max_size=5))
def test_the_bound_never_exceeds_the_real_count(bpe, prompt, turns):
    def encode(text):
        return list(bpe.encode(text, add_special_tokens=False).ids)

    bound = PromptCounter(False)
    pc = {"prompt": prompt, "completion": "ok"}
    assert bound("prompt_completion", pc) <= len(encode(prompt))
    msgs = [{"role": r, "content": c or "x"} for r, c in turns] + [{"role": "assistant", "content": "done"}]
    msgs = [m if m["content"].strip() else {**m, "content": "x"} for m in msgs]
    n = bound("messages", msgs)
    assert n is not None
    assert n <= prompt_tokens(render_builtin(msgs, encode).mask)
