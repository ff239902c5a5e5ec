"""bench fp8's verdicts from its rows: each FP8 variant against bf16 at one shape, the faster FP8 variant, the
goals, and the loss-curve plot beside the record.

    loss_agreement(base, other, last)     per-step relative loss difference |other − base| / base: its max and
                                          final value over the last `last` steps compared (and its mean)
    settings_mismatch(base, other)        what differs between two rows' setups (rows, checkpointing, ...): a
                                          tok/s ratio or a loss comparison is only made where this is empty
    compare_variants(rows, names, goals)  {variant: comparison} against bf16, the faster FP8 variant, goal_met
    plot_curves(rows, names, path, last)  the loss curves and their relative differences → path (PNG)

    >>> a = loss_agreement([4.0, 3.0, 2.0, 2.0], [4.0, 3.3, 2.02, 1.99], last=2)
    >>> a["last_n"], round(a["loss_rel_diff_last_n_max"], 4), round(a["loss_rel_diff_final"], 4)
    (2, 0.01, 0.005)
"""

from __future__ import annotations

from pathlib import Path

from bench.workload import compare_curves

GOALS = {"tok_s_ratio_min": 1.25, "loss_last_n": 50, "loss_rel_diff_last_n_max": 0.01,
         "loss_tail_rel_diff_max": 0.01, "steps_min": 200, "planner_error_abs_max": 0.10}
"""tok_s_ratio_min: the faster FP8 variant's real tok/s over bf16's at the same shape. loss_rel_diff_last_n_max:
every one of the last loss_last_n steps within 1% of bf16's loss at that step (same seed, same packs: the
difference is FP8's numerics alone; the H100 record at 3 × 2048 stayed under 0.04% over its last 100 steps), and
loss_tail_rel_diff_max: the means of the last 10 steps within 1%. steps_min: complete optimizer steps of every
variant. planner_error_abs_max: |predicted / measured − 1| of each variant's steady peak allocated memory."""

SAME = ("rows", "budget", "grad_accum", "activation_checkpointing", "checkpointed_layers", "attention", "compile",
        "loss", "engine")
"""The setup keys two rows must share for their tok/s and loss curves to be compared."""


def loss_agreement(base: list[float], other: list[float], last: int = 50) -> dict:
    """Over the last `last` of the steps both curves have: the max, final and mean of |other − base| / |base|."""
    n = min(len(base), len(other))
    k = min(last, n)
    if not k:
        return {"last_n": 0}
    rel = [abs(o - b) / abs(b) for b, o in zip(base[n - k:n], other[n - k:n], strict=True) if b]
    return {"last_n": k, "loss_rel_diff_last_n_max": max(rel), "loss_rel_diff_final": rel[-1],
            "loss_rel_diff_last_n_mean": sum(rel) / len(rel)}


def settings_mismatch(base: dict, other: dict) -> list[str]:
    """'key: base vs other' for each SAME key the two rows' `setup` blocks disagree on.

    >>> settings_mismatch({"setup": {"rows": 3, "activation_checkpointing": "none"}},
    ...                   {"setup": {"rows": 4, "activation_checkpointing": "none"}})
    ['rows: 3 vs 4']
    """
    a, b = base.get("setup") or {}, other.get("setup") or {}
    return [f"{k}: {a.get(k)} vs {b.get(k)}" for k in SAME if a.get(k) != b.get(k)]


def _failed(row: dict | None) -> str | None:
    """Why a row has nothing to compare (None: it has)."""
    if row is None:
        return "not run"
    if "error" in row:
        return row["error"][:300]
    if not row.get("loss_curve"):
        return "no loss curve"
    return None


def compare_one(base: dict | None, other: dict | None, name: str, goals: dict = GOALS) -> dict:
    """One variant against bf16: compare_curves + loss_agreement, or {"skipped": why} when either failed or
    their settings differ (no ratio from mismatched settings)."""
    why = _failed(base)
    if why:
        return {"skipped": f"bf16: {why}"}
    why = _failed(other)
    if why:
        return {"skipped": f"{name}: {why}"}
    diff = settings_mismatch(base, other)
    if diff:
        return {"skipped": f"settings differ from bf16's: {'; '.join(diff)}"}
    return {**compare_curves(base, other),
            **loss_agreement(base["loss_curve"], other["loss_curve"], goals["loss_last_n"])}


def loss_within(c: dict, goals: dict = GOALS) -> bool:
    """Both loss tolerances of GOALS met by comparison `c`."""
    return (c.get("loss_rel_diff_last_n_max") is not None and c.get("loss_tail_rel_diff") is not None
            and c["loss_rel_diff_last_n_max"] <= goals["loss_rel_diff_last_n_max"]
            and c["loss_tail_rel_diff"] <= goals["loss_tail_rel_diff_max"])


def compare_variants(rows: dict[str, dict], names: list[str], goals: dict = GOALS) -> tuple[dict, dict | None, dict]:
    """(comparisons, faster, goal_met) for the variants `names` (bf16 among them) of one run.

    comparisons: {variant: compare_one(bf16, variant)} for every variant but bf16. faster: the FP8 variant with the
    highest tok/s among those compared (its ratio to bf16 and to each other FP8 variant), None if none was.
    goal_met: speedup (faster's ratio ≥ tok_s_ratio_min), loss (every compared FP8 variant within both
    tolerances, and at least one compared), steps (every variant ran ≥ steps_min complete steps), and
    planner_<variant> (|planner error| ≤ planner_error_abs_max) per variant — False where a variant failed."""
    base = rows.get("bf16")
    comparisons = {n: compare_one(base, rows.get(n), n, goals) for n in names if n != "bf16"}
    fp8 = {n: c for n, c in comparisons.items() if n.startswith("fp8") and c.get("tok_s_ratio")}
    faster = None
    if fp8:
        best = max(fp8, key=lambda n: fp8[n]["tok_s_ratio"])
        tok = rows[best]["real_tokens_per_s"]
        faster = {"variant": best, "real_tokens_per_s": tok, "tok_s_ratio": fp8[best]["tok_s_ratio"],
                  "over_other_fp8": {n: tok / rows[n]["real_tokens_per_s"] for n in fp8 if n != best}}
    goal_met = {
        "speedup": bool(faster and faster["tok_s_ratio"] >= goals["tok_s_ratio_min"]),
        "loss": bool(fp8) and all(loss_within(c, goals) for n, c in comparisons.items() if n.startswith("fp8")),
        "steps": all(len((rows.get(n) or {}).get("loss_curve") or []) >= goals["steps_min"]
                     and "error" not in (rows.get(n) or {"error": ""}) for n in names),
    }
    for n in names:
        err = (rows.get(n) or {}).get("planner_error")
        goal_met[f"planner_{n}"] = err is not None and abs(err) <= goals["planner_error_abs_max"]
    return comparisons, faster, goal_met


def plot_curves(rows: dict[str, dict], names: list[str], path: Path, comparisons: dict, title: str,
                goals: dict = GOALS) -> Path:
    """Loss per step of every variant with a curve (top) and each compared variant's (other − bf16) / bf16
    (bottom: the tolerance band and the last-N window of GOALS marked) → `path` (PNG, written atomically)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 6.4), dpi=110)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    base = (rows.get("bf16") or {}).get("loss_curve") or []
    for n in names:
        curve = (rows.get(n) or {}).get("loss_curve") or []
        if not curve:
            continue
        tok = rows[n].get("real_tokens_per_s")
        top.plot(range(1, len(curve) + 1), curve, lw=1, label=n + (f" ({tok:,.0f} tok/s)" if tok else ""))
        c = comparisons.get(n, {})
        if base and n != "bf16" and "skipped" not in c:
            m = min(len(base), len(curve))
            bottom.plot(range(1, m + 1), [(o - b) / b for b, o in zip(base[:m], curve[:m], strict=True)], lw=1,
                        label=f"{n}: max {c.get('loss_rel_diff_last_n_max', 0):.2%} over the last {c.get('last_n')}")
    tol, n_last = goals["loss_rel_diff_last_n_max"], goals["loss_last_n"]
    bottom.axhspan(-tol, tol, color="tab:green", alpha=0.12, label=f"goal: within ±{tol:.0%} of bf16")
    if base:
        bottom.axvspan(max(1, len(base) - n_last + 1), len(base), color="tab:gray", alpha=0.15,
                       label=f"the last {n_last} steps (the goal's window)")
    top.set_ylabel("training loss")
    top.set_title(title, fontsize=10)
    top.legend(fontsize=8)
    bottom.set_ylabel("(variant − bf16) / bf16")
    bottom.set_xlabel("optimizer step (same seed, same packs)")
    bottom.legend(fontsize=8, loc="upper right")
    from packtrain.telemetry.plots import save_figure

    return save_figure(fig, path)
