"""`python -m bench`: the benchmark suites of packtrain and the report of their recorded results.

    python -m bench --list                            the suites, one line each
    python -m bench SUITE [--smoke] --out DIR [...]   run one suite; its record → DIR/SUITE.json
                                                      (--out PATH.json: that file)
    python -m bench all --smoke --out DIR             every suite's smoke run in one process (DIR/SUITE/...)
    python -m bench report [--check]                  bench/results/GPU_RESULTS.md from the recorded JSON
    python -m bench import-telemetry TGZ DIR          a GPU host's buffered train run → a local MLflow store

Run from the repository root (the `bench` package is found there; packtrain is imported as installed, or
from PYTHONPATH=src on a GPU host). `--smoke` runs the suite's own code path on the CPU at a tiny size in
seconds and writes a valid record: it checks the suite, it measures nothing worth keeping.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from bench import suites
from bench.harness import check_record, command_line, write_record

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def suite_parser(name: str, module) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m bench {name}", description=module.SUMMARY)
    p.add_argument("--smoke", action="store_true", help="the same code path on the CPU at a tiny size (seconds)")
    p.add_argument("--out", type=Path,
                   help="output folder (the record goes to OUT/<suite>.json), or the record's own PATH.json")
    module.add_arguments(p)
    return p


def run_suite(name: str, argv: list[str]) -> Path:
    """Parse `argv` for suite `name`, run it, write and check its record; returns the record's path."""
    module = suites.load(name)
    parser = suite_parser(name, module)
    args = parser.parse_args(argv)
    why = getattr(module, "check_args", lambda a: None)(args)
    if why:   # refused before anything runs or is written (exit 2)
        parser.error(why)
    args.command = command_line(name, argv)
    if args.out is None:
        if getattr(module, "needs_out", lambda a: True)(args):
            parser.error("--out is required (a folder, or the record's PATH.json)")
        module.run(args, None)   # a one-call mode that prints its answer (pack-speed --lengths) and exits
    path = args.out if args.out.suffix == ".json" else args.out / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    args.record_path = path   # a suite that writes as it goes (a later timeout keeps what was measured)
    t0 = time.perf_counter()
    record = module.run(args, path.parent)
    record.smoke = bool(args.smoke)
    record.extra.setdefault("wall_s", round(time.perf_counter() - t0, 2))
    write_record(path, record)
    problems = check_record(record.to_dict())
    if problems:
        raise SystemExit(f"{path}: the record is not valid: {'; '.join(problems)}")
    print(f"{name}: {len(record.rows)} rows, goals {record.goal_met or '-'} → {path}", file=sys.stderr)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--smoke" in argv:   # a check, not a measurement: one thread each, no spinning on a shared machine
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] == "--list":
        for name, mod in suites.SUITES.items():
            m = suites.load(name)
            print(f"{name:<15} {m.DEVICE:<4} {m.SUMMARY}  ({mod})")
        return 0
    if argv[0] == "report":
        from bench.report import main as report

        return report(argv[1:])
    if argv[0] == "import-telemetry":
        from bench.import_telemetry import main as import_telemetry

        return import_telemetry(argv[1:])
    if argv[0] == "all":
        p = argparse.ArgumentParser(prog="python -m bench all")
        p.add_argument("--smoke", action="store_true", required=True)
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--only", default="", help="comma-separated suite names (default: all)")
        a = p.parse_args(argv[1:])
        names = [n for n in a.only.split(",") if n] or list(suites.SUITES)
        for name in names:
            t0 = time.perf_counter()
            run_suite(name, ["--smoke", "--out", str(a.out / name)])
            print(f"{name}: smoke in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        return 0
    try:
        run_suite(argv[0], argv[1:])
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from packtrain.process_exit import freeze_heap_at_exit

    freeze_heap_at_exit()   # no teardown collection of what the suites imported (~1.5 CPU-s after `all --smoke`)
    sys.exit(main())
