"""The evaluate stage's progress over its suites: one tqdm bar "evaluate" per (model, suite), in documents.

    evaluate:  30%|███       | 60/200 [00:05<00:12, 11.20doc/s, suite=wordorder (challenger) 2/4]

A text suite counts its documents as their forwards finish (docscore.score_packed's `on_docs`), a task suite its
items as lm-eval's requests return (tasks.counting_lm); `2/4` is the (model, suite) pair among all the stage
scores (2 models × 2 suites here), so the whole stage's remaining work shows too. On a terminal `packtrain
evaluate` shows the bar itself; `packtrain run` turns it into its progress lines (packtrain.pipeline.progress):

    [6/7] evaluate  docs 60/200 (30%) · suite wordorder (challenger) 2/4 · 11.2 docs/s · 0:05 elapsed · ETA 0:12
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator


class SuiteBar:
    """Hands out one bar per (model, suite) in scoring order; `pairs`: how many the stage scores."""

    def __init__(self, pairs: int):
        self.pairs, self.k = pairs, 0

    @contextlib.contextmanager
    def suite(self, name: str, model: str, total: int | None) -> Iterator[Callable[..., None]]:
        """A bar for suite `name` of model `model` (`total` documents; None: known at the first update);
        yields `advance(done, total=None)`: `done` documents of the suite are scored."""
        from tqdm import tqdm

        self.k += 1
        bar = tqdm(total=total, desc="evaluate", unit="doc", file=sys.stderr, disable=False, dynamic_ncols=True)
        bar.set_postfix(suite=f"{name} ({model}) {self.k}/{self.pairs}", refresh=False)

        def advance(done: int, n: int | None = None) -> None:
            if n is not None and bar.total != n:
                bar.total = n
            if done > bar.n:
                bar.update(done - bar.n)

        try:
            yield advance
        finally:
            bar.close()
