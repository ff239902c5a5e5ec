"""Per-document rules: can this one document be trained on? Shared by validate (one GX expectation each, on a
column holding each row's problem) and ingest (`ingest.on_bad_record: skip` drops the documents they refuse).

    rule                 applies to                      refuses (the problem text names the turn / field)
    has_visible_text     every row                       a non-blank text, turn content, prompt or completion with
                                                         no visible character: only NUL/control characters,
                                                         zero-width/format characters, U+FFFD replacement
                                                         characters and whitespace (a binary file or a decoding
                                                         accident upstream). Blank texts are text_not_empty's.
    role_order           chat records                    roles out of order (ROLE_ORDER below)
    prompt_fits_budget   chat / prompt-completion        a prompt of ≥ pack.budget tokens (PromptCounter)
    template_renders     chat records, a known tokenizer  its chat template refuses the record (Gemma: "System role
                                                         not supported"): rendered once here, as tokenize renders
    record_fits_budget   records, long_records=refuse    a record of > pack.budget tokens (exact, or a lower bound)
    control_text         records, control_text=refuse    a control string typed in a content (chat.control_strings)

plus packtrain.data.chat.CHECKS (record_shape, roles_allowed, has_assistant_turn, content_not_empty).

    >>> visible_text_problem("text", None, "\\x00" * 1000)
    'no visible text (1,000 characters: 1,000 NUL/control)'
    >>> role_order_problem("messages", [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}])
    'messages[0].role is "assistant" (the first turn), expected system or user; allowed order: optional system...'
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Literal

from packtrain.data.chat import CHECKS as RECORD_CHECKS
from packtrain.data.chat import IM_END, IM_START, ROLES, record_checks

RULES = ("has_visible_text", "role_order", "prompt_fits_budget", "template_renders", "record_fits_budget",
         "control_text")
"""The rules of this module, in report order; has_visible_text also applies to plain-text tables."""
ROW_CHECKS = (*RECORD_CHECKS, *RULES)

ROLE_ORDER = ("optional system turn first, then user and assistant alternating from user, ending with assistant; "
              "tool turns only after an assistant turn")
"""The role-order policy (validate.role_order: alternating). A turn that breaks it is named with its index."""
_NEXT: dict[str | None, tuple[str, ...]] = {
    None: ("system", "user"), "system": ("user",), "user": ("assistant",),
    "assistant": ("user", "tool"), "tool": ("tool", "assistant")}

# a character that may be visible: not whitespace, not C0/C1 control, not U+FFFD (format characters, category
# Cf, are excluded by a second look at the few candidates this leaves)
_CANDIDATE = re.compile(r"[^\s\x00-\x1f\x7f-\x9f\ufffd]")


def has_visible(text: str) -> bool:
    """True when `text` holds a character a reader can see (the first letter decides, for almost every text)."""
    return any(unicodedata.category(m.group()) != "Cf" for m in _CANDIDATE.finditer(text))


def describe_invisible(text: str) -> str:
    """'1,000 characters: 990 NUL/control, 10 U+FFFD replacement' — what an invisible text is made of."""
    kinds = {"NUL/control": 0, "U+FFFD replacement": 0, "zero-width/format": 0, "whitespace": 0}
    for ch in text:
        if ch == "\ufffd":
            kinds["U+FFFD replacement"] += 1
        elif ch.isspace():
            kinds["whitespace"] += 1
        elif unicodedata.category(ch) == "Cc":
            kinds["NUL/control"] += 1
        else:
            kinds["zero-width/format"] += 1
    return f"{len(text):,} characters: " + ", ".join(f"{n:,} {k}" for k, n in kinds.items() if n)


def visible_text_problem(fmt: str | None, record: object, text: object) -> str | None:
    """has_visible_text: the first text of the row (the text; a record's turn contents, prompt, completion) that
    is not blank but shows nothing, or None. Non-strings and blank texts are left to the other checks."""
    fields: list[tuple[str, object]]
    if fmt == "messages" and isinstance(record, list):
        fields = [(f"messages[{i}].content", m.get("content")) for i, m in enumerate(record) if isinstance(m, dict)]
    elif fmt == "prompt_completion" and isinstance(record, dict):
        fields = [(k, record.get(k)) for k in ("prompt", "completion")]
    else:
        fields = [("", text)]
    for name, value in fields:
        if isinstance(value, str) and value.strip() and not has_visible(value):
            return f"{name + ' has ' if name else ''}no visible text ({describe_invisible(value)})"
    return None


def role_order_problem(fmt: str | None, record: object) -> str | None:
    """role_order (policy ROLE_ORDER): the first turn out of order, or None. Records with a wrong shape, an
    unknown role or no assistant turn are left to record_shape / roles_allowed / has_assistant_turn."""
    if fmt != "messages" or not isinstance(record, list) or not record:
        return None
    roles = [m.get("role") if isinstance(m, dict) else None for m in record]
    if any(r not in ROLES for r in roles) or "assistant" not in roles:
        return None
    prev: str | None = None
    for i, role in enumerate(roles):
        allowed = _NEXT[prev]
        if role not in allowed:
            after = "the first turn" if prev is None else f"after {json.dumps(prev)}"
            return (f"messages[{i}].role is {json.dumps(role)} ({after}), expected {' or '.join(allowed)}; "
                    f"allowed order: {ROLE_ORDER}")
        prev = role
    if prev != "assistant":
        return (f"messages[{len(roles) - 1}].role is {json.dumps(prev)} (the last turn), expected assistant; "
                f"allowed order: {ROLE_ORDER}")
    return None


@dataclass
class PromptCounter:
    """Tokens of a record's prompt (everything before its first learned token), counted before tokenize runs.

    exact=True: a tokenizer loaded from tokenize.tokenizer_dir, run through the very code tokenize uses
    (packtrain.data.chat.encode_row) — the same count tokenize refuses on. exact=False: the run will train its
    byte-level BPE at tokenize, so no vocabulary exists yet; the count is then a lower bound that holds for
    any vocabulary of that tokenizer: BPE never merges across its pre-tokenizer's pieces (GPT-2 byte-level
    regex) and the built-in template encodes each piece (markers, contents) on its own, so tokens ≥ pieces,
    with a special token (`<|endoftext|>`) inside a text counted as the one token it is. A prompt the bound
    lets through may still be refused by tokenize; one it refuses always would be.
    """

    exact: bool
    hf: object = None
    own_template: bool = False
    _wrap: object = None
    _prefix: list = field(default_factory=list)
    append_eos: bool = True
    as_text: bool = True
    strings: tuple = ()   # the control strings (packtrain.data.chat.control_strings) of the run's tokenizer

    def __call__(self, fmt: str | None, record: object) -> int | None:
        """Prompt tokens of a well-formed record (None: text rows, or a record another check refuses)."""
        return self.probe(fmt, record)[0]

    def probe(self, fmt: str | None, record: object, total: bool = True
              ) -> tuple[int | None, int | None, str | None]:
        """(prompt tokens, all tokens, the renderer's problem) of a well-formed record, as tokenize will count
        them (exact), or lower bounds (`total=False`: the bound on all tokens is not computed, None);
        (None, None, None) for text rows and records another check refuses."""
        if fmt not in ("messages", "prompt_completion") or any(record_checks(fmt, record).values()):
            return None, None, None
        if self.exact:
            from packtrain.data.chat import encode_row, prompt_tokens

            ids, mask = encode_row(self.hf, fmt, json.dumps(record), "", self._wrap, self._prefix,
                                   self.own_template, self.as_text)
            if not ids:
                return None, None, str(mask[0]) if mask else "renders to no tokens"
            return (prompt_tokens(mask) if any(mask) else None), len(ids), None
        return self._bound(fmt, record), self._bound_total(fmt, record) if total else None, None

    def _bound_total(self, fmt: str, record: object) -> int:
        """A lower bound on the tokens of the whole record (built-in template, trained BPE: no BOS, + EOS)."""
        eos = int(self.append_eos)
        if fmt == "prompt_completion":
            assert isinstance(record, dict)
            return _pieces(record["prompt"]) + _pieces(record["completion"]) + eos
        assert isinstance(record, list)
        return eos + sum(_pieces(f"{IM_START}{m['role']}\n") + _pieces(m["content"]) + _pieces(IM_END)
                         + _pieces("\n") for m in record)

    def _bound(self, fmt: str, record: object) -> int | None:
        if fmt == "prompt_completion":
            assert isinstance(record, dict)
            return _pieces(record["prompt"])
        assert isinstance(record, list)
        n = 0
        for m in record:
            if m["role"] == "assistant":
                return n + _pieces(f"{IM_START}assistant\n")
            n += _pieces(f"{IM_START}{m['role']}\n") + _pieces(m["content"]) + _pieces(IM_END) + _pieces("\n")
        return None


_PRE = None


def _pieces(text: str) -> int:
    """Pieces of the trained BPE's pre-tokenizer (ByteLevel, no prefix space; packtrain.data.tokenizer_setup),
    its special tokens counted as one each: a lower bound on the tokens of `text` encoded on its own."""
    global _PRE
    from packtrain.data.tokenizer_setup import EOS_TOKEN, PAD_TOKEN

    if _PRE is None:
        from tokenizers import pre_tokenizers

        _PRE = pre_tokenizers.ByteLevel(add_prefix_space=False)
    n = 0
    parts = re.split(f"({re.escape(EOS_TOKEN)}|{re.escape(PAD_TOKEN)})", text)
    for i, part in enumerate(parts):
        n += 1 if i % 2 else (len(_PRE.pre_tokenize_str(part)) if part else 0)
    return n


def prompt_counter(tokenizer_dir: str | None, chat_template: str, append_eos: bool,
                   init_from: str = "scratch", as_text: bool = True) -> PromptCounter | None:
    """The counter for a run's tokenizer: exact for tokenize.tokenizer_dir — or model.init_from when it is a
    local directory that ships a tokenizer (the one tokenize will use) —, a lower bound for the BPE tokenize
    will train; None when the run fine-tunes a registry model (models:/…, champion) without tokenizer_dir (its
    tokenizer is resolved by the tokenize stage, which then checks the records itself)."""
    from packtrain.data.chat import IM_END, IM_START

    if not tokenizer_dir and init_from not in ("scratch", "champion") and not init_from.startswith("models:/"):
        from packtrain.data.tokenizer_files import has_tokenizer

        if has_tokenizer(init_from):
            tokenizer_dir = init_from
    if tokenizer_dir:
        from packtrain.data.chat import control_strings, has_own_template
        from packtrain.data.tokenizer_setup import _document_ids, load_tokenizer, special_tokens_rule

        hf = load_tokenizer(tokenizer_dir)
        prefix, suffix = special_tokens_rule(hf)
        own = chat_template == "auto" and has_own_template(hf)
        return PromptCounter(True, hf, own, _document_ids(prefix, suffix, hf.eos_token_id, append_eos), prefix,
                             append_eos, as_text, control_strings(hf, builtin=not own))
    if init_from != "scratch":
        return None
    from packtrain.data.tokenizer_setup import EOS_TOKEN, PAD_TOKEN

    return PromptCounter(False, append_eos=append_eos, as_text=as_text,
                         strings=(EOS_TOKEN, IM_START, IM_END, PAD_TOKEN))


@dataclass
class RowRules:
    """What the per-document rules need from the run's config (`RowRules.of(cfg)` in the stage runners)."""

    role_order: Literal["alternating", "any"] = "alternating"
    """validate.role_order: "any" turns role_order off."""
    prompt_budget: int | None = None
    """pack.budget: a prompt of ≥ this many tokens cannot share a pack with its answer; None → not checked."""
    tokenizer_dir: str | None = None
    chat_template: str = "auto"
    append_eos: bool = True
    init_from: str = "scratch"
    """tokenize.tokenizer_dir / chat_template / append_eos and model.init_from: which tokenizer counts prompts."""
    long_records: Literal["refuse", "truncate", "split_with_prompt"] = "split_with_prompt"
    """tokenize.long_records: under refuse, record_fits_budget refuses a record longer than prompt_budget."""
    control_text: Literal["as_text", "refuse"] = "as_text"
    """tokenize.control_text: under refuse, control_text refuses a control string typed in a content."""
    _counter: list = field(default_factory=list, repr=False)   # [] until counter() ran, then [counter or None]

    @classmethod
    def of(cls, cfg) -> RowRules:
        """The rules of a RunConfig."""
        return cls(role_order=cfg.validate_.role_order, prompt_budget=cfg.pack.budget,
                   tokenizer_dir=cfg.tokenize.tokenizer_dir, chat_template=cfg.tokenize.chat_template,
                   append_eos=cfg.tokenize.append_eos, init_from=cfg.model.init_from,
                   long_records=cfg.tokenize.long_records, control_text=cfg.tokenize.control_text)

    def counter(self) -> PromptCounter | None:
        """The prompt counter (loaded on first use: only tables with records need it)."""
        if not self._counter:
            self._counter.append(None if self.prompt_budget is None else prompt_counter(
                self.tokenizer_dir, self.chat_template, self.append_eos, self.init_from,
                self.control_text == "as_text"))
        return self._counter[0]

    def checks(self, with_records: bool) -> tuple[str, ...]:
        """The checks that run (ROW_CHECKS order): has_visible_text always; for tables with records also the
        record checks, role_order unless off, prompt_fits_budget when prompts can be counted, template_renders
        when the tokenizer is known (exact), record_fits_budget / control_text when their policy is refuse."""
        if not with_records:
            return ("has_visible_text",)
        counter = self.counter()
        on = {"role_order": self.role_order == "alternating", "prompt_fits_budget": counter is not None,
              "template_renders": counter is not None and counter.exact,
              "record_fits_budget": counter is not None and self.long_records == "refuse",
              "control_text": counter is not None and self.control_text == "refuse"}
        return tuple(c for c in ROW_CHECKS if on.get(c, True))


def row_checks(fmt: str | None, record: object, text: object, rules: RowRules) -> dict[str, str | None]:
    """{check: first problem or None} for every one of ROW_CHECKS; plain-text rows (fmt None/"text") only get
    has_visible_text."""
    out: dict[str, str | None] = dict.fromkeys(RECORD_CHECKS)
    records = fmt is not None and fmt != "text"
    if fmt is not None and fmt != "text":
        out = record_checks(fmt, record)
    out["has_visible_text"] = visible_text_problem(fmt, record, text)
    out["role_order"] = role_order_problem(fmt, record) if records and rules.role_order == "alternating" else None
    out["prompt_fits_budget"] = out["template_renders"] = out["record_fits_budget"] = out["control_text"] = None
    counter = rules.counter() if records else None
    if counter is not None and rules.prompt_budget is not None:
        n, total, failed = counter.probe(fmt, record, total=rules.long_records == "refuse")
        out["template_renders"] = failed
        how = "" if counter.exact else "at least "
        bound = "" if counter.exact else " (a lower bound: pre-tokenizer pieces of the BPE tokenize trains)"
        if rules.long_records == "refuse" and total is not None and total > rules.prompt_budget:
            out["record_fits_budget"] = (f"record of {how}{total:,} tokens is longer than the pack budget "
                                         f"{rules.prompt_budget:,} (tokenize.long_records=refuse){bound}")
        if rules.control_text == "refuse":
            from packtrain.data.chat import typed_controls

            typed = typed_controls(fmt, record, counter.strings)
            out["control_text"] = ("; ".join(typed) + " (tokenize.control_text=refuse)") if typed else None
        if n is not None and n >= rules.prompt_budget:
            out["prompt_fits_budget"] = (
                f"prompt of {how}{n:,} tokens (before the first learned token) does not fit the pack budget "
                f"{rules.prompt_budget:,}" + ("" if counter.exact else
                                              " (a lower bound: pre-tokenizer pieces of the BPE tokenize trains)"))
    return out


def row_problem(fmt: str | None, record: object, text: object, rules: RowRules) -> tuple[str, str] | None:
    """(check, problem) of the first rule a document breaks, or None: what ingest.on_bad_record=skip drops."""
    return next(((c, p) for c, p in row_checks(fmt, record, text, rules).items() if p is not None), None)


def check_columns(formats: list, records: list, texts: list, rules: RowRules,
                  checks: tuple[str, ...]) -> dict[str, list]:
    """{"<check>_problem": [the row's first problem of that kind, or None]} for each of `checks`
    (RowRules.checks): the columns validate's GX suite expects to be null. A record that is not valid JSON
    fails record_shape."""
    out: dict[str, list] = {f"{c}_problem": [] for c in checks}
    for i, text in enumerate(texts):
        fmt = formats[i] if i < len(formats) else None
        rec = records[i] if i < len(records) else None
        if rec is None or fmt in (None, "text"):
            found = row_checks(None, None, text, rules)
        else:
            try:
                found = row_checks(fmt, json.loads(rec), text, rules)
            except (json.JSONDecodeError, TypeError):
                found = {**dict.fromkeys(ROW_CHECKS), "record_shape": "record is not valid JSON"}
        for c in checks:
            out[f"{c}_problem"].append(found[c])
    return out
