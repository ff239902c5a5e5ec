"""Memory headline on the GPU: peak memory and tokens/s of the same recipe and token budget, technique by technique.

    python -m bench memory --out bench/results/memory_headline_350m.json [--recipe 350m-h200] [--steps 16]
    python -m bench memory --smoke --out /tmp/mem     # CPU: tiny model, the rows without DeepSpeed, sdpa

Rows (each a fresh process through `packtrain.train.loop.train`, synthetic lognormal packed data):
  baseline      fp32, no activation checkpointing, standard loss, sdpa (varlen needs bf16/fp16), no compile
  +amp          bf16 autocast, varlen attention, torch.compile
  +ckpt         + full activation checkpointing
  +fused-loss   + fused linear cross-entropy (no full logits)
  +zero3-offload  + DeepSpeed ZeRO-3 with optimizer and parameter CPU offload (compile off)
  optimized     packtrain's memory-optimized setting: bf16 + varlen + compile + every-2nd-layer checkpointing
                + fused loss (no offload: on one GPU it costs more time than it saves memory)
Prints a table with the change vs. baseline; the target: ≥ 60% less peak memory at ≥ baseline tok/s.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from bench.harness import Record, machine_info

SUMMARY = "memory headline: peak memory and tok/s of one recipe and budget, technique by technique"
DEVICE = "gpu"
GOALS = {"peak_vs_baseline_max": -0.60, "tok_s_vs_baseline_min": 1.0}

ROWS = [
    ("baseline", "sdpa", ["train.precision=fp32", "train.activation_checkpointing=none", "train.loss=standard"],
     {"compile": False}),
    ("+amp", "varlen", ["train.precision=bf16", "train.activation_checkpointing=none", "train.loss=standard"],
     {"compile": True}),
    ("+ckpt", "varlen", ["train.precision=bf16", "train.activation_checkpointing=full", "train.loss=standard"],
     {"compile": True}),
    ("+fused-loss", "varlen", ["train.precision=bf16", "train.activation_checkpointing=full", "train.loss=fused"],
     {"compile": True}),
    ("+zero3-offload", "varlen", ["train.precision=bf16", "train.activation_checkpointing=full",
                                  "train.loss=fused"],
     {"compile": False, "engine": "deepspeed", "zero_stage": 3, "offload": True}),
    ("optimized", "varlen", ["train.precision=bf16", "train.activation_checkpointing=every_k", "train.ac_every_k=2",
                             "train.loss=fused"], {"compile": True}),
]


def add_arguments(p) -> None:
    p.add_argument("--recipe", default="350m-h200")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--docs", type=int, default=6000)
    p.add_argument("--only", default="", help="comma-separated row names")
    p.add_argument("--timeout", type=int, default=300)


def run(a, out: Path) -> Record:
    from bench.suites.train_smoke import SMOKE_MODEL, _child, _run_one
    from packtrain.config import load_run_config
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    smoke = SMOKE_MODEL if a.smoke else []
    if a.smoke:
        a.steps, a.docs = 2, 200
    cfg = load_run_config(a.recipe, smoke)
    work = Path(tempfile.mkdtemp(prefix="packtrain-memhead-"))
    make_synthetic_inputs(work, n_docs=a.docs, vocab_size=cfg.tokenize.vocab_size, budget=cfg.pack.budget)
    only = {x for x in a.only.split(",") if x}
    rows = []
    for name, attn, overrides, extra in ROWS:
        if (only and name not in only) or (a.smoke and extra.get("engine") == "deepspeed"):
            continue
        if a.smoke:   # the CPU: sdpa, fp32 or bf16 autocast, no compile
            attn, extra = "sdpa", {**extra, "compile": False}
            overrides = [*smoke, *(o for o in overrides if not o.startswith("train.loss=fused"))]
        spec = {"kind": "run", "recipe": a.recipe, "overrides": overrides, "data": str(work),
                "out": str(work / f"run-{name}"), "attention": attn, "steps": a.steps, **extra}
        r = _run_one(spec) if a.smoke else _child(spec, a.timeout)
        r = {"row": name, **{k: r.get(k) for k in ("attention", "precision", "engine", "zero_stage", "offload",
                                                   "compile", "real_tokens_per_s", "peak_alloc_gib",
                                                   "peak_reserved_gib", "fragmentation", "useful_mfu",
                                                   "final_loss", "error", "stderr_tail")},
             "overrides": overrides}
        if not r.get("error"):
            r.pop("error")
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "stderr_tail"}), flush=True)
    base = next((r for r in rows if r["row"] == "baseline" and not r.get("error")), None)
    print(f"\n{'row':<16} {'tok/s':>10} {'peak alloc GiB':>14} {'vs baseline':>12} {'tok/s vs base':>13}")
    for r in rows:
        if r.get("error"):
            print(f"{r['row']:<16} ERROR {str(r['error'])[:80]}")
            continue
        dm = (r["peak_alloc_gib"] / base["peak_alloc_gib"] - 1) if base and base["peak_alloc_gib"] else None
        dt = (r["real_tokens_per_s"] / base["real_tokens_per_s"]) if base else None
        r["peak_vs_baseline"], r["tok_s_vs_baseline"] = dm, dt
        print(f"{r['row']:<16} {r['real_tokens_per_s']:>10,.0f} {r['peak_alloc_gib']:>14.2f} "
              f"{'-' if dm is None else f'{dm:+.1%}':>12} {'-' if dt is None else f'{dt:.2f}x':>12}")
    met = [r for r in rows if r.get("peak_vs_baseline") is not None and r["row"] != "baseline"
           and r["peak_vs_baseline"] <= GOALS["peak_vs_baseline_max"]
           and r["tok_s_vs_baseline"] >= GOALS["tok_s_vs_baseline_min"]]
    return Record(suite="memory", study="memory headline, technique by technique", command=a.command,
                  machine=machine_info(), rows=rows, goals=GOALS, goal_met={"some_row_meets_both": bool(met)},
                  settings={"recipe": a.recipe, "steps": a.steps, "docs": a.docs, "only": sorted(only)})
