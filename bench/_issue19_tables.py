"""The end of issue 19's GPU evidence scripts (long_context_bench.py, fp8_bench.py, fsdp2_bench.py): the record
finished and written, and its console table (records, machine and data live in _issue19.py).

    finish_record(record, out, t_start, print_table)   wall_s, the JSON (_issue19.write_record), the table
    print_rows(record, names, header, width, cells)    the header, then one line per row of `names` present in
                                                       the record: a failed one as its error, a good one (or one
                                                       cut by SIGTERM: its logged steps are numbers) as cells(...)
    dash(x, spec)                                      format(x, spec), or "-" for None

For example, print_rows({"bf16": {"real_tokens_per_s": 1e3}, "fp8": {"error": "ConfigError: no FP8",
"refused": True}}, ["bf16", "fp8"], "precision  real tok/s", 10, lambda n, r: f"{r['real_tokens_per_s']:>10,.0f}",
show_refused=True) prints

    <blank line>
    precision  real tok/s
    bf16            1,000
    fp8        REFUSED: ConfigError: no FP8
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

import _issue19 as common


def finish_record(record: dict, out: Path, t_start: float, print_table: Callable[[dict, Path], None]) -> dict:
    """record["wall_s"] = seconds since `t_start` (time.perf_counter), the record written to `out` (temp file +
    rename), print_table(record, out); returns the record."""
    record["wall_s"] = time.perf_counter() - t_start
    common.write_record(out, record)
    print_table(record, out)
    return record


def failure_tag(r: dict, show_refused: bool = False) -> str:
    """A failed row's tag: "OOM" or "ERROR"; "REFUSED" for a ConfigError when `show_refused` (fp8's rows)."""
    if show_refused and r.get("refused"):
        return "REFUSED"
    return "OOM" if r.get("oom") else "ERROR"


def print_rows(record: dict, names: Iterable[str], header: str, width: int, cells: Callable[[str, dict], str],
               show_refused: bool = False) -> None:
    """A blank line and `header`, then per name of `names` that the record holds: `name` left-aligned in `width`
    characters, then its failure (tag and the error's first 110 characters) or cells(name, row)."""
    print(f"\n{header}")
    for name in names:
        r = record.get(name)
        if r is None:
            continue
        if "error" in r and not r.get("cut"):
            print(f"{name:<{width}} {failure_tag(r, show_refused)}: {r['error'][:110]}")
            continue
        print(f"{name:<{width}} {cells(name, r)}")


def dash(x: float | None, spec: str = ".1f") -> str:
    """dash(12.34) → "12.3", dash(None) → "-", dash(0.0123, ".2e") → "1.23e-02"."""
    return "-" if x is None else format(x, spec)
