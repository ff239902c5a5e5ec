"""Chat and prompt/completion records → token ids + a per-token loss mask (uint8, 1 = the model learns it).

Record kinds (the documents table's `format` column, packtrain.data.ingest):

    text               {"text": "..."}                                   mask all 1
    messages           {"messages": [{"role": "user", "content": "Hi"},  mask 1 on assistant content and its
                                     {"role": "assistant", "content": "Hello"}]}   end-of-turn token, else 0
    prompt_completion  {"prompt": "2+2=", "completion": "4"}             prompt + completion, no template;
                                                                         mask 0 on the prompt, 1 on the completion

Chat template, first match (`tokenize.chat_template: auto`):
1. the tokenizer's own `chat_template` (a real model's), packtrain.data.chat_template: exactly each assistant
   turn's content and its end-of-turn marker are learned, located in the rendered text (never the template's
   headers, a default system prompt it injects, or the newline between turns); `{% generation %}` templates
   use transformers' `return_assistant_tokens_mask`. A template that cannot render the record or whose spans
   cannot be placed is an error naming the turn: set `tokenize.chat_template: builtin`.
2. the built-in ChatML-like template (`tokenize.chat_template: builtin`, or a tokenizer without one):

       <|im_start|>system\\nYou are terse.<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello<|im_end|>\\n

   The markers are encoded *as text*, so any BPE tokenizer works (a trained 4k BPE spends a few tokens on
   each). Each piece is encoded on its own and the ids concatenated, so span boundaries are exact:

       piece                          mask
       "<|im_start|>user\\n"           0
       "Hi"                           0
       "<|im_end|>\\n"                 0
       "<|im_start|>assistant\\n"      0
       "Hello"                        1
       "<|im_end|>"                   1      the end-of-turn marker: the model learns to stop
       "\\n"                           0

The tokenizer's special prefix (BOS) has mask 0; the appended EOS has mask 1 when the record ends with an
assistant turn / a completion (the model learns where a conversation ends), else 0. A template that already
ends the rendering with the tokenizer's EOS (Mistral, Zephyr, Phi-3) gets no second one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

ROLES = ("system", "user", "assistant", "tool")
"""Roles a chat record may use; `assistant` turns are the ones learned."""
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
FORMATS = ("text", "messages", "prompt_completion")
RecordFormat = Literal["text", "messages", "prompt_completion"]

Encode = Callable[[str], list[int]]


class RecordError(ValueError):
    """A record that cannot be rendered; the message says which field and what is allowed."""


@dataclass(frozen=True)
class Rendered:
    """One record as token ids and its loss mask (same length)."""

    ids: list[int]
    mask: list[int]
    closed: bool = False   # the rendering already ends with the tokenizer's EOS: none is appended


CHECKS = ("record_shape", "roles_allowed", "has_assistant_turn", "content_not_empty")
"""The per-record checks validate runs on chat / prompt-completion rows (one GX expectation each)."""


def record_checks(fmt: str, record: object) -> dict[str, str | None]:
    """{check: the first problem found, or None} for each of CHECKS.

    >>> record_checks("messages", [{"role": "bot", "content": "hi"}])["roles_allowed"]
    'messages[0].role is "bot", allowed: system, user, assistant, tool'
    """
    out: dict[str, str | None] = dict.fromkeys(CHECKS)

    def note(check: str, msg: str) -> None:
        if out[check] is None:
            out[check] = msg

    if fmt == "text":
        return out
    if fmt == "prompt_completion":
        if not isinstance(record, dict):
            note("record_shape", f"record is {_kind(record)}, expected {{prompt, completion}}")
            return out
        for key in ("prompt", "completion"):
            v = record.get(key)
            if v is None:
                note("record_shape", f"{key} is missing")
            elif not isinstance(v, str):
                note("record_shape", f"{key} is {_kind(v)}, expected a string")
            elif key == "completion" and not v.strip():
                note("content_not_empty", "completion is empty")
        return out
    if fmt != "messages":
        note("record_shape", f"unknown record format {fmt!r} (allowed: {', '.join(FORMATS)})")
        return out
    if not isinstance(record, list):
        note("record_shape", f"messages is {_kind(record)}, expected a list of {{role, content}}")
        return out
    if not record:
        note("record_shape", "messages is an empty list")
    for i, m in enumerate(record):
        if not isinstance(m, dict):
            note("record_shape", f"messages[{i}] is {_kind(m)}, expected {{role, content}}")
            continue
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            note("roles_allowed", f"messages[{i}].role is {json.dumps(role)}, allowed: {', '.join(ROLES)}")
        if content is None:
            note("record_shape", f"messages[{i}].content is missing")
        elif not isinstance(content, str):
            note("record_shape", f"messages[{i}].content is {_kind(content)}, expected a string")
        elif not content.strip():
            note("content_not_empty", f"messages[{i}].content is empty")
    if record and not any(isinstance(m, dict) and m.get("role") == "assistant" for m in record):
        note("has_assistant_turn", "no assistant turn (a conversation needs one to learn from)")
    return out


def record_problems(fmt: str, record: object) -> list[str]:
    """What is wrong with a record, [] when it renders (the non-None values of record_checks).

    >>> record_problems("messages", [{"role": "user", "content": "hi"}])
    ['no assistant turn (a conversation needs one to learn from)']
    >>> record_problems("messages", "hi")
    ['messages is a JSON string, expected a list of {role, content}']
    """
    return [m for m in record_checks(fmt, record).values() if m is not None]


def _kind(v: object) -> str:
    if v is None:
        return "null"
    return {str: "a JSON string", bool: "a boolean", int: "a number", float: "a number", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__)


def record_text(fmt: str, record: object) -> str:
    """The plain text of a record (its contents joined by blank lines): what validate's length, emptiness and
    duplicate checks see, and `documents.parquet`'s `text` column for chat rows.

    >>> record_text("messages", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])
    'Hi\\n\\nYo'
    """
    if fmt == "prompt_completion" and isinstance(record, dict):
        return "\n\n".join(v for v in (record.get("prompt"), record.get("completion")) if isinstance(v, str))
    if fmt == "messages" and isinstance(record, list):
        return "\n\n".join(m["content"] for m in record if isinstance(m, dict) and isinstance(m.get("content"), str))
    return record if fmt == "text" and isinstance(record, str) else ""


def render_builtin(messages: Sequence[dict], encode: Encode, encode_content: Encode | None = None) -> Rendered:
    """The built-in ChatML-like template (module doc), piece by piece. `encode(text)` → ids, no specials;
    `encode_content` (default `encode`) encodes the contents: packtrain passes one that reads a typed special
    token as plain text (tokenize.control_text=as_text)."""
    ids: list[int] = []
    mask: list[int] = []
    enc_content = encode_content or encode

    def put(text: str, m: int, enc: Encode = encode) -> None:
        if text:
            piece = enc(text)
            ids.extend(piece)
            mask.extend([m] * len(piece))

    for msg in messages:
        learn = int(msg["role"] == "assistant")
        put(f"{IM_START}{msg['role']}\n", 0)
        put(msg["content"], learn, enc_content)
        put(IM_END, learn)
        put("\n", 0)
    return Rendered(ids, mask)


def render_prompt_completion(record: dict, encode: Encode) -> Rendered:
    """prompt + completion as plain text, no template: mask 0 on the prompt's ids, 1 on the completion's."""
    p, c = encode(record["prompt"]), encode(record["completion"])
    return Rendered(p + c, [0] * len(p) + [1] * len(c))


# ---- control tokens typed inside content (tokenize.control_text) ---------------------------------------------

def control_strings(hf, builtin: bool) -> tuple[str, ...]:
    """The control strings a record's content must not turn into: the tokenizer's special tokens (EOS, BOS, pad,
    a real model's turn markers such as Qwen's `<|im_end|>`), and with the built-in template its markers
    `<|im_start|>` / `<|im_end|>` (text there, so a typed one reads exactly like the template's). Longest first."""
    from packtrain.data.chat_template import special_strings

    found = set(special_strings(hf))
    if builtin:
        found |= {IM_START, IM_END}
    return tuple(sorted(found, key=lambda s: (-len(s), s)))


def typed_controls(fmt: str | None, record: object, strings: Sequence[str]) -> list[str]:
    """'messages[1].content holds "<|im_end|>"' for each content / prompt / completion holding a control string.

    >>> typed_controls("messages", [{"role": "user", "content": "end with <|im_end|>"}], ["<|im_end|>"])
    ['messages[0].content holds "<|im_end|>"']
    """
    if not strings:
        return []
    if fmt == "messages" and isinstance(record, list):
        fields = [(f"messages[{i}].content", m.get("content")) for i, m in enumerate(record) if isinstance(m, dict)]
    elif fmt == "prompt_completion" and isinstance(record, dict):
        fields = [(k, record.get(k)) for k in ("prompt", "completion")]
    else:
        return []
    out = []
    for name, value in fields:
        if isinstance(value, str):
            hits = [s for s in strings if s in value]
            if hits:
                out.append(f"{name} holds " + ", ".join(json.dumps(h, ensure_ascii=False) for h in hits))
    return out


def text_encoder(backend) -> Encode:
    """encode(text) → ids with every special token typed in `text` read as plain text (tokenizers'
    `encode_special_tokens`), never as its id. Text without one encodes exactly as before."""
    def encode(text: str) -> list[int]:
        old = backend.encode_special_tokens
        backend.encode_special_tokens = True
        try:
            return list(backend.encode(text, add_special_tokens=False).ids)
        finally:
            backend.encode_special_tokens = old
    return encode


def render_with_template(messages: Sequence[dict], hf, as_text: bool = True) -> Rendered:
    """The tokenizer's own chat template (packtrain.data.chat_template): its ids and the assistant mask."""
    from packtrain.data.chat_template import TemplateRenderError, render_own_template

    try:
        r = render_own_template(messages, hf, as_text)
    except TemplateRenderError as e:
        raise RecordError(str(e)) from None
    return Rendered(r.ids, r.mask, r.closed)


def has_own_template(hf) -> bool:
    """True when the tokenizer ships a chat template (a string; multi-template dicts are not used)."""
    return isinstance(getattr(hf, "chat_template", None), str) and bool(hf.chat_template.strip())


def render_record(fmt: str, record: object, hf, use_own_template: bool, as_text: bool = True) -> Rendered:
    """ids + mask of one non-text record (no BOS/EOS: the caller adds the tokenizer's rule); RecordError when
    the record is malformed (the same problems `record_problems` lists). `as_text` (tokenize.control_text):
    a special token typed in a content is encoded as plain text, never as its id."""
    problems = record_problems(fmt, record)
    if problems:
        raise RecordError("; ".join(problems))
    backend = hf.backend_tokenizer

    def encode(text: str) -> list[int]:
        return list(backend.encode(text, add_special_tokens=False).ids)

    content = text_encoder(backend) if as_text else encode
    if fmt == "prompt_completion":
        assert isinstance(record, dict)
        return render_prompt_completion(record, content)
    assert isinstance(record, list)
    if use_own_template:
        return render_with_template(record, hf, as_text)
    return render_builtin(record, encode, content)


def ends_with_learned_turn(fmt: str, record: object) -> bool:
    """Whether the appended EOS is learned (mask 1): the record ends with an assistant turn / a completion."""
    if fmt == "prompt_completion":
        return True
    return isinstance(record, list) and bool(record) and isinstance(record[-1], dict) \
        and record[-1].get("role") == "assistant"


def prompt_tokens(mask: Sequence[int] | np.ndarray) -> int:
    """Tokens before the first learned one (the whole record when none is learned).

    >>> prompt_tokens([0, 0, 0, 1, 1, 0])
    3
    """
    m = np.asarray(mask)
    hits = np.flatnonzero(m)
    return int(hits[0]) if len(hits) else len(m)


# ---- reading: which files hold records (packtrain.data.source_readers) -----------------------------------------

def detect_record_format(obj: dict, text_field: str, record_format: str = "auto") -> RecordFormat:
    """The kind of a JSON record: `messages` when it has a "messages" key, `prompt_completion` when it has
    "prompt" or "completion", else `text`; an explicit `ingest.record_format` wins.

    >>> detect_record_format({"prompt": "2+2=", "completion": "4"}, "text")
    'prompt_completion'
    """
    if record_format != "auto":
        return record_format  # type: ignore[return-value]
    if "messages" in obj:
        return "messages"
    if text_field not in obj and ("prompt" in obj or "completion" in obj):
        return "prompt_completion"
    return "text"


def record_of(obj: dict, fmt: RecordFormat) -> str:
    """The structured part of a chat/prompt record as canonical JSON (validate and tokenize parse it). Kept as
    it is, whatever its shape: a malformed record is reported by validate, row by row, not refused here."""
    if fmt == "messages":
        return json.dumps(obj.get("messages"), ensure_ascii=False)
    return json.dumps({"prompt": obj.get("prompt"), "completion": obj.get("completion")}, ensure_ascii=False)


def file_record_format(f, text_field: str, record_format: str = "auto") -> RecordFormat:
    """The record format of a file without reading it all: the first JSON line's keys (.jsonl) or the column
    names (.parquet); .txt is text. Unreadable files answer "text" (reading them later names the problem)."""
    if f.kind == "txt":
        return "text"
    if record_format != "auto":
        return record_format  # type: ignore[return-value]
    try:
        if f.kind == "parquet":
            import pyarrow.parquet as pq

            return detect_record_format(dict.fromkeys(pq.read_schema(f.path).names), text_field)
        with open(f.path, "rb") as fh:
            for raw in fh:
                if raw.strip():
                    obj = json.loads(raw.decode("utf-8-sig"))
                    return detect_record_format(obj, text_field) if isinstance(obj, dict) else "text"
    except Exception:   # noqa: BLE001 - any problem is reported by the real read, with its line
        return "text"
    return "text"


# ---- tokenizing rows (packtrain.data.tokenize) --------------------------------------------------------------

def record_batches(pf, batch_docs: int):
    """Yield (first row index, [(text, format, record JSON or None, source)]) of a table with records."""
    start = 0
    cols = ["text", "format", "record", "source"]
    for rb in pf.iter_batches(batch_size=batch_docs, columns=cols):
        d = rb.to_pydict()
        rows = list(zip(d["text"], d["format"], d["record"], d["source"], strict=True))
        yield start, rows
        start += len(rows)


def encode_row(hf, fmt, rec, text, wrap, prefix: list[int], own_template: bool, as_text: bool = True,
               info: dict | None = None):
    """(ids, mask) of one row: a text row through the usual prefix/EOS rule with mask 1; a record rendered by
    packtrain.data.chat, the tokenizer's prefix (BOS) mask 0 — left out for its own template, which writes
    its BOS itself — and the appended EOS learned when the record ends with an assistant turn / completion
    (none appended when the template's rendering already ends with EOS).
    A record that does not render gives ([], [problem]) for row_problem to report. `info` (a dict) gets
    "closed": True when the template wrote the EOS itself."""
    if fmt in (None, "text") or rec is None:
        ids = wrap(list(hf.backend_tokenizer.encode(text or "", add_special_tokens=False).ids))
        return ids, [1] * len(ids)
    try:
        record = json.loads(rec)
        r = render_record(fmt, record, hf, own_template, as_text)
    except (RecordError, json.JSONDecodeError, TypeError, KeyError) as e:
        return [], [str(e)]
    tail = wrap(r.ids)[len(prefix) + len(r.ids):]   # wrap: prefix + ids + suffix (+ EOS)
    if r.closed and tail and tail[-1] == hf.eos_token_id:
        tail = tail[:-1]                             # the template wrote the EOS itself: never a second one
    if info is not None:
        info["closed"] = r.closed
    head = [] if own_template else list(prefix)
    learned_end = int(ends_with_learned_turn(fmt, record))
    return head + r.ids + tail, [0] * len(head) + r.mask + [learned_end] * len(tail)


def row_problem(ids, mask, fmt, rec, prompt_budget: int | None) -> str | None:
    """Why a rendered record cannot be trained on, or None: it did not render, it learns nothing, or its
    prompt is longer than the pack budget."""
    if not ids:
        return str(mask[0]) if mask else "renders to no tokens"
    if fmt in (None, "text") or rec is None:
        return None
    if not any(mask):
        return "no token to learn (no assistant content / completion)"
    n = prompt_tokens(mask)
    if prompt_budget is not None and n >= prompt_budget:
        return (f"prompt of {n} tokens (before the first learned token) does not fit the pack budget "
                f"{prompt_budget}")
    return None
