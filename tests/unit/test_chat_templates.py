"""Real-style chat templates (written here, as the models ship them) → exactly the assistant contents and their
end-of-turn markers are learned: never a header, an injected default system prompt, a generation prompt or the
newline between turns; a template that writes EOS itself gets no second one.

The tokenizer is a byte-level BPE with no merges (one token per ASCII character) whose special tokens are the
templates' markers, so every decoded token is one character or one whole marker and the learned text is exact.
"""

from __future__ import annotations

import json

import pytest

from packtrain.data.chat import RecordError, encode_row, render_record
from packtrain.data.tokenizer_setup import _document_ids, special_tokens_rule

MARKERS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>", "<s>", "</s>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>",
           "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
QWEN25 = ("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + "
          "'<|im_end|>\n' }}{%- else %}{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
          "{%- endif %}{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
          "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- endif %}"
          "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
         "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
         "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
         "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
        "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
        "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}"
        "{% endif %}")
ZEPHYR = ("{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + "
          "eos_token }}{% elif message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + eos_token }}"
          "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\n'  + message['content'] + eos_token }}"
          "{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}{% endfor %}")

SYS, Q1, A1, Q2, A2 = "Be terse.", "Hi", "Hi", "2+2?", " 4 "   # A1 == Q1: placed by position, not by search
WITH_SYSTEM = [{"role": "system", "content": SYS}, {"role": "user", "content": Q1},
               {"role": "assistant", "content": A1}, {"role": "user", "content": Q2},
               {"role": "assistant", "content": A2}]
ALTERNATING = WITH_SYSTEM[1:]
ASSISTANT_FIRST = [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": Q2},
                   {"role": "assistant", "content": A2}]

# template, bos, eos, conversation → (learned text, whole document text); "+EOS" = the appended EOS, absent when
# the template already ends the document with the tokenizer's EOS
CASES = {
    "chatml": (CHATML, "<|endoftext|>", "<|endoftext|>", {
        "system": ("Hi<|im_end|> 4 <|im_end|><|endoftext|>",
                   "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                   "Hi<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n 4 <|im_end|>\n"
                   "<|endoftext|>"),
        "assistant_first": ("Hello!<|im_end|> 4 <|im_end|><|endoftext|>",
                            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                            "<|im_start|>assistant\n 4 <|im_end|>\n<|endoftext|>")}),
    "qwen2.5 default system prompt": (QWEN25, None, "<|im_end|>", {
        "system": ("Hi<|im_end|> 4 <|im_end|>",
                   "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                   "Hi<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n 4 <|im_end|>\n"),
        "assistant_first": ("Hello!<|im_end|> 4 <|im_end|>",
                            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>assistant\n"
                            "Hello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n 4 "
                            "<|im_end|>\n")}),
    "llama-3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>", {
        "system": ("Hi<|eot_id|>4<|eot_id|>",
                   "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe terse.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
                   "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"),
        "assistant_first": ("Hello!<|eot_id|>4<|eot_id|>",
                            "<|begin_of_text|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                            "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|><|start_header_id|>assistant"
                            "<|end_header_id|>\n\n4<|eot_id|>")}),
    "mistral [INST]": (MISTRAL, "<s>", "</s>", {
        "alternating": ("Hi</s> 4 </s>", "<s>[INST] Hi [/INST]Hi</s>[INST] 2+2? [/INST] 4 </s>"),
        "assistant_first": "Conversation roles must alternate"}),
    "gemma": (GEMMA, "<bos>", "<eos>", {
        "alternating": ("Hi<end_of_turn>4<end_of_turn><eos>",
                        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHi<end_of_turn>\n"
                        "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n<eos>"),
        "assistant_first": "Conversation roles must alternate"}),
    "phi-3": (PHI3, "<s>", "<|endoftext|>", {
        "system": ("Hi<|end|> 4 <|end|>\n<|endoftext|>",
                   "<|system|>\nBe terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHi<|end|>\n<|user|>\n2+2?"
                   "<|end|>\n<|assistant|>\n 4 <|end|>\n<|endoftext|>"),
        "assistant_first": ("Hello!<|end|> 4 <|end|>\n<|endoftext|>",
                            "<|assistant|>\nHello!<|end|>\n<|user|>\n2+2?<|end|>\n<|assistant|>\n 4 <|end|>\n"
                            "<|endoftext|>")}),
    "zephyr (eos_token ends each turn)": (ZEPHYR, "<s>", "</s>", {
        "system": ("Hi</s> 4 </s>",
                   "<|system|>\nBe terse.</s><|user|>\nHi</s><|assistant|>\nHi</s><|user|>\n2+2?</s><|assistant|>\n"
                   " 4 </s>"),
        "assistant_first": ("Hello!</s> 4 </s>",
                            "<|assistant|>\nHello!</s><|user|>\n2+2?</s><|assistant|>\n 4 </s>")}),
}
CONVERSATIONS = {"system": WITH_SYSTEM, "alternating": ALTERNATING, "assistant_first": ASSISTANT_FIRST}


@pytest.fixture(scope="module")
def marker_tokenizer():
    """One char per token + every template marker as one special token (a real tokenizers BPE, built here)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["abc"], trainer=trainers.BpeTrainer(
        vocab_size=256 + len(MARKERS), special_tokens=MARKERS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)


def _tokenizer(base, template: str, bos: str | None, eos: str):
    import copy

    hf = copy.deepcopy(base)
    hf.chat_template, hf.eos_token = template, eos
    if bos is not None:
        hf.bos_token = bos
    return hf


@pytest.mark.parametrize("name", list(CASES))
def test_own_template_learns_exactly_assistant_content_and_end_of_turn(marker_tokenizer, name):
    template, bos, eos, convs = CASES[name]
    hf = _tokenizer(marker_tokenizer, template, bos, eos)
    prefix, suffix = special_tokens_rule(hf)
    wrap = _document_ids(prefix, suffix, hf.eos_token_id, True)
    for conv, want in convs.items():
        record = CONVERSATIONS[conv]
        if isinstance(want, str):   # the template itself refuses the record: a RecordError, not a crash
            with pytest.raises(RecordError, match=want):
                render_record("messages", record, hf, use_own_template=True)
            ids, problem = encode_row(hf, "messages", json.dumps(record), "", wrap, prefix, True)
            assert ids == [] and want in problem[0]
            continue
        ids, mask = encode_row(hf, "messages", json.dumps(record), "", wrap, prefix, True)
        tokens = [hf.decode([i]) for i in ids]
        table = "\n".join(f"{m} {t!r}" for t, m in zip(tokens, mask, strict=True))
        want_learned, want_text = want
        assert "".join(tokens) == want_text, (conv, table)
        assert "".join(t for t, m in zip(tokens, mask, strict=True) if m) == want_learned, (conv, table)


def test_tokenize_stage_writes_one_eos_for_a_template_that_writes_it(tmp_path, marker_tokenizer):
    """Through ingest → tokenize_documents: a Mistral-style record ends with exactly one learned </s>."""
    from packtrain.config import IngestConfig, TokenizeConfig
    from packtrain.data.ingest import ingest_documents
    from packtrain.data.token_store import TokenStore
    from packtrain.data.tokenize import tokenize_documents

    _tokenizer(marker_tokenizer, MISTRAL, "<s>", "</s>").save_pretrained(str(tmp_path / "own"))
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"messages": ALTERNATING}) + "\n", encoding="utf-8")
    ingest_documents(src, tmp_path / "ing", IngestConfig())
    stats = tokenize_documents(tmp_path / "ing", tmp_path / "tok", TokenizeConfig(
        tokenizer_dir=str(tmp_path / "own"), eval_fraction=0.0))
    from packtrain.commands.tokenize import _eos_said

    # the summary's EOS sentence says the truth per row kind
    assert (stats.record_rows, stats.eos_appended_records, stats.eos_from_template_records) == (1, 0, 1)
    assert _eos_said(stats.to_dict()) == ("EOS (id 8) appended to 0 text row(s) and 0 of 1 record(s); 1 record(s) "
                                          "end with their template's own EOS (none appended)")
    ts = TokenStore.open(tmp_path / "tok")
    hf = _tokenizer(marker_tokenizer, MISTRAL, "<s>", "</s>")
    toks = [hf.decode([int(i)]) for i in ts.doc(0)]
    assert "".join(toks) == "<s>[INST] Hi [/INST]Hi</s>[INST] 2+2? [/INST] 4 </s>"
    assert "".join(t for t, m in zip(toks, ts.doc_mask(0), strict=True) if m) == "Hi</s> 4 </s>"
