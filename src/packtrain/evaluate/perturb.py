"""Robustness probe: a seeded perturbation of a text suite's documents (evaluate.suites[i].perturb).

    kind        what changes (each with probability `rate`)                 "The cat sat." at rate 1
    case        a letter's case flips                                       "tHE CAT SAT."
    whitespace  a space becomes two spaces or a newline (a second draw)     e.g. "The  cat\\nsat."
    chars       a letter or digit becomes its code point ± 1 (a second      e.g. "Sif bbu ras."
                draw), kept printable ASCII

Every piece (scored or context) is perturbed with one generator seeded by (seed, document index), so the
perturbed suite is the same for both models and every run; its bytes are counted after perturbation. The
perturbed suite is a suite like any other: give it role regression ("must not get worse on noisy input").
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from packtrain.evaluate.suite_types import SuiteDoc


def perturb_text(text: str, kind: str, rate: float, rng: np.random.Generator) -> str:
    """One text perturbed (module doc).

    >>> perturb_text("The cat sat.", "case", 1.0, np.random.default_rng(0))
    'tHE CAT SAT.'
    >>> perturb_text("abc", "chars", 0.0, np.random.default_rng(0))
    'abc'
    """
    chars = list(text)
    draw = rng.random(len(chars))
    alt = rng.random(len(chars))
    for i, c in enumerate(chars):
        if draw[i] >= rate:
            continue
        if kind == "case" and c.isalpha():
            chars[i] = c.swapcase()
        elif kind == "whitespace" and c == " ":
            chars[i] = "  " if alt[i] < 0.5 else "\n"
        elif kind == "chars" and c.isascii() and c.isalnum():
            o = ord(c) + (1 if alt[i] < 0.5 else -1)
            chars[i] = chr(min(max(o, 33), 126))
    return "".join(chars)


def perturb_docs(docs: list[SuiteDoc], kind: str, rate: float, seed: int) -> list[SuiteDoc]:
    """The documents with every piece perturbed, seeded per document (module doc)."""
    from packtrain.evaluate.suite_types import Piece, SuiteDoc

    out = []
    for k, d in enumerate(docs):
        rng = np.random.default_rng([int(seed), k, zlib.crc32(kind.encode())])
        out.append(SuiteDoc(d.doc_id, tuple(Piece(perturb_text(p.text, kind, rate, rng), p.scored) for p in d.pieces)))
    return out
