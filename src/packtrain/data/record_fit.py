"""One table row → the token store documents it becomes, under the run's record policies; and what they did.

Used by packtrain.data.tokenize for tables with records. A row is rendered by packtrain.data.chat
(`encode_row`), checked (`row_problem`: it renders, learns something, its prompt fits the budget), then:

    tokenize.control_text   a control string typed in a content (chat.control_strings): as_text → encoded as plain
                            text by the renderer, the record counted; refuse → the record is a problem
    tokenize.long_records   a record longer than the budget: refuse | truncate | split_with_prompt
                            (packtrain.data.long_records); a record that fits is one document, unchanged

The counts (RecordFit.stats) go to tokenize_result.json, the summary and MLflow; RecordFit.meta to the store's meta.json.
EOS, per row kind: a text row gets the EOS appended (tokenize.append_eos); a record gets it unless its template
wrote the tokenizer's EOS itself (Mistral, Zephyr, Phi-3): `eos_appended_records` / `eos_from_template_records`.
"""

from __future__ import annotations

import json
from array import array

from packtrain.data.chat import control_strings, encode_row, row_problem, typed_controls
from packtrain.data.long_records import fit_record


class RecordFit:
    """Applies the record policies of a TokenizeConfig (`cfg`) row by row; `budget` is pack.budget (None: no
    budget known, records are written whole)."""

    def __init__(self, cfg, budget: int | None, hf, builtin: bool):
        self.cfg, self.budget, self.hf = cfg, budget, hf
        self.as_text = cfg.control_text == "as_text"
        self.strings = control_strings(hf, builtin)
        self.rows_of_docs = array("q")   # the table row of every store document, in order
        self.text_rows = self.record_rows = 0
        self.eos_appended = self.eos_from_template = 0
        self.over_budget = self.split = self.chunks = self.context_tokens = 0
        self.truncated = self.truncated_tokens = 0
        self.control_rows = 0

    def row(self, text, fmt, rec, wrap, prefix, own_template: bool):
        """([(ids, mask)] the row's store documents, None) or ([], the problem)."""
        info: dict = {}
        ids, mask = encode_row(self.hf, fmt, rec, text, wrap, prefix, own_template, self.as_text, info)
        bad = row_problem(ids, mask, fmt, rec, self.budget)
        if bad:
            return [], bad
        if fmt in (None, "text") or rec is None:
            self.text_rows += 1
            return [(ids, mask)], None
        self.record_rows += 1
        typed = typed_controls(fmt, json.loads(rec), self.strings)
        if typed:
            if not self.as_text:
                return [], "; ".join(typed) + " (tokenize.control_text=refuse; as_text encodes it as plain text)"
            self.control_rows += 1
        closed = bool(info.get("closed"))
        self.eos_from_template += closed
        self.eos_appended += bool(self.cfg.append_eos and self.hf.eos_token_id is not None and not closed)
        if self.budget is None or len(ids) <= self.budget:
            return [(ids, mask)], None
        fitted = fit_record(ids, mask, self.budget, self.cfg.long_records)
        if fitted.problem:
            return [], fitted.problem
        self.over_budget += 1
        if self.cfg.long_records == "truncate":
            self.truncated += 1
        else:
            self.split += 1
            self.chunks += len(fitted.docs)
            self.context_tokens += fitted.context_tokens
        self.truncated_tokens += fitted.truncated_tokens
        return fitted.docs, None

    def hint(self) -> str:
        """What the error adds about the record policies."""
        return (f". Records longer than pack.budget follow tokenize.long_records={self.cfg.long_records}; control "
                f"strings typed in content follow tokenize.control_text={self.cfg.control_text}")

    def meta(self) -> dict:
        return {"long_records": self.cfg.long_records, "control_text": self.cfg.control_text,
                "record_budget": self.budget}

    def stats(self) -> dict:
        """The TokenizeStats fields of the record policies."""
        return dict(text_rows=self.text_rows, record_rows=self.record_rows,
                    eos_appended_records=self.eos_appended, eos_from_template_records=self.eos_from_template,
                    long_records=self.cfg.long_records, record_budget=self.budget, records_over_budget=self.over_budget,
                    records_split=self.split, split_chunks=self.chunks, split_context_tokens=self.context_tokens,
                    records_truncated=self.truncated, record_truncated_tokens=self.truncated_tokens,
                    control_text=self.cfg.control_text, control_text_records=self.control_rows)
