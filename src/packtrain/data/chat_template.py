"""A tokenizer's own chat template → token ids + the assistant loss mask, whatever the template writes.

What is learned (mask 1) is exactly each assistant turn's content as the template renders it and the turn's
end-of-turn marker; never a header, a default system prompt the template injects, a generation prompt or the
newline between turns. The spans come from the rendered text itself, not from assumptions about the template:

1. render the conversation twice: as it is (`full`), and with each assistant content replaced by a unique
   sentinel (`skeleton`). Cut at the sentinels, the skeleton is the template's own text around the assistant
   contents: `P0 <a0> P1 <a1> ... Pn`. `full` must read `P0 c0 P1 c1 ... Pn`, where c_i is the i-th content
   as rendered (as given, or trimmed: Llama-3 and Gemma templates `| trim` it); that places every content.
   A content equal to a user's (both say "Hi") is placed right: the position comes from the skeleton.
2. the end-of-turn marker of turn k is what the template writes right after the content and before the next
   message: the common prefix of the text after the sentinel in render(messages[:k+1]) and in the whole
   skeleton (the last turn: everything after its content to the end), cut to whole tokens, trailing
   whitespace tokens dropped. Phi-3's middle turn: "<|end|>\\n<|endoftext|>" vs "<|end|>\\n<|user|>..." share
   "<|end|>\\n<|", whose whole tokens are <|end|> and "\\n"; the newline is dropped: <|end|>.

    template   rendered (assistant first, then user, assistant)                       learned
    ChatML     <|im_start|>assistant\\nA<|im_end|>\\n<|im_start|>user\\nQ<|im_end|>\\n...   A<|im_end|> B<|im_end|>
    Phi-3      <|assistant|>\\nA<|end|>\\n<|user|>\\nQ<|end|>\\n<|assistant|>\\nB<|end|>\\n<eos>   A<|end|> B<|end|>\\n<eos>
    Qwen2.5    <|im_start|>system\\nYou are ...<|im_end|>\\n<|im_start|>assistant\\nA...     A<|im_end|> ...

Tokens: the full rendering is encoded once (tokenizers' character offsets); a content token is learned when its
first character lies in the content, a marker token when it lies wholly in the marker. `closed` says that the rendering already ends (trailing whitespace aside)
with the tokenizer's EOS (Mistral, Zephyr, Phi-3 templates write `eos_token` themselves): the caller appends
no second one. A template that marks assistant text with `{% generation %}` gives the mask through
transformers' `return_assistant_tokens_mask` instead. A template that cannot render the record (it raises,
e.g. Gemma's "roles must alternate") or whose text depends on the assistant content beyond trimming is a
TemplateRenderError naming the turn; `tokenize.chat_template: builtin` is the way out.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SENTINEL = "\ue000packtrain-assistant-{}\ue001"
"""Stands in for the i-th assistant content in the skeleton render (private-use code points: no template
changes them and no real content holds them)."""
GENERATION_TAGS = ("{% generation %}", "{%- generation %}", "{% generation -%}", "{%- generation -%}")


class TemplateRenderError(ValueError):
    """The template cannot render the record, or its assistant spans cannot be placed; says which turn."""


@dataclass(frozen=True)
class TemplateRendering:
    ids: list[int]
    mask: list[int]      # 1 = learned: assistant content + its end-of-turn marker
    closed: bool         # the rendering already ends with the tokenizer's EOS (trailing whitespace aside)


def _render(hf, msgs: list[dict], **kw) -> str:
    try:
        return hf.apply_chat_template(msgs, tokenize=False, **kw)
    except Exception as e:   # noqa: BLE001 - jinja2 TemplateError (raise_exception), or a template's own bug
        raise TemplateRenderError(f"the tokenizer's chat template cannot render this record: {e}; set "
                                  "tokenize.chat_template=builtin to use packtrain's template") from None


def _refuse(k: int, why: str) -> TemplateRenderError:
    return TemplateRenderError(
        f"the tokenizer's chat template: the content of messages[{k}] cannot be located in the rendered "
        f"text ({why}), so its loss mask (or its typed control text) is unknown; set "
        "tokenize.chat_template=builtin")


def learned_spans(hf, msgs: list[dict], also: Sequence[int] = ()) -> tuple[str, list[tuple[int, int, int]]]:
    """(the full rendering, [(content start, content end, marker end) of each assistant turn]), in characters;
    the marker end is a bound that render_own_template cuts to whole tokens and strips of whitespace.
    `also`: more turns (of any role) whose contents are placed the same way; their spans come with marker end
    -1 and are not learned (content_spans uses them to find control text typed in a user turn).

    ChatML, [user "Q", assistant "A"]: "<|im_start|>user\\nQ<|im_end|>\\n<|im_start|>assistant\\nA<|im_end|>\\n"
    → [(51, 52, 63)]: "A", then "<|im_end|>\\n" of which "<|im_end|>" is learned.
    """
    turns = [k for k, m in enumerate(msgs) if m["role"] == "assistant" or k in also]
    for k, m in enumerate(msgs):
        if "\ue000" in m["content"] or "\ue001" in m["content"]:
            raise _refuse(k, "its content holds the private-use characters U+E000/U+E001 packtrain marks turns with")
    full = _render(hf, msgs)
    marked = [dict(m) for m in msgs]
    for i, k in enumerate(turns):
        marked[k]["content"] = SENTINEL.format(i)
    skeleton = _render(hf, marked)
    pieces, pos = [], 0
    for i, k in enumerate(turns):
        s = SENTINEL.format(i)
        at = skeleton.find(s, pos)
        if at < 0 or skeleton.count(s) != 1:
            raise _refuse(k, "the template does not write the content exactly once")
        pieces.append(skeleton[pos:at])
        pos = at + len(s)
    pieces.append(skeleton[pos:])
    if not full.startswith(pieces[0]):
        raise _refuse(turns[0], "the text before it depends on the assistant contents")
    spans, pos = [], len(pieces[0])
    for i, k in enumerate(turns):
        content, after = msgs[k]["content"], pieces[i + 1]
        last = i == len(turns) - 1
        for shown in dict.fromkeys((content, content.strip(), content.lstrip(), content.rstrip())):
            end = pos + len(shown)
            if full.startswith(shown, pos) and full.startswith(after, end) and (not last or
                                                                                 end + len(after) == len(full)):
                break
        else:
            raise _refuse(k, "the template renders the content other than as given or trimmed")
        learned = msgs[k]["role"] == "assistant"
        spans.append((pos, end, end + len(_end_of_turn(hf, marked, k, i, after)) if learned else -1))
        pos = end + len(after)
    return full, spans


def _end_of_turn(hf, marked: list[dict], k: int, i: int, after: str) -> str:
    """What the template writes right after assistant turn k's content and before the next message (a bound:
    the common prefix may end inside the next message's first marker)."""
    if k == len(marked) - 1:
        return after
    upto = _render(hf, marked[: k + 1])
    s = SENTINEL.format(i)
    at = upto.find(s)
    if at < 0:
        raise _refuse(k, "rendering the conversation up to that turn does not write its content")
    return os.path.commonprefix([upto[at + len(s):], after])


def _closed(ids: Sequence[int], texts: Sequence[str], eos: int | None) -> bool:
    """True when the last token whose text is not whitespace is `eos`."""
    for i in range(len(ids) - 1, -1, -1):
        if texts[i].strip():
            return eos is not None and ids[i] == eos
    return False


def special_strings(hf) -> tuple[str, ...]:
    """The tokenizer's special tokens as text (EOS, BOS, pad, turn markers), longest first."""
    found = {t.content for t in hf.backend_tokenizer.get_added_tokens_decoder().values() if t.special and t.content}
    return tuple(sorted(found, key=lambda s: (-len(s), s)))


def _encode_pieces(backend, full: str, typed: list[tuple[int, int]]):
    """(ids, [(start, end)] offsets) of `full`, the character ranges `typed` (control strings typed in content)
    encoded as plain text. tokenizers cuts a text at special tokens before anything else, so the text between
    them encodes exactly as in one call."""
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    pos = 0
    for a, b in [*typed, (len(full), len(full))]:
        for lo, hi, plain in ((pos, a, False), (a, b, True)):
            if hi > lo:
                old = backend.encode_special_tokens
                backend.encode_special_tokens = plain
                try:
                    enc = backend.encode(full[lo:hi], add_special_tokens=False)
                finally:
                    backend.encode_special_tokens = old
                ids += list(enc.ids)
                offsets += [(lo + s, lo + e) for s, e in enc.offsets]
        pos = b
    return ids, offsets


def _typed_ranges(full: str, spans: list[tuple[int, int, int]], strings: Sequence[str]) -> list[tuple[int, int]]:
    """Sorted, non-overlapping character ranges of the control strings inside the content spans."""
    found: list[tuple[int, int]] = []
    for a, c, _ in spans:
        i = a
        while i < c:
            hit = next((s for s in strings if full.startswith(s, i) and i + len(s) <= c), None)
            if hit is None:
                i += 1
                continue
            found.append((i, i + len(hit)))
            i += len(hit)
    return sorted(found)


def render_own_template(messages: Sequence[dict], hf, as_text: bool = True) -> TemplateRendering:
    """ids + mask (module doc) of a chat record rendered by the tokenizer's own `chat_template`. `as_text`: a
    special token typed in any turn's content is encoded as plain text (that turn's content is placed in the
    rendering like an assistant turn's; a template that does not write it once is a TemplateRenderError)."""
    msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
    template = hf.chat_template if isinstance(hf.chat_template, str) else ""
    eos = hf.eos_token_id
    strings = special_strings(hf) if as_text else ()
    typed_turns = [k for k, m in enumerate(msgs) if any(s in m["content"] for s in strings)]
    if typed_turns:
        return _render_typed(hf, msgs, typed_turns, strings)
    if any(tag in template for tag in GENERATION_TAGS):
        try:
            out = hf.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        except Exception as e:   # noqa: BLE001 - as _render
            raise TemplateRenderError(f"the tokenizer's chat template cannot render this record: {e}; set "
                                      "tokenize.chat_template=builtin to use packtrain's template") from None
        ids = list(out["input_ids"])
        texts = [hf.decode([t]) for t in ids]
        return TemplateRendering(ids, [int(bool(x)) for x in out["assistant_masks"]], _closed(ids, texts, eos))
    full, spans = learned_spans(hf, msgs)
    enc = hf.backend_tokenizer.encode(full, add_special_tokens=False)
    return _masked(full, list(enc.ids), list(enc.offsets), spans, eos)


def _render_typed(hf, msgs: list[dict], typed_turns: list[int], strings: Sequence[str]) -> TemplateRendering:
    """A record with control strings typed in `typed_turns`: those contents placed too, their control strings
    encoded as plain text; the mask from the assistant spans as usual."""
    full, spans = learned_spans(hf, msgs, also=typed_turns)
    typed = _typed_ranges(full, spans, strings)
    ids, offsets = _encode_pieces(hf.backend_tokenizer, full, typed)
    return _masked(full, ids, offsets, [sp for sp in spans if sp[2] >= 0], hf.eos_token_id)


def _masked(full: str, ids: list[int], offsets: list[tuple[int, int]], spans: list[tuple[int, int, int]],
            eos: int | None) -> TemplateRendering:
    """The mask of `ids` (character `offsets` into `full`) from the learned spans (module doc)."""
    texts = [full[s:e] for s, e in offsets]
    starts = np.array([s for s, _ in offsets], dtype=np.int64)   # [n] non-decreasing
    ends = np.array([e for _, e in offsets], dtype=np.int64)
    mask = np.zeros(len(ids), dtype=np.uint8)
    for a, c, m in spans:
        mask[(starts >= a) & (starts < c)] = 1                      # the content
        j = stop = int(np.searchsorted(starts, c))                    # the marker: whole tokens in [c, m) ...
        while stop < len(ids) and starts[stop] < m and ends[stop] <= m:
            stop += 1
        while stop > j and not texts[stop - 1].strip():                # ... without trailing whitespace
            stop -= 1
        mask[j:stop] = 1
    return TemplateRendering(ids, mask.tolist(), _closed(ids, texts, eos))
