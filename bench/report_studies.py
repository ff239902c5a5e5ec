"""Tables of the long-context, fp8 and fsdp2 records (bench/report.py puts them in the results page).

    long_context(rec) / fp8(rec, log) / fsdp2(rec)   markdown lines of a record written by that suite
    progress_runs(log)                               per run in a log, {step: (loss, tok/s)} from the progress bar
    cut_row(rec, log, name)                          a row cut by a timeout, rebuilt from its log's progress lines

Numbers are read, never recomputed: tok/s and MFU are the train meter's steady-state medians, peaks the
steady-state `max_memory_allocated`, the planner error = predicted / measured − 1. A record's variants are its
rows ({"variant": name, ...}) or, in records written before the suites shared one record type, its top-level
keys named after the variants.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path


def variants(rec: dict) -> dict[str, dict]:
    """{variant name: row} of a record (its rows, or the top-level variant keys of an older record)."""
    if isinstance(rec.get("rows"), list):
        return {r["variant"]: r for r in rec["rows"] if "variant" in r}
    return {k: v for k, v in rec.items() if isinstance(v, dict) and ("real_tokens_per_s" in v or "error" in v)}


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
    base_row = variants(rec).get("bf16", {})
    if len(runs) < 2 or not base_row.get("loss_curve"):
        return None
    row, base = runs[1], runs[0]
    w, last = rec["settings"]["warmup"], max(runs[1])
    steps = [k for k in sorted(row) if k > w]
    curve = base_row["loss_curve"]
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
    """The long-context table: packtrain (varlen, flex) and transformers packed rows."""
    v = variants(rec)
    lines = ["| variant | real tok/s | useful MFU | useful MFU, causal s²/2 | peak alloc GiB | planner GiB | planner error |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    names = {"packtrain": "packtrain (varlen)", "packtrain_flex": "packtrain (flex)",
             "transformers_packed": "transformers packed rows (SDPA + position_ids)"}
    for key, name in names.items():
        r = v.get(key)
        if r is None:
            continue
        lines.append(_row(name, r, [_f(r.get("real_tokens_per_s")), _f(r.get("useful_mfu"), ".3f"),
                                    _f(r.get("useful_mfu_causal"), ".3f"),
                                    _f(r.get("steady_peak_alloc_gib") or r.get("peak_alloc_gib"), ".1f"),
                                    _f(r.get("planner_peak_alloc_gib"), ".1f"), _f(r.get("planner_error"), "+.1%")]))
    return lines


def fp8(rec: dict, log: Path | None = None) -> list[str]:
    """The fp8 table; a fp8 row missing from the record (cut by a timeout) is rebuilt from `log`."""
    v = variants(rec)
    lines = ["| precision | real tok/s | useful MFU | peak alloc GiB | planner GiB | loss, mean of its last 10 steps |",
             "|---|---:|---:|---:|---:|---:|"]
    cut = cut_row(rec, log, "fp8") if log and "fp8" not in v else None
    for key in ("bf16", "fp8", "fp8_tensorwise", "fp8_rowwise", "fp8_nomix"):
        r = v.get(key)
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
                      f"{cut['loss_max_abs_diff_step']} ({cut['loss_max_rel_diff']:.1%} of bf16's loss there)."]
    return lines


def fsdp2(rec: dict) -> list[str]:
    """The fsdp2 table: each engine row against the torch row."""
    v, cmp = variants(rec), rec.get("comparison", {})
    lines = ["| engine | real tok/s | vs torch | useful MFU | peak alloc GiB | planner GiB | max \\|Δloss\\| vs torch "
             "| max relative |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key in ("torch", "fsdp2", "fsdp2_reshard", "torch_repeat"):
        r, c = v.get(key), cmp.get(key, {})
        if r is None:
            continue
        lines.append(_row(key, r, [_f(r.get("real_tokens_per_s")), _f(c.get("tok_s_ratio"), ".3f"),
                                   _f(r.get("useful_mfu"), ".3f"), _f(r.get("steady_peak_alloc_gib"), ".1f"),
                                   _f(r.get("planner_peak_alloc_gib"), ".1f"), _f(c.get("loss_max_abs_diff"), ".2e"),
                                   _f(c.get("loss_step_rel_diff_max"), ".2e")]))
    return lines


def guard(rec: dict) -> list[str]:
    """The guard table: each run's tok/s, step time, the guard's own share and its events; then the verdict."""
    lines = ["| run | real tok/s | step p50 s | guard's own time | data-wait share | events |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rec["rows"]:
        ev = "; ".join(f"step {e['step']}: {e['signal']} ({e.get('cause')})" for e in r.get("events") or []) or "–"
        lines.append(f"| {r['label']} | {_f(r.get('real_tokens_per_s'))} | {_f(r.get('step_time_p50_s'), '.4f')} | "
                     f"{_f(r.get('guard_overhead_frac'), '.3%')} | {_f(r.get('data_wait_frac'), '.1%')} | {ev} |")
    s = rec.get("summary", rec)
    met = ", ".join(f"{k} {'met' if v else '**not met**'}" for k, v in rec["goal_met"].items())
    lines += ["", f"Guard-on ÷ guard-off tok/s {_f(s.get('tok_s_on_vs_off'), '.4f')}; the throttled loader "
              f"(+{_f(s.get('slowdown_delay_s'), '.3f')} s a step from step {rec['settings']['fault_step']}) detected "
              f"at step {s.get('detected_at_step')} as {s.get('detected_as')}. Goals: {met}."]
    return lines


def _name(name: str, r: dict) -> str:
    return f"{name}, **cut at step {r['cut_at_step']}** by the timeout" if r.get("cut") else name




def _short(cached: list[str] | None) -> str:
    """frontier's cached ops, short: ['mlp.gate_proj.base_layer', 'self_attn'] → 'gate, attention'."""
    if not cached:
        return "nothing (full recompute)"
    names = [c.replace(".base_layer", "").split(".")[-1].replace("_proj", "") for c in cached]
    return ", ".join("attention" if n == "self_attn" else n for n in names)


def lora_budget(rec: dict) -> list[str]:
    """The lora-budget record: bytes kept per policy, the cheapest mixes within the budget, offload."""
    s, cfg = rec["summary"], rec["settings"]
    off_var = "input cast off"
    lines = ["| variant | policy (outputs kept) | KiB / token / layer | step peak GiB | recompute GFLOP / token | "
             "tok/s estimate |", "|---|---|---:|---:|---:|---:|"]
    fits = [p for p in rec["rows"] if p["variant"] == off_var and p["policy"] == "frontier" and p["fits"]]
    largest_fit = max(fits, key=lambda p: p["peak_gib"]) if fits else None
    for r in rec["rows"]:
        keep = r["policy"] in ("none", "selective", "full") or r is largest_fit
        if not keep or (r["variant"] != off_var and r["policy"] != "none"):
            continue
        what = {"none": "everything autograd saves, eager (compiled layers keep less)", "full": "the layer input only",
                "selective": "every matrix product and the attention (eager torch: "
                             f"{r.get('eager_kept_bytes_per_token', 0) / 1024:.1f} KiB)"}.get(r["policy"]) or (
            f"{_short(r.get('cached'))} — the most that fits")
        lines.append(f"| {'peft default (input cast per branch)' if r['variant'] != off_var else 'input cast off (training)'} | {what} | "
                     f"{r['kept_bytes_per_token'] / 1024:.1f} | {r['peak_gib']:.1f} | "
                     f"{r['recompute_gflop_per_token']:.2f} | {_f(r['tok_per_s_bound'])} |")
    mix = s["cheapest_mix_within_budget"].get(off_var) or {}
    off, both = s["offload"], s.get("offload_and_recompute") or {}
    bmix = both.get("mix") or {}

    def mix_text(m: dict) -> str:
        if not m:
            return "no mix fits"
        rec = f"{m.get('recompute_gflop_per_token', 0):.2f} GFLOP/token recomputed"
        k, n = m.get("layers_high", 0), m.get("layers", 0)
        if k in (0, n):
            return f"{_short(m.get('high') if k else m.get('low'))} kept in every layer — {rec}"
        return f"{_short(m.get('high'))} kept in {k} of {n} layers, {_short(m.get('low'))} in the rest — {rec}"

    lines += ["", f"Peaks start from {s['anchor']} ({s['anchor_gib']:.1f} GiB) and add what each policy keeps "
              f"beyond the layer inputs; within {cfg['gib']:.0f} GiB a layer may keep "
              f"{s['allowed_kept_kib_per_token_layer']:.1f} KiB per token on average. "
              f"{_f(rec['goals']['tok_per_s'])} tok/s allows {s['recompute_allowed_gflop_per_token']:.2f} GFLOP of "
              f"recompute per token over the {_f(cfg['no_ac_tok_s'])} tok/s no-recompute step at "
              f"{cfg['matmul_tflops']:.0f} TFLOP/s. The cheapest mix of two policies across the layers that fits: "
              f"{mix_text(mix)}, at most {_f(s['cheapest_mix_tok_per_s_bound'])} tok/s.",
              f"Offload alone: the selective policy's {off['must_leave_gib_per_step']:.1f} GiB over the budget must "
              f"leave the GPU during the forward ({off['forward_share']:.0%} of the step's FLOPs, "
              f"{off['forward_s_at_goal']:.2f} s at the goal's speed): {off['needed_gb_per_s']:.1f} GB/s or more, "
              f"against {off['host_link_gb_per_s']:.0f} GB/s for the host link ({off['host_link_source']}). "
              f"Offload at that rate for the whole forward plus recompute for the rest "
              f"({both.get('offloadable_gib_per_step', 0):.1f} GiB offloaded): {mix_text(bmix)}, at most "
              f"{_f(both.get('tok_per_s_bound'))} tok/s — assuming {both.get('assumes', '')}."]
    if s.get("full_ac_check"):
        c = s["full_ac_check"]
        est = next((r["tok_per_s_bound"] for r in rec["rows"] if r["policy"] == "full" and r["variant"] == off_var), None)
        lines.append(f"Check against `{c['record']}` (measured {_f(c['real_tok_per_s'])} tok/s with full recompute; "
                     f"this suite's estimate for it: {_f(est)}): its "
                     f"recompute counts {c['record_recompute_gflop_per_token']:.2f} GFLOP/token (2·N + attention), "
                     f"this suite's full policy {c['measured_here_gflop_per_token']:.2f} (what the compiled layer "
                     "re-runs: the ancestors of the tensors backward needs, so not the down projection; eager torch "
                     "would re-run it too).")
    if "input_cast_off_bitwise_equal" in s:
        lines.append("Loss, input gradient and adapter gradients with the input cast off (adapter dropout 0): "
                     + ("bitwise equal." if s["input_cast_off_bitwise_equal"] else "**not** bitwise equal."))
    return lines
