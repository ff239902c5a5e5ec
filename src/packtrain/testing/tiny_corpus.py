"""A tiny real-text corpus and the tiny-cpu settings that make a whole pipeline run take seconds of compute.

    tiny_corpus(folder)            60 .txt documents of 10–1000 words (lognormal, median ~90), deterministic
    tiny_settings(workdir, corpus) --set overrides of the tiny-cpu recipe for that corpus: ~30k tokens, 2 train
                                   steps, 1 eval batch, 3 samples of 4 tokens

Used by the pipeline tests and by the gate-noise benchmark (which repeats the gate test's runs).
"""

from __future__ import annotations

import random
from pathlib import Path

# Words of real English/Python prose with a long tail: documents of lognormal length (median ~90 words).
_WORDS = ("the of and to in is that for it as with was on be by this are or from at which not have an but "
          "function returns value list string object module class method argument default error file data "
          "token model train pack budget document attention memory loss step batch rank device").split()


def tiny_corpus(folder: Path, n_docs: int = 60, seed: int = 0) -> Path:
    """`n_docs` unique .txt documents (one per file) of 10–1000 words; deterministic for a seed."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_docs):
        n = min(1000, int(rng.lognormvariate(4.5, 0.9)) + 10)
        words = [rng.choice(_WORDS) for _ in range(n)]
        (folder / f"doc{i:03d}.txt").write_text(f"Document {i}. " + " ".join(words) + ".\n", encoding="utf-8")
    return folder


def tiny_settings(workdir: Path, corpus: Path) -> list[str]:
    """--set overrides of the tiny-cpu recipe: ~30k tokens, 2 train steps, 1 eval batch, 3 samples of 4
    tokens (3 × 32 greedy tokens were ~1–2 s of every evaluate), no eval suites beyond "recent" (the shipped
    lm-eval task was ~15 s of every evaluate on 2 cores: `WORDORDER_SUITE` adds it back where a test needs it)."""
    return [
        f"workdir={workdir}", f"ingest.source={corpus}", "validate.min_rows=10",
        "tokenize.vocab_size=300", "tokenize.train_chars=60000", "tokenize.eval_fraction=0.2",
        "tokenize.workers=1", "pack.budget=64", "train.rows=2", "train.max_steps=2", "train.warmup_steps=1",
        "evaluate.rows=2", "evaluate.max_batches=1", "evaluate.sample_tokens=4", "tracking.system_metrics=false",
        "evaluate.suites=[]",
    ]


WORDORDER_SUITE = "evaluate.suites=[{name: wordorder, role: task, path: '@recipes/tasks/wordorder/wordorder.yaml'}]"
"""The tiny-cpu recipe's own suite (the shipped lm-eval task), as a --set after `tiny_settings`."""
