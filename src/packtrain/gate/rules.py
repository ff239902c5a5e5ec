"""Per-metric gate rules: direction, allowed relative change, absolute floor/ceiling, aggregation.

A rules file (YAML or JSON) names metrics exactly, by the canonical names of packtrain.gate.metrics for runs:

    defaults:               # for listed metrics that leave a field out
      max_drop: 0.05
      max_rise: 0.05
    metrics:
      pack.fill:                          {direction: higher, max_drop: 0.002, min: 0.99}
      train.throughput.real_tokens_per_s: {direction: higher, max_drop: 0.05}
      train.memory.peak_alloc_gib:        {direction: lower, max_rise: 0.05, max: 70}
      train.throughput.padding:          {direction: lower, max_rise: 0.25, abs_tol: 0.001}
    use_default_patterns: false   # true: the built-in rules also gate every other metric they cover

    higher  regression when (baseline − candidate) / |baseline| > max_drop
    lower   regression when (candidate − baseline) / |baseline| > max_rise
    equal   regression when |candidate − baseline| > tolerance · |baseline|
    min/max absolute floor/ceiling on the candidate, checked whatever the baseline says
    abs_tol changes smaller than this are never regressions (noise floor for values near zero)
    max_drop: null / max_rise: null   only the absolute bounds apply (no baseline needed)
    aggregate  last | median | mean | min | max over a metric's history (MLflow steps) or a list in a
               JSON file; over several candidate runs the per-run values are combined the same way
               (`last` → median of the runs)

Listed metrics are required: missing on either side is "missing data" (exit 2). Built-in rules gate a
metric when the baseline has it; a candidate lacking one is missing data as well. The built-in rules are
noise-aware for the canonical names of docs/metrics.md (packtrain.gate.noise: thresholds from the recorded
run-to-run noise of the device kind, e.g. CPU utilization only reported) and glob patterns for metrics
files; on runs (canonical names) the patterns do not apply. `use_default_patterns: false` turns both off.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from packtrain.config.base import StrictModel
from packtrain.config.messages import format_validation_error
from packtrain.errors import ConfigError
from packtrain.gate.metrics import BY_NAME
from packtrain.gate.noise import ALWAYS_REPORT_ONLY, GATED, NOISE, NOISE_FILES, REPORTED, allowance

Direction = Literal["higher", "lower", "equal"]
Aggregate = Literal["last", "median", "mean", "min", "max"]


@dataclass(frozen=True)
class Rule:
    metric: str                       # exact name, or a glob pattern for built-in rules
    direction: Direction
    max_drop: float | None = None     # higher-is-better: allowed relative drop
    max_rise: float | None = None     # lower-is-better: allowed relative rise
    tolerance: float = 0.0            # equal: allowed relative difference
    min: float | None = None          # absolute floor on the candidate
    max: float | None = None          # absolute ceiling on the candidate
    aggregate: Aggregate = "last"
    abs_tol: float = 0.0
    required: bool = True
    note: str = ""                    # why the rule is as it is, e.g. "cpu noise 12%" (rule column)

    @property
    def relative(self) -> bool:
        """Whether the rule compares with the baseline (else only the absolute bounds apply)."""
        return (self.direction == "higher" and self.max_drop is not None) or \
            (self.direction == "lower" and self.max_rise is not None) or self.direction == "equal"

    def describe(self) -> str:
        """'drop ≤ 5%, ≥ 0.99', 'rise ≤ 2%', 'rise ≤ 10% or 0.01 absolute', '= baseline' — the rule column of the
        gate table: the effective threshold, the absolute allowance included."""
        parts = []
        # a change within abs_tol passes whatever its relative size (tiny baselines): the effective threshold says so
        absolute = f" or {self.abs_tol:g} absolute" if self.abs_tol else ""
        if self.direction == "higher" and self.max_drop is not None:
            parts.append(f"drop ≤ {_pct(self.max_drop)}{absolute}")
        elif self.direction == "lower" and self.max_rise is not None:
            parts.append(f"rise ≤ {_pct(self.max_rise)}{absolute}")
        elif self.direction == "equal":
            parts.append(("= baseline" if not self.tolerance else f"within ±{_pct(self.tolerance)}") + absolute)
        if self.min is not None:
            parts.append(f"≥ {self.min:g}")
        if self.max is not None:
            parts.append(f"≤ {self.max:g}")
        if self.aggregate != "last":
            parts.append(self.aggregate)
        text = ", ".join(parts) or "report only"
        return f"{text} ({self.note})" if self.note else text


def _pct(x: float) -> str:
    return f"{100 * x:g}%"


# Built-in patterns (first match wins), for metrics files (bench JSON, ci_gate) and names outside
# docs/metrics.md. Noisy throughput metrics use the median of their history/repeats.
DEFAULT_PATTERNS: tuple[Rule, ...] = (
    Rule("*fill*", "higher", max_drop=0.005, required=False),
    Rule("*padding*", "lower", max_rise=0.05, abs_tol=1e-3, required=False),
    Rule("*tokens_per_s*", "higher", max_drop=0.05, aggregate="median", required=False),
    Rule("*tok_per_s*", "higher", max_drop=0.05, aggregate="median", required=False),
    Rule("*mfu*", "higher", max_drop=0.05, aggregate="median", required=False),
    Rule("*utilization*", "higher", max_drop=0.05, aggregate="median", required=False),
    Rule("*fragmentation*", "lower", max_rise=0.10, abs_tol=0.01, required=False),
    Rule("*peak*gib*", "lower", max_rise=0.05, required=False),
    Rule("*memory*gib*", "lower", max_rise=0.05, required=False),
    Rule("*step_time*", "lower", max_rise=0.05, aggregate="median", required=False),
    Rule("*data_wait*", "lower", max_rise=0.10, abs_tol=0.01, aggregate="median", required=False),
)


@dataclass
class Rules:
    """Exact rules (listed in a file: required) + built-in rules: the noise-aware defaults of the device
    kind for the canonical names (packtrain.gate.noise, `builtin`) and the glob patterns (metrics files)."""

    exact: dict[str, Rule] = field(default_factory=dict)
    patterns: tuple[Rule, ...] = DEFAULT_PATTERNS
    source: str = "built-in defaults"
    builtin: bool = True
    device_kind: str | None = None     # set by for_device: whose noise-aware defaults are in `exact`

    def rule_for(self, metric: str) -> Rule | None:
        if metric in self.exact:
            return self.exact[metric]
        for r in self.patterns:
            if fnmatch.fnmatchcase(metric, r.metric):
                return Rule(**{**r.__dict__, "metric": metric})
        return None

    def for_device(self, kind: str) -> Rules:
        """These rules with the built-in noise-aware rules of device kind `kind` ("cpu" | "gpu") added under
        the exact ones (a rules file's own entry wins)."""
        if not self.builtin or self.device_kind is not None:
            return self
        label = f"{self.source}; {kind} noise: {NOISE_FILES[kind]}"
        return Rules(exact={**noise_rules(kind), **self.exact}, patterns=self.patterns, source=label,
                     builtin=True, device_kind=kind)


class _RuleSpec(StrictModel):
    direction: Direction | None = None
    max_drop: float | None = Field(None, ge=0)
    max_rise: float | None = Field(None, ge=0)
    tolerance: float = Field(0.0, ge=0)
    min: float | None = None
    max: float | None = None
    aggregate: Aggregate = "last"
    abs_tol: float = Field(0.0, ge=0)


class _Defaults(StrictModel):
    max_drop: float = Field(0.05, ge=0)
    max_rise: float = Field(0.05, ge=0)
    aggregate: Aggregate | None = None


class _RulesFile(StrictModel):
    defaults: _Defaults = _Defaults()
    metrics: dict[str, _RuleSpec] = {}
    use_default_patterns: bool = True


def default_rules(device_kind: str | None = None) -> Rules:
    """The built-in rules; with `device_kind` ("cpu" | "gpu") its noise-aware canonical rules are filled in
    (the gate does that itself from the runs' `packtrain.gpu` tag)."""
    rules = Rules()
    return rules.for_device(device_kind) if device_kind else rules


def load_rules(path: str | Path | None) -> Rules:
    """Read a rules file (YAML or JSON); None → the built-in patterns. Errors name the file and field."""
    if path is None:
        return default_rules()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--rules {p}: file not found") from None
    try:
        if p.suffix == ".json":
            raw = json.loads(text)
        else:
            import yaml

            raw = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - yaml/json parse errors → one message naming the file
        raise ConfigError(f"rules file {p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"rules file {p}: top level must be a mapping with 'metrics:' (and optionally "
                          f"'defaults:', 'use_default_patterns:'), got {type(raw).__name__}")
    try:
        spec = _RulesFile.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, _RulesFile, f"rules file {p}")) from None
    exact: dict[str, Rule] = {}
    for name, r in spec.metrics.items():
        direction = r.direction or _infer_direction(name)
        if direction is None:
            raise ConfigError(f"rules file {p}: metrics.{name}.direction: needed (higher, lower or equal); "
                              "no built-in pattern matches this name")
        agg = r.aggregate if "aggregate" in r.model_fields_set else (spec.defaults.aggregate or r.aggregate)
        if r.min is not None and r.max is not None and r.min > r.max:
            raise ConfigError(f"rules file {p}: metrics.{name}: min {r.min} > max {r.max}")
        given = r.model_fields_set   # an explicit `max_drop: null` means "absolute bounds only"
        exact[name] = Rule(
            metric=name, direction=direction,
            max_drop=r.max_drop if "max_drop" in given else (spec.defaults.max_drop if direction == "higher"
                                                             else None),
            max_rise=r.max_rise if "max_rise" in given else (spec.defaults.max_rise if direction == "lower"
                                                             else None),
            tolerance=r.tolerance, min=r.min, max=r.max, aggregate=agg, abs_tol=r.abs_tol, required=True)
    return Rules(exact=exact, patterns=DEFAULT_PATTERNS if spec.use_default_patterns else (), source=str(p),
                 builtin=spec.use_default_patterns)


def _infer_direction(metric: str) -> Direction | None:
    if metric in BY_NAME:
        return BY_NAME[metric].direction
    for r in DEFAULT_PATTERNS:
        if fnmatch.fnmatchcase(metric, r.metric):
            return r.direction
    return None


def noise_rules(kind: str) -> dict[str, Rule]:
    """{canonical name: Rule} of the built-in rules for device kind "cpu" or "gpu" (module doc)."""
    rules: dict[str, Rule] = {}
    for name, floor, abs_tol in GATED:
        m = BY_NAME[name]
        noise = NOISE.get(kind, {}).get(name, (None,))[0]
        why = ALWAYS_REPORT_ONLY.get(kind, {}).get(name)
        allowed = None if why else allowance(kind, name, floor, abs_tol)
        if allowed is None:
            note = why or f"{kind} noise {100 * (noise or 0):.0f}%: report only"
            rules[name] = Rule(name, m.direction, required=False, note=note)
            continue
        note = f"{kind} noise {100 * noise:.1f}%" if noise else ""
        higher = m.direction == "higher"
        rules[name] = Rule(name, m.direction, abs_tol=abs_tol, required=False, note=note,
                           max_drop=allowed if higher else None, max_rise=None if higher else allowed)
    for name, why in REPORTED.items():
        rules[name] = Rule(name, BY_NAME[name].direction, required=False, note=why)
    return rules


BEGIN_RULES = "<!-- BEGIN generated from packtrain.gate.rules -->"


def rules_table() -> str:
    """The Markdown table of the built-in rules per device kind (docs/gate.md, between BEGIN_RULES and END)."""
    kinds = ("cpu", "gpu")
    rules = {k: noise_rules(k) for k in kinds}
    rows = ["| metric | better | " + " | ".join(f"{k}: noise → rule" for k in kinds) + " | abs_tol |",
            "|---|---|" + "---|" * len(kinds) + "---|"]
    for name, r0 in rules["cpu"].items():
        cells = []
        for k in kinds:
            r, (noise, median) = rules[k][name], NOISE.get(k, {}).get(name, (None, None))
            rule = r.describe().split(" (")[0]
            seen = "–" if noise is None else f"{100 * noise:.1f}%"
            if noise and median is not None and abs(median) < r0.abs_tol:
                seen += f" of {median:.2g} (< abs_tol)"
            cells.append(f"{seen} → {rule}")
        rows.append(f"| `{name}` | {r0.direction} | " + " | ".join(cells) + f" | {r0.abs_tol:g} |")
    return "\n".join(rows)
