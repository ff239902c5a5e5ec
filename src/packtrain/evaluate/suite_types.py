"""The suite data types (a document's pieces, text and task suites), below everything that builds or scores them:
packtrain.evaluate.suites reads files into them, .perturb transforms them, .tasks scores TaskSuites."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Piece:
    text: str
    scored: bool


@dataclass(frozen=True)
class SuiteDoc:
    """One document: its id within the suite and its pieces."""

    doc_id: str
    pieces: tuple[Piece, ...]

    @property
    def n_bytes(self) -> int:
        """UTF-8 bytes of the scored pieces."""
        return sum(len(p.text.encode("utf-8")) for p in self.pieces if p.scored)


@dataclass
class SuiteSource:
    """What every suite has: its name and role, the file it is read from and that file's md5."""

    name: str
    role: Literal["primary", "regression", "task"]
    path: str                      # text: resolved file ("" for recent: the eval packs dir); task: the task YAML
    md5: str                       # text: DVC md5 of the file (recent: of the eval packs); task: over the YAML and
                                   # its data files


@dataclass
class TextSuite(SuiteSource):
    """Held-out documents scored by per-document negative log-likelihood."""

    docs: list[SuiteDoc]
    n_total: int                   # documents in the file (docs may be its first max_documents)
    perturb: dict | None = None    # {"kind", "rate", "seed"} of a robustness probe
    kind: Literal["text"] = "text"

    def describe(self) -> dict:
        return {"name": self.name, "role": self.role, "kind": self.kind, "path": self.path, "md5": self.md5,
                "n": len(self.docs), "n_total": self.n_total, "perturb": self.perturb}


@dataclass
class TaskSuite(SuiteSource):
    """An lm-evaluation-harness task on local files, scored per document (acc) by packtrain.evaluate.tasks."""

    task: str                      # the task name lm-eval knows it by
    data_files: dict[str, str] = field(default_factory=dict)
    max_documents: int | None = None
    kind: Literal["task"] = "task"

    def describe(self) -> dict:
        return {"name": self.name, "role": self.role, "kind": self.kind, "path": self.path, "md5": self.md5,
                "task": self.task, "data_files": self.data_files, "max_documents": self.max_documents}


Suite = TextSuite | TaskSuite
