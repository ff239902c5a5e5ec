"""Markdown tables of issue 19's GPU evidence, from the JSON records the three benches wrote.

    python bench/issue19_report.py bench/results/long_context_1b_32k.json bench/results/fp8_bench_3b.json \
        bench/results/fsdp2_bench_1b.json            # prints a GPU_RESULTS/README section to paste
    ... --fp8-log bench/results/issue19_fp8.log      # an fp8 row cut by a timeout: from its progress lines

Each record says which bench wrote it ("bench": long_context | fp8 | fsdp2); any subset, any order. Numbers are
read, never recomputed: tok/s and MFU are the train meter's steady-state medians, peaks the steady-state
`max_memory_allocated`, the planner error = predicted / measured − 1.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

PROGRESS = re.compile(r"\|\s*(\d+)/\d+ \[[^\]]*loss=([\d.]+), tok_s=([\d,]+)\]")


def progress_runs(log: str | Path) -> list[dict[int, tuple[float, float]]]:
    """Per run in a bench log, {step: (loss, tok/s)} from train()'s progress lines (tqdm, `loss=…, tok_s=…`).

    The bar sets step n's numbers while its counter still shows n − 1, then counts to n, then shows step n + 1's
    numbers at n: so the FIRST line showing counter n ≥ 1 carries step n's. A counter going back starts a new run.
    tok_s is that step's rate (real tokens / step time), the quantity whose median the meter reports."""
    runs: list[dict[int, tuple[float, float]]] = []
    last = None
    for line in Path(log).read_text(encoding="utf-8", errors="replace").splitlines():
        m = PROGRESS.search(line)
        if not m:
            continue
        n = int(m[1])
        if not runs or (last is not None and n < last):
            runs.append({})
        last = n
        if n >= 1 and n not in runs[-1]:
            runs[-1][n] = (float(m[2]), float(m[3].replace(",", "")))
    return runs


def cut_row(rec: dict, log: str | Path, name: str) -> dict | None:
    """The row of `name` (the run after bf16 in the log) rebuilt from progress lines when the JSON lacks it: median
    tok/s over its steps after the warm-up, the mean of its last 10 losses, and the same numbers of the bf16 run
    over the same steps (its JSON curve, its logged rates), so the ratio compares like with like."""
    runs = progress_runs(log)
    if len(runs) < 2 or not rec.get("bf16", {}).get("loss_curve"):
        return None
    row, base = runs[1], runs[0]
    w, last = rec["settings"]["warmup"], max(runs[1])
    steps = [k for k in sorted(row) if k > w]
    curve = rec["bf16"]["loss_curve"]
    tail = [k for k in steps if k > last - 10]
    tok = statistics.median(row[k][1] for k in steps)
    base_tok = statistics.median(base[k][1] for k in steps if k in base)
    ours, theirs = sum(row[k][0] for k in tail) / len(tail), sum(curve[k - 1] for k in tail) / len(tail)
    diffs = {k: abs(row[k][0] - curve[k - 1]) for k in row}
    worst = max(diffs, key=diffs.get)
    return {"name": name, "last_step": last, "steps": f"{steps[0]}–{steps[-1]}", "real_tokens_per_s": tok,
            "bf16_same_steps": base_tok, "tok_s_ratio": tok / base_tok, "tail_steps": f"{tail[0]}–{tail[-1]}",
            "loss_tail": ours, "bf16_loss_tail": theirs, "loss_tail_rel_diff": abs(ours - theirs) / theirs,
            "loss_max_abs_diff": diffs[worst], "loss_max_abs_diff_step": worst,
            "loss_max_rel_diff": diffs[worst] / curve[worst - 1]}


def _f(x, fmt: str = ",.0f", none: str = "–") -> str:
    return none if x is None else format(x, fmt)


def _failed(name: str, r: dict) -> str | None:
    """The table line of a failed row (OOM, refusal, error); None for a good one or one cut by a timeout (its
    logged steps are numbers: the caller names it with _name)."""
    if "error" not in r or r.get("cut"):
        return None
    what = "out of memory" if r.get("oom") else ("refused" if r.get("refused") else "error")
    return f"| {name} | {what}: {r['error'][:90]} (peak {_f(r.get('peak_alloc_gib_at_failure'), '.1f')} GiB) |"


def _row(name: str, r: dict, cells: list[str]) -> str:
    """A markdown table line: the failure of a failed row (_failed), else the name (cut: _name says so) and
    `cells`: _row("bf16", {"real_tokens_per_s": 26252.4}, ["26,252"]) → "| bf16 | 26,252 |"."""
    return _failed(name, r) or "| " + " | ".join([_name(name, r), *cells]) + " |"


def long_context(rec: dict) -> list[str]:
    s, d = rec["settings"], rec["data"]
    lines = [f"### 1B at a {s['budget']:,}-token budget, long-tailed documents (`{Path(rec.get('_path', '')).name}`)",
             "", f"    {rec['command']}", "",
             f"{s['rows']} × {s['budget']:,} tokens a step, {s['steps']} measured steps after {s['warmup']}; documents "
             f"lognormal (median {s['lengths']['median']:.0f}, σ {s['lengths']['sigma']}) cut at the budget: p50 "
             f"{d['p50']:,.0f}, p90 {d['p90']:,.0f}, max {d['max']:,}, {d['token_share_ge_8k']:.0%} of the tokens in "
             f"documents ≥ 8k, Σs²/Σs {d['sum_sq_over_sum']:,.0f}. Recipe {s['recipe']} ({s['attention']}, "
             f"{s['precision']}, compile {s['compile']}, loss {s['loss']}).", "",
             "| variant | real tok/s | useful MFU | useful MFU, causal s²/2 | peak alloc GiB | planner GiB | planner error |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    names = {"packtrain": "packtrain (varlen)", "packtrain_flex": "packtrain (flex)",
             "transformers_packed": "transformers packed rows (SDPA + position_ids)"}
    for key, name in names.items():
        r = rec.get(key)
        if r is None:
            continue
        lines.append(_row(name, r, [_f(r.get("real_tokens_per_s")), _f(r.get("useful_mfu"), ".3f"),
                                    _f(r.get("useful_mfu_causal"), ".3f"),
                                    _f(r.get("steady_peak_alloc_gib") or r.get("peak_alloc_gib"), ".1f"),
                                    _f(r.get("planner_peak_alloc_gib"), ".1f"), _f(r.get("planner_error"), "+.1%")]))
    lines += ["", f"Goals (useful MFU ≥ 50%, planner ±10%): {rec.get('goal_met')}; speed-up over transformers: "
                  f"{_f(rec.get('speedup_vs_transformers'), '.2f')}×.", ""]
    return lines


def fp8(rec: dict) -> list[str]:
    s, c = rec["settings"], rec.get("comparison", {})
    lines = [f"### FP8 vs bf16 at 3B (`{Path(rec.get('_path', '')).name}`)", "", f"    {rec['command']}", "",
             f"{s.get('params')}, {s['rows']} × {s['budget']} tokens a step, {s['steps']} "
             f"steps each, same seed and packs, compile {rec.get('bf16', {}).get('compile')}; fp8 = torchao float8 "
             f"{s['fp8_recipe']} on the decoder "
             f"linears.", "",
             "| precision | real tok/s | useful MFU | peak alloc GiB | planner GiB | loss, mean of its last 10 steps |",
             "|---|---:|---:|---:|---:|---:|"]
    cut = cut_row(rec, rec["_fp8_log"], "fp8") if rec.get("_fp8_log") and "fp8" not in rec else None
    for key in ("bf16", "fp8", "fp8_tensorwise", "fp8_rowwise"):
        r = rec.get(key)
        if key == "fp8" and r is None and cut:
            lines.append(f"| fp8, **cut at step {cut['last_step']}** by the part's timeout (from the log's progress "
                         f"lines, steps {cut['steps']}) | {_f(cut['real_tokens_per_s'])} | – | – | – | "
                         f"{_f(cut['loss_tail'], '.4f')} (steps {cut['tail_steps']}) |")
            continue
        if r is None:
            continue
        lines.append(_row(key, r, [_f(r.get("real_tokens_per_s")), _f(r.get("useful_mfu"), ".3f"),
                                   _f(r.get("steady_peak_alloc_gib"), ".1f"), _f(r.get("planner_peak_alloc_gib"), ".1f"),
                                   _f(r.get("loss_tail10"), ".4f")]))
    if cut:
        lines += ["", f"fp8 / bf16 real tok/s over steps {cut['steps']}: {_f(cut['tok_s_ratio'], '.3f')}× "
                      f"({_f(cut['real_tokens_per_s'])} / {_f(cut['bf16_same_steps'])}; goal ≥ 1.25: "
                      f"{'met' if cut['tok_s_ratio'] >= 1.25 else 'NOT met'}); loss, mean of steps {cut['tail_steps']}: "
                      f"fp8 {cut['loss_tail']:.4f} vs bf16 {cut['bf16_loss_tail']:.4f}, "
                      f"{cut['loss_tail_rel_diff']:.2%} apart (goal ≤ 1%, at step {cut['last_step']} instead of "
                      f"200); max |Δloss| over the curve {cut['loss_max_abs_diff']:.4f} at step "
                      f"{cut['loss_max_abs_diff_step']} ({cut['loss_max_rel_diff']:.1%} of bf16's loss there).", ""]
        return lines
    lines += ["", f"{rec.get('headline_row', 'fp8')} / bf16 real tok/s: {_f(c.get('tok_s_ratio'), '.3f')}× (goal ≥ 1.25); loss difference "
                  f"(last-10 means): {_f(c.get('loss_tail_rel_diff'), '.3%')} (goal ≤ 1%); max |Δloss| over the "
                  f"curve {_f(c.get('loss_max_abs_diff'), '.4f')} at step {c.get('loss_max_abs_diff_step')}. "
                  f"Goals: {rec.get('goal_met', rec.get('skipped'))}.", ""]
    return lines


def fsdp2(rec: dict) -> list[str]:
    s, cmp = rec["settings"], rec.get("comparison", {})
    lines = [f"### FSDP2 vs the torch engine, 1B on one GPU (`{Path(rec.get('_path', '')).name}`)", "",
             f"    {rec['command']}", "",
             f"recipe {s['recipe']}, {s['rows']} × {s['budget']} tokens a step, {s['steps']} steps each, same seed "
             f"and packs, compile {s['compile']}.", "",
             "| engine | real tok/s | vs torch | useful MFU | peak alloc GiB | planner GiB | max \\|Δloss\\| vs torch "
             "| max relative |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key in ("torch", "fsdp2", "fsdp2_reshard", "torch_repeat"):
        r, c = rec.get(key), cmp.get(key, {})
        if r is None:
            continue
        lines.append(_row(key, r, [_f(r.get("real_tokens_per_s")), _f(c.get("tok_s_ratio"), ".3f"),
                                   _f(r.get("useful_mfu"), ".3f"), _f(r.get("steady_peak_alloc_gib"), ".1f"),
                                   _f(r.get("planner_peak_alloc_gib"), ".1f"), _f(c.get("loss_max_abs_diff"), ".2e"),
                                   _f(c.get("loss_step_rel_diff_max"), ".2e")]))
    lines += ["", f"Goals (≤ 5% slower, loss within 1% at every step): {rec.get('goal_met')}; the torch run "
                  f"repeated: {rec.get('repeat_spread')}.", ""]
    return lines


def _name(name: str, r: dict) -> str:
    return f"{name}, **cut at step {r['cut_at_step']}** by the timeout" if r.get("cut") else name


RENDER = {"long_context": long_context, "fp8": fp8, "fsdp2": fsdp2}


def render(paths: list[str], fp8_log: str | None = None) -> str:
    out = ["## Issue 19 on one H200: long context, FP8, FSDP2", ""]
    for p in paths:
        rec = json.loads(Path(p).read_text())
        rec["_path"], rec["_fp8_log"] = p, fp8_log
        if rec.get("bench") not in RENDER:
            raise SystemExit(f"{p}: 'bench' is {rec.get('bench')!r}, not one of {', '.join(RENDER)}")
        out += RENDER[rec["bench"]](rec)
    m = rec["machine"]
    out.append(f"Machine: {m.get('gpu', 'cpu')}, torch {m.get('torch')}, transformers {m.get('transformers')}, "
               f"torchao {m.get('torchao')}; MFU against {m.get('peak_tflops_bf16')} TFLOP/s bf16.")
    return "\n".join(out)


if __name__ == "__main__":
    args = sys.argv[1:]
    log = None
    if "--fp8-log" in args:
        i = args.index("--fp8-log")
        log = args[i + 1]
        del args[i: i + 2]
    print(render(args, log))
