"""The robustness probe: a seeded perturbation of a text suite, loaded as a suite like any other."""

from __future__ import annotations

import json

import pytest

from packtrain.config import load_run_config
from packtrain.evaluate.suites import load_suites


@pytest.mark.parametrize("kind", ["case", "whitespace", "chars"])
def test_perturbed_suite_is_seeded_and_recorded(kind, tmp_path):
    f = tmp_path / "held.jsonl"
    f.write_text("".join(json.dumps({"text": f"The cat number {i} sat on the mat."}) + "\n" for i in range(20)))

    def load(rate, seed):
        cfg = load_run_config("tiny-cpu", ["tracking.enabled=false", f"evaluate.suites=[{{name: noisy, role: regression, "
                                           f"path: {f}, perturb: {{kind: {kind}, rate: {rate}, seed: {seed}}}}}]"])
        return load_suites(cfg.evaluate)[0]

    a, b, c, same = load(0.3, 0), load(0.3, 0), load(0.3, 1), load(0.0, 0)
    text = [d.pieces[0].text for d in a.docs]
    assert text == [d.pieces[0].text for d in b.docs] != [d.pieces[0].text for d in c.docs]
    assert [d.pieces[0].text for d in same.docs] == [f"The cat number {i} sat on the mat." for i in range(20)]
    assert a.perturb == {"kind": kind, "rate": 0.3, "seed": 0} and a.role == "regression" and a.n_total == 20
    assert [d.n_bytes for d in a.docs] == [len(t.encode()) for t in text]   # bytes after the perturbation
