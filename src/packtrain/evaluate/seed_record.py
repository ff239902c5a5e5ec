"""The seed-spread record built from the evaluate outputs of k runs that differ only in `train.seed`
(packtrain.evaluate.seed_spread says what it holds and how the decision uses it; `python -m bench seed-spread`
runs the seeds and writes it).

    spread_record(cfg, seeds, eval_dirs) -> {"recipe", "config_hash", "seeds", "k", "suites": {name: {...}}}
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from packtrain.errors import ConfigError, InputDataError, MissingDataError
from packtrain.evaluate.seed_spread import UNITS, recipe_hash

if TYPE_CHECKING:
    from packtrain.config import RunConfig


def _suite_docs(eval_dir: Path) -> dict[str, dict]:
    """{suite: {"kind", "docs": {doc_id: (nll, bytes) | acc}}} of the challenger in an evaluate output."""
    import pyarrow.parquet as pq

    from packtrain.evaluate.paired_scores import SCORES_FILE

    path = Path(eval_dir) / SCORES_FILE
    if not path.is_file():
        raise MissingDataError(f"{path} does not exist: the seed's evaluate stage did not write its suite scores")
    t = pq.read_table(path).to_pydict()
    out: dict[str, dict] = {}
    for i, suite in enumerate(t["suite"]):
        if t["model"][i] != "challenger":
            continue
        s = out.setdefault(suite, {"kind": t["kind"][i], "docs": {}})
        s["docs"][t["doc_id"][i]] = (t["nll"][i], t["bytes"][i]) if t["kind"][i] == "text" else t["acc"][i]
    return out


def _metric(kind: str, docs: dict, ids: list) -> float:
    if kind == "text":
        return sum(docs[d][0] for d in ids) / (math.log(2.0) * sum(docs[d][1] for d in ids))
    return sum(docs[d] for d in ids) / len(ids)


def _pair_doc_sd(kind: str, a: dict, b: dict, ids: list) -> float:
    """Per-document sd of the paired difference b − a in the metric's unit: for bits/byte the ratio estimator
    linearized, u_d = (Δnll_d − Δ·ln2·bytes_d) / (ln2 · mean bytes), so that se(Δ) = sd(u) / √n."""
    import numpy as np

    if kind == "text":
        dn = np.array([b[d][0] - a[d][0] for d in ids], np.float64)
        by = np.array([a[d][1] for d in ids], np.float64) * math.log(2.0)
        delta = dn.sum() / by.sum()
        u = (dn - delta * by) / by.mean()
    else:
        u = np.array([a[d] - b[d] for d in ids], np.float64)
    return float(u.std(ddof=1)) if len(u) > 1 else 0.0


def spread_from_evaluations(eval_dirs: list[Path]) -> dict[str, dict]:
    """Per suite: n, the metric of every seed, its mean and sd (ddof 1), doc_sd (module doc). Every seed must have
    scored the same documents of a suite (same data, same suites: only the seed differs)."""
    import numpy as np

    if len(eval_dirs) < 3:
        raise ConfigError(f"a seed-spread record needs at least 3 seeds (got {len(eval_dirs)}): the margin's "
                          "t quantile has k − 1 degrees of freedom, and t(0.95, 1) = 6.3 is no estimate")
    per = [_suite_docs(d) for d in eval_dirs]
    out: dict[str, dict] = {}
    for suite in per[0]:
        kind = per[0][suite]["kind"]
        ids = sorted(per[0][suite]["docs"])
        for k, p in enumerate(per[1:], 1):
            if suite not in p or sorted(p[suite]["docs"]) != ids:
                raise InputDataError(f"{eval_dirs[k]}: suite {suite!r} was not scored on the same documents as in "
                                     f"{eval_dirs[0]}: the seeds' runs must differ only in train.seed")
        docs = [p[suite]["docs"] for p in per]
        values = [_metric(kind, d, ids) for d in docs]
        pair_vars = [_pair_doc_sd(kind, docs[i], docs[j], ids) ** 2
                     for i in range(len(docs)) for j in range(i + 1, len(docs))]
        out[suite] = {"kind": kind, "unit": UNITS[kind], "n": len(ids), "values": [round(v, 6) for v in values],
                      "mean": round(float(np.mean(values)), 6), "sd": round(float(np.std(values, ddof=1)), 6),
                      "doc_sd": round(math.sqrt(float(np.mean(pair_vars))), 6)}
    return out


def spread_record(cfg: RunConfig, seeds: list[int], eval_dirs: list[Path]) -> dict:
    """The record's own fields (module doc) from the evaluate outputs of `seeds`' runs of `cfg`'s recipe."""
    return {"recipe": cfg.name, "config_hash": recipe_hash(cfg), "seeds": list(seeds), "k": len(seeds),
            "suites": spread_from_evaluations(eval_dirs)}
