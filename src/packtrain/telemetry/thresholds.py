"""The seed's monitoring points, checked on a run's steady-state summary.

    utilization   ≥ telemetry.min_utilization    (0.90; NVML "kernel running" fraction, or CPU on CPU runs)
    fragmentation < telemetry.max_fragmentation  (0.10; 1 − allocated/reserved at the CUDA peak)
    padding       < telemetry.max_padding        (0.05; 1 − real tokens / slot tokens)

A missing or None value is not checked (e.g. fragmentation on CPU). Each violation is one string
"<name>: <value> <op> <limit> (<field>)", warned once per call as a `TelemetryWarning`; the caller sets them
as run tags `packtrain.violation.<name>` (`violation_tags`). Violations never fail a run: the gate does.

>>> check_thresholds({"utilization": 0.72, "padding": 0.01}, TelemetryConfig())
['utilization: 0.720 < 0.900 (telemetry.min_utilization)']
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from packtrain.config import TelemetryConfig

TAG_PREFIX = "packtrain.violation."


class TelemetryWarning(UserWarning):
    """A run crossed a monitoring threshold."""


def check_thresholds(summary: Mapping[str, Any], cfg: TelemetryConfig) -> list[str]:
    """Violations of `cfg`'s thresholds by `summary` (keys utilization, fragmentation, padding)."""
    out: list[str] = []

    def num(key: str) -> float | None:
        v = summary.get(key)
        return None if v is None or isinstance(v, bool) else float(v)

    util = num("utilization")
    if util is not None and util < cfg.min_utilization:
        out.append(f"utilization: {util:.3f} < {cfg.min_utilization:.3f} (telemetry.min_utilization)")
    frag = num("fragmentation")
    if frag is not None and frag >= cfg.max_fragmentation:
        out.append(f"fragmentation: {frag:.3f} >= {cfg.max_fragmentation:.3f} (telemetry.max_fragmentation)")
    pad = num("padding")
    if pad is not None and pad >= cfg.max_padding:
        out.append(f"padding: {pad:.3f} >= {cfg.max_padding:.3f} (telemetry.max_padding)")
    for v in out:
        warnings.warn(f"telemetry threshold violated: {v}", TelemetryWarning, stacklevel=2)
    return out


def violation_tags(violations: list[str]) -> dict[str, str]:
    """['padding: 0.080 >= 0.050 (...)'] → {'packtrain.violation.padding': '0.080 >= 0.050 (...)'}."""
    tags = {}
    for v in violations:
        name, _, detail = v.partition(":")
        tags[TAG_PREFIX + name.strip()] = detail.strip() or "true"
    return tags
