"""GPU smoke run of the train stage: every attention backend on the 350M recipe, bf16 isolation, DeepSpeed.

    python bench/train_gpu_smoke.py bench/results/train_gpu_smoke.json [--steps 30] [--recipe 350m-h200]
        [--backends sdpa,flex,varlen] [--ds-steps 8] [--no-deepspeed] [--no-compile] [--docs 6000]

1. Synthetic packed data once: lognormal document lengths (median budget/4, σ=1), a learnable Markov chain,
   bfd-packed at the recipe's budget (packtrain.train.synthetic).
2. Isolation in bf16 for each backend on a small GQA model: max |doc-in-pack − doc-alone| logit error, next
   to the error plain causal attention would make (packtrain.train.smoke.isolation_error).
3. `--steps` steps of the recipe per backend (torch engine, recipe precision/compile), then DeepSpeed ZeRO-2 and
   ZeRO-3 + CPU offload of optimizer and parameters for `--ds-steps` steps (varlen if available, else sdpa;
   compile off). Each run is a fresh subprocess, so peak memory and DeepSpeed state are per run.
4. One JSON with the environment, isolation errors, and per run: real tokens/s, step time, MFU, peak
   allocated/reserved GiB, recompiles, losses. A failing run is recorded with its error; the exit code is 1
   if any isolation check or run failed.

Needs torch (CUDA), transformers, numpy, pydantic, pyyaml, tokenizers, safetensors, tqdm; deepspeed for step 3's
DeepSpeed runs (skipped and noted when missing). Not mlflow, not kfp.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

ISOLATION_TOL = 0.05
"""bf16 logits of a 4-layer model: the pack-vs-alone error is kernel rounding (~1e-2); a leak is ≥ 0.5."""


def _run_one(spec: dict) -> dict:
    from packtrain.config import load_run_config
    from packtrain.train.smoke import isolation_error, smoke_run

    if spec["kind"] == "isolation":
        r = isolation_error(spec["backend"], "cuda", "bf16")
        r["ok"] = r["max_abs_err"] <= ISOLATION_TOL and r["max_abs_err"] < 0.1 * max(r["leak_abs_err"], 1e-9)
        return r
    cfg = load_run_config(spec["recipe"], spec.get("overrides", []))
    data = Path(spec["data"])
    return smoke_run(cfg, data / "tokenize", data / "pack", Path(spec["out"]), spec["attention"], spec["steps"],
                     engine=spec.get("engine", "torch"), zero_stage=spec.get("zero_stage", 2),
                     offload=spec.get("offload", False), compile=spec.get("compile"))


def _child(spec: dict, timeout: int) -> dict:
    """Run one spec in a fresh interpreter; its JSON result comes back through a file."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as f:
        result_path = f.name
    cmd = [sys.executable, __file__, "--run-one", json.dumps(spec), "--result", result_path,
           "--stack-after", str(max(10, timeout - 15))]
    try:
        proc = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True)
        text = Path(result_path).read_text() if Path(result_path).stat().st_size else ""
        if proc.returncode == 0 and text:
            return json.loads(text)
        return {**spec, "error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-4000:]}
    except subprocess.TimeoutExpired as e:   # the child dumped its stacks shortly before: keep them
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return {**spec, "error": f"timed out after {timeout} s", "stderr_tail": err[-6000:]}
    finally:
        Path(result_path).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", nargs="?", help="JSON path for the results")
    p.add_argument("--recipe", default="350m-h200")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--ds-steps", type=int, default=8)
    p.add_argument("--backends", default="sdpa,flex,varlen")
    p.add_argument("--docs", type=int, default=6000, help="synthetic documents (median 512 tokens at budget 2048)")
    p.add_argument("--no-deepspeed", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument("--run-one", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--stack-after", type=float, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.run_one:
        if a.stack_after:   # a run about to time out prints where it is stuck (compile? a kernel?)
            import faulthandler

            faulthandler.dump_traceback_later(a.stack_after, exit=False)
        result = _run_one(json.loads(a.run_one))
        Path(a.result).write_text(json.dumps(result))
        return 0
    if not a.out:
        p.error("the output JSON path is required")

    import torch

    from packtrain.config import load_run_config
    from packtrain.model.attention import available_backends
    from packtrain.train.smoke import cuda_environment
    from packtrain.train.synthetic import make_synthetic_inputs

    if not torch.cuda.is_available():
        print("error: no CUDA device: this benchmark runs on the GPU machine", file=sys.stderr)
        return 2
    cfg = load_run_config(a.recipe)
    avail = available_backends("cuda", cfg.train.precision)
    backends = [b for b in a.backends.split(",") if b]
    report: dict = {"recipe": a.recipe, "environment": cuda_environment(), "available_backends": avail,
                    "isolation": [], "runs": []}
    work = Path(tempfile.mkdtemp(prefix="packtrain-smoke-"))
    print(f"synthetic data → {work}", file=sys.stderr)
    make_synthetic_inputs(work, n_docs=a.docs, vocab_size=cfg.tokenize.vocab_size, budget=cfg.pack.budget)
    specs = [{"kind": "isolation", "backend": b} for b in backends if b in avail]
    compile_ = False if a.no_compile else None
    specs += [{"kind": "run", "recipe": a.recipe, "data": str(work), "out": str(work / f"run-{b}"),
               "attention": b, "steps": a.steps, "compile": compile_} for b in backends if b in avail]
    if not a.no_deepspeed:
        ds_attn = "varlen" if "varlen" in avail else "sdpa"
        for stage, offload in ((2, False), (3, True)):
            specs.append({"kind": "run", "recipe": a.recipe, "data": str(work), "attention": ds_attn,
                          "out": str(work / f"run-ds{stage}{'-offload' if offload else ''}"), "steps": a.ds_steps,
                          "engine": "deepspeed", "zero_stage": stage, "offload": offload, "compile": False})
    for b in backends:
        if b not in avail:
            report["runs"].append({"attention": b, "error": f"not available here (available: {avail})"})
    failed = False
    for spec in specs:
        print(f"→ {json.dumps({k: v for k, v in spec.items() if k not in ('data', 'out', 'recipe')})}",
              file=sys.stderr, flush=True)
        try:
            r = _child(spec, a.timeout)
        except Exception:  # noqa: BLE001 - record and continue with the next run
            r = {**spec, "error": traceback.format_exc()[-2000:]}
        failed |= bool(r.get("error")) or r.get("ok") is False
        report["isolation" if spec["kind"] == "isolation" else "runs"].append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(report, indent=2) + "\n")   # partial results survive a crash
    print(json.dumps({"out": a.out, "failed": failed, "runs": [
        {k: r.get(k) for k in ("attention", "engine", "zero_stage", "real_tokens_per_s", "peak_alloc_gib",
                               "recompiles", "error")} for r in report["runs"]]}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
