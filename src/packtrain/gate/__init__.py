"""CI gate and run comparison.

    gate(candidate, baseline, rules) -> GateResult     packtrain.gate.gate   (`packtrain gate`)
    load_source(spec, tracking_uri) -> MetricSource    run id | model alias | metrics JSON
    load_rules(path) -> Rules                          per-metric rules (YAML/JSON) + built-in patterns
    compare_runs(...) -> Comparison                    packtrain.gate.compare (`packtrain compare`)

Module imports are light (no mlflow/matplotlib at import time).
"""

from packtrain.gate.gate import GateResult, GateRow, gate, write_gate_outputs
from packtrain.gate.rules import Rule, Rules, default_rules, load_rules
from packtrain.gate.sources import MetricSource, load_source

__all__ = ["GateResult", "GateRow", "MetricSource", "Rule", "Rules", "default_rules", "gate", "load_rules",
           "load_source", "write_gate_outputs"]
