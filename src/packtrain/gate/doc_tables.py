"""Regenerate the generated tables of the docs (tests/unit/test_gate_metrics.py fails when one differs):

    python -c "import packtrain.gate.doc_tables as m; m.main(['--write', 'docs/metrics.md'])"   # GATE_METRICS
    python -c "import packtrain.gate.doc_tables as m; m.main(['--write', 'docs/gate.md'])"      # built-in rules

It sits above packtrain.gate.metrics (the metrics table) and packtrain.gate.rules (the rules table), so neither
of those imports the other's table.
"""

from __future__ import annotations

import sys
from pathlib import Path

from packtrain.gate.metrics import metrics_table, render_doc
from packtrain.gate.rules import BEGIN_RULES, rules_table
from packtrain.publish import atomic_write_text


def main(argv: list[str] | None = None) -> int:
    """No argument: print the metrics table; `--write PATH`: rewrite PATH's generated part (module doc); a
    PATH holding BEGIN_RULES (docs/gate.md) gets the built-in rules table (packtrain.gate.rules.rules_table)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--write"] and len(argv) == 2:
        path = Path(argv[1])
        text = path.read_text(encoding="utf-8")
        new = render_doc(text, BEGIN_RULES, rules_table()) if BEGIN_RULES in text else render_doc(text)
        atomic_write_text(path, new)
        print(f"wrote {path}")
        return 0
    if argv:
        print("usage: main(['--write', 'docs/metrics.md'])", file=sys.stderr)
        return 2
    print(metrics_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
