"""Before training: can each suite decide? Its minimum detectable effect (MDE) from n and the recorded spread,
against the margin it must resolve (docs/validation.md "Suites that can decide").

    check_power(cfg) -> list[SuitePower]          `packtrain run` calls it before any stage runs

Per suite, with n documents (suite "recent": evaluate.recent_max_documents, else the n of the seed-spread
record; a file suite: its documents, max_documents applied; a task: the record's n, max_documents applied), the
per-document spread doc_sd of the paired difference between two seeds (the record), m suites (Holm's first,
strictest level α/m), α = 1 − confidence and the power of register.promotion.power:

    se  = doc_sd / √n
    MDE = (z(1 − α/m) + z(power)) · se        e.g. doc_sd 0.25 bits/byte, n 64, m 2, 95 %, power 0.8:
                                                (2.241 + 0.842) · 0.25 / 8 = 0.096 bits/byte
    needs n ≥ n · (MDE / margin)²             for MDE ≤ margin

The margin is the suite's (configured, or its seed margin when larger: packtrain.evaluate.promotion.suite_margin);
a primary suite must resolve at least the regression margin of its unit (a superiority margin of 0 can never be
resolved). A suite with MDE > margin is named: a warning (power_check warn), a ConfigError (strict: exit 2,
before any stage runs). Without a record (or a suite it does not cover) the MDE is unknown, and said so; strict
then refuses too, since nothing shows the suite can decide.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from packtrain.errors import ConfigError
from packtrain.evaluate.promotion import SuiteMargin, suite_margin

if TYPE_CHECKING:
    from packtrain.config import RunConfig


@dataclass(kw_only=True)
class SuitePower(SuiteMargin):
    """One suite's preflight: its SuiteMargin (mde, decides: None when unknown, no record for this suite or n
    unknown) from the recorded spread."""

    doc_sd: float | None      # per-document spread of the paired difference (the record)
    need: float               # the margin the MDE must not exceed (primary: at least the regression margin)
    n_needed: int | None      # documents for MDE ≤ need
    n_is_cap: bool = False    # n is only an upper bound (recent without a record: evaluate.recent_max_documents)

    def line(self) -> str:
        unit = "bits/byte" if self.kind == "text" else "accuracy"
        n = "?" if self.n is None else f"≤ {self.n}" if self.n_is_cap else self.n
        if self.decides is None:
            return (f"{self.suite} ({self.role}, n {n}): MDE unknown (no "
                    f"per-document spread recorded for it), margin {self.need:.4f} {unit}")
        verdict = "can decide" if self.decides else f"CANNOT decide (needs n ≥ {self.n_needed})"
        return (f"{self.suite} ({self.role}, n {n}): MDE {self.mde:.4f} {'≤' if self.decides else '>'} margin "
                f"{self.need:.4f} {unit} ({self.margin_source}): {verdict}")

    def to_dict(self) -> dict:
        return asdict(self)


def _task_rows(data_files: dict[str, str]) -> int | None:
    """Rows of a task's test data file (.jsonl lines), else None."""
    for split in ("test", "validation", "train"):
        p = Path(data_files.get(split, ""))
        if p.suffix == ".jsonl" and p.is_file():
            with p.open(encoding="utf-8") as f:
                return sum(1 for line in f if line.strip())
    return None


def suite_sizes(cfg: RunConfig, spread: dict) -> list[tuple[str, str, str, int | None, bool]]:
    """(name, role, kind, n, n is only a cap) of every suite the evaluate stage will score (module doc): before
    the data is read, recent's n without a record is evaluate.recent_max_documents, at most what it scores."""
    from packtrain.evaluate.suite_types import TaskSuite
    from packtrain.evaluate.suites import load_suites

    ev, rec = cfg.evaluate, spread.get("suites") or {}
    out: list[tuple[str, str, str, int | None, bool]] = []
    if ev.recent_role != "off":
        n = ev.recent_max_documents
        if "recent" in rec:
            n = min(n, rec["recent"]["n"]) if n else rec["recent"]["n"]
        out.append(("recent", ev.recent_role, "text", n, "recent" not in rec))
    for s in load_suites(ev):   # a bad suite fails here, before training, as it would at evaluate
        if isinstance(s, TaskSuite):
            n = rec[s.name]["n"] if s.name in rec else _task_rows(s.data_files)
            if n is not None and s.max_documents:
                n = min(n, s.max_documents)
            out.append((s.name, s.role, "task", n, False))
        else:
            out.append((s.name, s.role, "text", len(s.docs), False))
    return out


def power_table(cfg: RunConfig, spread: dict) -> list[SuitePower]:
    """Every suite's SuitePower under `spread` (packtrain.evaluate.seed_spread.resolve_seed_spread)."""
    from packtrain.evaluate.seed_spread import mde

    p = cfg.register_.promotion
    sizes = suite_sizes(cfg, spread)
    rec, k, m = spread.get("suites") or {}, int(spread.get("k") or 0), max(len(sizes), 1)
    margins = {name: suite_margin(role, kind, p, rec.get(name), k) for name, role, kind, *_ in sizes}
    floor = {"text": max([p.epsilon] + [margins[nm][0] for nm, r, kd, *_ in sizes if kd == "text" and r != "primary"]),
             "task": max([p.epsilon_task] + [margins[nm][0] for nm, _, kd, *_ in sizes if kd == "task"])}
    rows = []
    for name, role, kind, n, capped in sizes:
        margin, source = margins[name]
        need = max(margin, floor[kind]) if role == "primary" else margin
        entry = rec.get(name)
        doc_sd = float(entry["doc_sd"]) if entry else None
        row = partial(SuitePower, suite=name, role=role, kind=kind, n=n, margin=margin, margin_source=source,
                      need=need, doc_sd=doc_sd, n_is_cap=capped)
        if doc_sd is None or not n:
            rows.append(row(n_needed=None))
            continue
        e = mde(doc_sd / math.sqrt(n), (1.0 - p.confidence) / m, p.power)
        n_needed = math.ceil(n * (e / need) ** 2) if need > 0 else None
        rows.append(row(mde=e, decides=e <= need, n_needed=n_needed))
    return rows


def check_power(cfg: RunConfig, out: TextIO | None = None) -> list[SuitePower]:
    """The preflight (module doc): prints one line per suite to `out` (stderr), warns about a suite that cannot
    decide; with power_check strict raises ConfigError naming it. power_check off → [] (nothing checked; the
    seed-spread record is still read, so one of another recipe is refused before any stage whatever the mode)."""
    from packtrain.evaluate.seed_spread import resolve_seed_spread

    spread = resolve_seed_spread(cfg)   # another recipe's record: a ConfigError now (exit 2)
    mode = cfg.register_.promotion.power_check
    if mode == "off":
        return []
    out = sys.stderr if out is None else out
    if not spread.get("path") and "this run's config is" in spread.get("note", ""):   # auto, another config
        spread = {**spread, "note": f"{spread['note']}; the evaluation uses it all the same when the champion was "
                                    "trained with the record's config (version tag packtrain.config_hash)"}
    rows = power_table(cfg, spread)
    bad = [r for r in rows if r.decides is False]
    unknown = [r for r in rows if r.decides is None]
    print(f"power check ({100 * cfg.register_.promotion.confidence:g}% family-wise, power "
          f"{cfg.register_.promotion.power:g}; {spread['note']}):", file=out)
    for r in rows:
        print(f"  {r.line()}", file=out)
    if bad:
        print("warning: " + "; ".join(f"suite {r.suite} (n {r.n}) cannot decide: MDE {r.mde:.4f} > margin "
                                      f"{r.need:.4f}, needs n ≥ {r.n_needed}" for r in bad)
              + " — its verdict follows noise (register.promotion.power_check)", file=out)
    if mode == "strict" and (bad or unknown):
        names = ", ".join(f"{r.suite} ({'MDE unknown' if r.decides is None else f'MDE {r.mde:.4f} > {r.need:.4f}'})"
                          for r in bad + unknown)
        raise ConfigError(f"register.promotion.power_check is strict and these suites cannot be shown to decide: "
                          f"{names}; enlarge them (max_documents, recent_max_documents), widen the margin, or set "
                          "power_check to warn")
    return rows

