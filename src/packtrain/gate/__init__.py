"""CI gate and run comparison.

    evaluate_gate(candidate, baseline, rules) -> GateResult   packtrain.gate.gate   (`packtrain gate`; `gate` is
                                                              the same function)
    load_source(spec, tracking_uri) -> MetricSource    run reference | registered model | metrics JSON
                                                       (a run is read as its run tree, canonical names)
    load_rules(path) -> Rules                          per-metric rules (YAML/JSON) + built-in rules
    GATE_METRICS                                       the canonical metric names (docs/metrics.md)
    compare_runs(...) -> Comparison                    packtrain.gate.compare (`packtrain compare`)

Module imports are light (no mlflow/matplotlib at import time).
"""

from packtrain.gate.gate import GateFailed, GateResult, GateRow, evaluate_gate, gate, write_gate_outputs
from packtrain.gate.metric_sources import MetricSource, load_source
from packtrain.gate.metrics import GATE_METRICS, GateMetric
from packtrain.gate.rules import Rule, Rules, default_rules, load_rules

__all__ = ["GATE_METRICS", "GateFailed", "GateMetric", "GateResult", "GateRow", "MetricSource", "Rule", "Rules",
           "default_rules", "evaluate_gate", "gate", "load_rules", "load_source", "write_gate_outputs"]
