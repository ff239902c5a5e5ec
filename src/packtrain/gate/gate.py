"""`evaluate_gate(candidate, baseline, rules) -> GateResult`: fail CI when a candidate run regresses.

    >>> base = MetricSource("file base.json", {"pack.fill": 0.995, "train.throughput.real_tokens_per_s": 8e4})
    >>> cand = MetricSource("run 1a2b", {"pack.fill": 0.81, "train.throughput.real_tokens_per_s": 8.1e4})
    >>> r = evaluate_gate(cand, base)
    >>> [(row.metric, row.verdict) for row in r.rows], r.exit_code
    ([('pack.fill', 'regression'), ('train.throughput.real_tokens_per_s', 'pass')], 1)

Which rules: a rules file's metrics, plus (unless it says `use_default_patterns: false`) the built-in
rules — for runs the noise-aware rules of the device kind the runs' `packtrain.gpu` tag names
(packtrain.gate.noise), for metrics files the glob patterns. Like with like: a candidate and a baseline
that ran on different devices (cpu vs NVIDIA H200, H100 vs H200) get a `device` row with verdict missing
(exit 2): their throughput says nothing about a regression.

Exit codes: 0 pass, 1 regression, 2 missing data (a required metric or run is absent; it wins over 1 because
a gate that could not check everything has not passed). Several candidates (repeats) are combined per
metric: each run's value (its history aggregated by the rule) then the median over runs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packtrain.errors import PacktrainError
from packtrain.gate.metric_sources import MetricSource, aggregate_values
from packtrain.gate.noise import device_kind
from packtrain.gate.rules import Rule, Rules, default_rules
from packtrain.publish import atomic_write_text, write_json

__all__ = ["GateFailed", "GateRow", "GateResult", "evaluate_gate", "gate", "write_gate_outputs", "default_rules",
           "MetricSource"]

PASS, REGRESSION, MISSING = "pass", "regression", "missing"


@dataclass
class GateRow:
    metric: str
    baseline: float | None
    candidate: float | None
    change: float | None        # relative (candidate − baseline) / |baseline|; ±inf when the baseline is 0
    rule: str
    verdict: str                # pass | regression | missing
    reason: str = ""


@dataclass
class GateResult:
    candidate: str
    baseline: str
    rules: str
    rows: list[GateRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the reader must know besides the rows (e.g. "same model as the champion ...")."""

    @property
    def regressions(self) -> list[GateRow]:
        return [r for r in self.rows if r.verdict == REGRESSION]

    @property
    def missing(self) -> list[GateRow]:
        return [r for r in self.rows if r.verdict == MISSING]

    @property
    def exit_code(self) -> int:
        return 2 if self.missing else (1 if self.regressions else 0)

    @property
    def verdict(self) -> str:
        return {0: "PASS", 1: "REGRESSION", 2: "MISSING DATA"}[self.exit_code]

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "candidate": self.candidate,
                "baseline": self.baseline, "rules": self.rules, "notes": self.notes,
                "regressions": [r.metric for r in self.regressions], "missing": [r.metric for r in self.missing],
                "rows": [{k: (_json_num(v) if isinstance(v, float) else v) for k, v in asdict(r).items()}
                         for r in self.rows]}

    def _cells(self) -> list[list[str]]:
        return [[r.metric, _num(r.baseline), _num(r.candidate), _change(r.change), r.rule,
                 r.verdict.upper() if r.verdict != PASS else PASS] + ([r.reason] if r.reason else [""])
                for r in self.rows]

    def table(self) -> str:
        """Fixed-width table: metric, baseline, candidate, change, rule, verdict (+ why)."""
        head = ["metric", "baseline", "candidate", "change", "rule", "verdict", "why"]
        cells = self._cells()
        widths = [max(len(head[i]), *(len(c[i]) for c in cells)) if cells else len(head[i]) for i in range(7)]
        line = lambda row: "  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip()  # noqa: E731
        out = [f"gate: {self.verdict}  candidate {self.candidate}  vs  baseline {self.baseline}  "
               f"(rules: {self.rules})", line(head), line(["-" * w for w in widths])]
        out += [line(c) for c in cells]
        if not cells:
            out.append("(no metric matched a rule)")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    def markdown(self) -> str:
        icon = {0: "✅", 1: "❌", 2: "⚠️"}[self.exit_code]
        out = [f"## {icon} packtrain gate: {self.verdict}", "",
               f"- candidate: `{self.candidate}`", f"- baseline: `{self.baseline}`", f"- rules: `{self.rules}`", "",
               "| metric | baseline | candidate | change | rule | verdict | why |",
               "|---|---:|---:|---:|---|---|---|"]
        for c in self._cells():
            verdict = f"**{c[5]}**" if c[5] != PASS else c[5]
            out.append(f"| `{c[0]}` | {c[1]} | {c[2]} | {c[3]} | {c[4]} | {verdict} | {c[6]} |")
        out += ([""] + [f"> **Note:** {n}" for n in self.notes]) if self.notes else []
        return "\n".join(out) + "\n"


def _json_num(v: float):
    return None if v is None or math.isnan(v) else (str(v) if math.isinf(v) else v)


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.6g}"


def _change(v: float | None) -> str:
    """The relative change as a percentage; from a baseline of 0 there is none: "new (was 0)".

    >>> _change(0.0123), _change(float("inf")), _change(None)
    ('+1.23%', 'new (was 0)', '–')
    """
    if v is None:
        return "–"
    if math.isinf(v):
        return "new (was 0)"
    return f"{100 * v:+.2f}%"


def combined_value(sources: list[MetricSource], name: str, aggregate: str) -> float | None:
    """One value per source (history aggregated), then combined over sources (median for `last`)."""
    vals = [v for s in sources if (v := s.value(name, aggregate)) is not None]
    if not vals:
        return None
    if len(vals) == 1:
        return vals[0]
    return statistics.median(vals) if aggregate == "last" else aggregate_values(vals, aggregate)


def check(rule: Rule, base: float | None, cand: float) -> tuple[str, float | None, str]:
    """(verdict, relative change, reason) of one metric under one rule."""
    change = None
    if base is not None:
        diff = cand - base
        change = diff / abs(base) if base else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    if rule.min is not None and cand < rule.min:
        return REGRESSION, change, f"below floor {rule.min:g}"
    if rule.max is not None and cand > rule.max:
        return REGRESSION, change, f"above ceiling {rule.max:g}"
    if change is None:
        return PASS, None, ""
    assert base is not None   # change is None without a baseline
    regressed = _relative_regression(rule, change)
    if regressed and math.isinf(change):   # from 0 no percentage means anything: say what the numbers are
        regressed = f"{'rose' if change > 0 else 'fell'} to {cand:.4g} from 0 (new: the baseline was 0)"
    diff = cand - base
    if abs(diff) <= rule.abs_tol:   # a large relative change of a tiny number: said, so a pass is not a puzzle
        return PASS, change, f"|Δ| {abs(diff):.3g} ≤ {rule.abs_tol:g} absolute" if regressed else ""
    return (REGRESSION, change, regressed) if regressed else (PASS, change, "")


def _relative_regression(rule: Rule, change: float) -> str:
    """Why `change` breaks the rule's relative bound ("dropped 9.1% > 5%"), "" when it does not."""
    if rule.direction == "higher" and rule.max_drop is not None and -change > rule.max_drop + 1e-12:
        return f"dropped {_pct(-change)} > {_pct(rule.max_drop)}"
    if rule.direction == "lower" and rule.max_rise is not None and change > rule.max_rise + 1e-12:
        return f"rose {_pct(change)} > {_pct(rule.max_rise)}"
    if rule.direction == "equal" and abs(change) > rule.tolerance + 1e-12:
        return f"changed {_pct(abs(change))} (must equal the baseline)"
    return ""


def _pct(x: float) -> str:
    return "inf" if math.isinf(x) else f"{100 * x:.3g}%"


def evaluate_gate(candidate: MetricSource | list[MetricSource], baseline: MetricSource,
                  rules: Rules | None = None) -> GateResult:
    """Compare candidate metrics with the baseline under `rules` (default: the built-in rules).

    Gated metrics: every metric the rules list by name (required), plus every baseline metric a built-in
    rule covers (noise-aware rules of the device kind for runs; glob patterns for metrics files). Several
    candidates are repeats (per metric: the median of their values). Rows are sorted by metric name."""
    cands = candidate if isinstance(candidate, list) else [candidate]
    rules = (rules or default_rules()).for_device(_device_kind(cands, baseline))
    cand_label = cands[0].label if len(cands) == 1 else f"{len(cands)} runs: " + ", ".join(c.label for c in cands)
    result = GateResult(candidate=cand_label, baseline=baseline.label, rules=rules.source)
    mismatch = _device_mismatch(cands, baseline)
    if mismatch:
        result.rows.append(GateRow("device", None, None, None, "same device", MISSING, mismatch))
    names = {n for n, r in rules.exact.items() if r.required or n in baseline.metrics}
    if baseline.scheme != "packtrain":   # canonical run metrics have their rules; patterns are for files
        names |= {m for m in baseline.metrics if m not in rules.exact and rules.rule_for(m) is not None}
    for name in sorted(names):
        rule = rules.rule_for(name)
        assert rule is not None   # names holds only metrics with a rule
        base = baseline.value(name, rule.aggregate)
        cand = combined_value(cands, name, rule.aggregate)
        if cand is None or (base is None and rule.relative):
            where = " and ".join(w for w, v in (("candidate", cand), ("baseline", base)) if v is None)
            result.rows.append(GateRow(name, base, cand, None, rule.describe(), MISSING,
                                       f"not in the {where}"))
            continue
        verdict, change, reason = check(rule, base, cand)
        result.rows.append(GateRow(name, base, cand, change, rule.describe(), verdict, reason))
    same = same_model_note(cands, baseline)
    if same:
        result.notes.append(same)
    return result


def same_model_note(cands: list[MetricSource], baseline: MetricSource) -> str:
    """"same model as the champion …" when every candidate's model is the baseline's (one training run, or a
    cached copy of it): the gate then compares a model with itself, and only run-to-run noise can differ."""
    if not baseline.model_id or not all(c.model_id == baseline.model_id for c in cands):
        return ""
    what = ("the champion" if baseline.ref and baseline.ref.endswith("@champion")
            else baseline.ref or "the baseline")
    return (f"same model as {what}: the candidate's training run is {baseline.model_id[:8]}, the one "
            f"{'it was registered from' if baseline.ref else 'the baseline is'} (restored from the stage cache or "
            "the same run): this compares a model with itself")


gate = evaluate_gate
"""The historical name of `evaluate_gate`."""


def _device_kind(cands: list[MetricSource], baseline: MetricSource) -> str:
    """"cpu" when any side ran on a CPU, "gpu" otherwise (also for metrics files without a device)."""
    kinds = {device_kind(s.device) for s in [*cands, baseline]}
    return "cpu" if "cpu" in kinds else "gpu"


def _device_mismatch(cands: list[MetricSource], baseline: MetricSource) -> str:
    """Why candidate and baseline are not comparable ("" when they are or a device is unknown)."""
    other = sorted({c.device for c in cands if c.device and baseline.device and c.device != baseline.device})
    if not other:
        return ""
    return (f"baseline ran on {baseline.device}, candidate on {', '.join(other)}: throughput and utilization "
            "are not comparable; gate against a baseline from the same device")


class GateFailed(PacktrainError):
    """A gate that did not pass where passing was required (a scheduled run against the champion):
    exit 1 on a regression, 2 on missing data, like `packtrain gate`."""

    def __init__(self, message: str, result_exit_code: int):
        super().__init__(message, exit_code=result_exit_code)


def write_gate_outputs(result: GateResult, out_dir: Path) -> tuple[Path, Path]:
    """out_dir/gate.json (machine-readable) and out_dir/gate.md (a CI job summary / PR comment)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath, mpath = out_dir / "gate.json", out_dir / "gate.md"
    write_json(jpath, result.to_dict())
    atomic_write_text(mpath, result.markdown())
    return jpath, mpath
