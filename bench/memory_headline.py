"""Memory headline on the GPU: peak memory and tokens/s of the same recipe and token budget, technique by technique.

    python bench/memory_headline.py bench/results/memory_headline_350m.json [--recipe 350m-h200] [--steps 16]

Rows (each a fresh process through `packtrain.train.loop.train`, synthetic lognormal packed data):
  baseline      fp32, no activation checkpointing, standard loss, sdpa (varlen needs bf16/fp16), no compile
  +amp          bf16 autocast, varlen attention, torch.compile
  +ckpt         + full activation checkpointing
  +fused-loss   + fused linear cross-entropy (no full logits)
  +zero3-offload  + DeepSpeed ZeRO-3 with optimizer and parameter CPU offload (compile off)
  optimized     packtrain's memory-optimized setting: bf16 + varlen + compile + every-2nd-layer checkpointing
                + fused loss (no offload: on one GPU it costs more time than it saves memory)
Prints a table with the change vs. baseline; the seed's target: ≥ 60% less peak memory at ≥ baseline tok/s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--recipe", default="350m-h200")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--docs", type=int, default=6000)
    p.add_argument("--only", default="", help="comma-separated row names")
    p.add_argument("--timeout", type=int, default=300)
    a = p.parse_args(argv)

    from train_gpu_smoke import _child

    from packtrain.config import load_run_config
    from packtrain.train.synthetic import make_synthetic_inputs

    cfg = load_run_config(a.recipe)
    work = Path(tempfile.mkdtemp(prefix="packtrain-memhead-"))
    make_synthetic_inputs(work, n_docs=a.docs, vocab_size=cfg.tokenize.vocab_size, budget=cfg.pack.budget)
    only = {x for x in a.only.split(",") if x}
    command = "python bench/memory_headline.py " + " ".join(argv or sys.argv[1:])
    rows = []
    for name, attn, overrides, extra in ROWS:
        if only and name not in only:
            continue
        spec = {"kind": "run", "recipe": a.recipe, "overrides": overrides, "data": str(work),
                "out": str(work / f"run-{name}"), "attention": attn, "steps": a.steps, **extra}
        r = _child(spec, a.timeout)
        r = {"row": name, **{k: r.get(k) for k in ("attention", "precision", "engine", "zero_stage", "offload",
                                                   "compile", "real_tokens_per_s", "peak_alloc_gib",
                                                   "peak_reserved_gib", "fragmentation", "useful_mfu",
                                                   "final_loss", "error", "stderr_tail")},
             "overrides": overrides, "command": command}
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "stderr_tail"}), flush=True)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(rows, indent=2) + "\n")
    base = next((r for r in rows if r["row"] == "baseline" and not r.get("error")), None)
    print(f"\n{'row':<16} {'tok/s':>10} {'peak alloc GiB':>14} {'vs baseline':>12} {'tok/s vs base':>13}")
    for r in rows:
        if r.get("error"):
            print(f"{r['row']:<16} ERROR {str(r['error'])[:80]}")
            continue
        dm = (r["peak_alloc_gib"] / base["peak_alloc_gib"] - 1) if base else float("nan")
        dt = (r["real_tokens_per_s"] / base["real_tokens_per_s"]) if base else float("nan")
        r["peak_vs_baseline"], r["tok_s_vs_baseline"] = dm, dt
        print(f"{r['row']:<16} {r['real_tokens_per_s']:>10,.0f} {r['peak_alloc_gib']:>14.2f} {dm:>+12.1%} {dt:>12.2f}x")
    Path(a.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
