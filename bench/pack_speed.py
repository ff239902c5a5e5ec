"""`python bench/pack_speed.py --lengths FILE.npy --budget N [--strategy bfd|mbs|ffd|sequential]`: one JSON line
{"n_docs", "budget", "strategy", "fill", "seconds", "cpu_seconds", "max_pack_tokens", "n_packs", "lower_bound",
"l2_bound", "fill_vs_bound", "fill_vs_l2"} — the plan and its fill against the simple and L2 lower bounds on packs
(bound / packs) — the kept path of `python -m bench pack-speed --lengths ...` (bench.suites.pack_speed; it
needs no --out)."""

import os
import sys

if __name__ == "__main__":   # run as a file: the repository root (this file's parent's parent) holds `bench`
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    os.execv(sys.executable, [sys.executable, "-c", "import sys; from bench.suites.pack_speed import cli_main; "
                              "sys.exit(cli_main())", *sys.argv[1:]])
