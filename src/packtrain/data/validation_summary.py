"""What validate found, in brief (`ValidationSummary`), in a module of its own with no heavy import: the full
report (packtrain.data.validate.ValidationReport, report.json) and the validate stage's record
(packtrain.stages.results.ValidateResult) both extend it — one field list, not two."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ValidationSummary:
    """The suite's verdict on one documents table and where its report is."""

    success: bool
    documents: int
    input: str                                # the documents table read
    report: str                               # path of report.json
    data_docs: str | None                     # Data Docs index.html (None: GX built none)
    failed: list[str]                         # names of failed expectations
    contamination: dict | None = None
    """packtrain.data.contamination_check.check_table: every contaminated document (None: check off); the stage's
    record adds `dropped` (the doc_ids left out under policy drop)."""
