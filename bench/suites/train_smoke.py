"""GPU smoke run of the train stage: every attention backend on the 350M recipe, bf16 isolation, DeepSpeed.

    python -m bench train-smoke --out bench/results/train_gpu_smoke.json [--steps 30] [--recipe 350m-h200]
        [--backends sdpa,flex,varlen] [--ds-steps 8] [--no-deepspeed] [--no-compile] [--docs 6000]
    python -m bench train-smoke --smoke --out /tmp/ts     # CPU: tiny model, sdpa, fp32 isolation, no DeepSpeed

1. Synthetic packed data once: lognormal document lengths (median budget/4, σ=1), a learnable Markov chain,
   bfd-packed at the recipe's budget (packtrain.testing.synthetic_inputs).
2. Isolation in bf16 for each backend on a small GQA model: max |doc-in-pack − doc-alone| logit error, next
   to the error plain causal attention would make (packtrain.testing.gpu_smoke.isolation_error).
3. `--steps` steps of the recipe per backend (torch engine, recipe precision/compile), then DeepSpeed ZeRO-2 and
   ZeRO-3 + CPU offload of optimizer and parameters for `--ds-steps` steps (varlen if available, else sdpa;
   compile off). Each run is a fresh subprocess, so peak memory and DeepSpeed state are per run.
4. One record with the environment, isolation errors (`isolation`), and per run (`rows`): real tokens/s, step
   time, MFU, peak allocated/reserved GiB, recompiles, losses. A failing run is recorded with its error, and
   goal_met says whether every isolation check and run passed.

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

from bench.harness import Record, machine_info

SUMMARY = "the train stage on every attention backend + DeepSpeed ZeRO-2/3: bf16 isolation, tok/s, peak memory"
DEVICE = "gpu"
REPO = Path(__file__).resolve().parents[2]
SMOKE_MODEL = ["model.hidden_size=64", "model.intermediate_size=176", "model.num_layers=2", "model.num_heads=4",
               "model.num_kv_heads=2", "train.device=cpu", "train.precision=fp32", "train.loss=chunked",
               "pack.budget=256", "train.rows=2", "tokenize.vocab_size=512"]
"""--smoke: the recipe at a tiny size on the CPU (fp32: the CPU has no bf16 isolation tolerance to check)."""

ISOLATION_TOL = 0.05
"""bf16 logits of a 4-layer model: the pack-vs-alone error is kernel rounding (~1e-2); a leak is ≥ 0.5."""


def _run_one(spec: dict) -> dict:
    from packtrain.config import load_run_config
    from packtrain.testing.gpu_smoke import isolation_error, smoke_run

    if spec["kind"] == "isolation":
        r = isolation_error(spec["backend"], spec.get("device", "cuda"), spec.get("precision", "bf16"))
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
    cmd = [sys.executable, "-m", "bench.suites.train_smoke", "--run-one", json.dumps(spec), "--result", result_path,
           "--stack-after", str(max(10, timeout - 15))]
    try:   # from the repository root, where `bench` is
        proc = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True, cwd=REPO)
        text = Path(result_path).read_text() if Path(result_path).stat().st_size else ""
        if proc.returncode == 0 and text:
            return json.loads(text)
        return {**spec, "error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-4000:]}
    except subprocess.TimeoutExpired as e:   # the child dumped its stacks shortly before: keep them
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return {**spec, "error": f"timed out after {timeout} s", "stderr_tail": err[-6000:]}
    finally:
        Path(result_path).unlink(missing_ok=True)


def child_main(argv: list[str] | None = None) -> int:
    """One spec in this process (`python -m bench.suites.train_smoke --run-one SPEC --result FILE`)."""
    p = argparse.ArgumentParser()
    p.add_argument("--run-one", required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--stack-after", type=float)
    a = p.parse_args(argv)
    if a.stack_after:   # a run about to time out prints where it is stuck (compile? a kernel?)
        import faulthandler

        faulthandler.dump_traceback_later(a.stack_after, exit=False)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    Path(a.result).write_text(json.dumps(_run_one(json.loads(a.run_one))))
    return 0


def add_arguments(p) -> None:
    p.add_argument("--recipe", default="350m-h200")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--ds-steps", type=int, default=8)
    p.add_argument("--backends", default="sdpa,flex,varlen")
    p.add_argument("--docs", type=int, default=6000, help="synthetic documents (median 512 tokens at budget 2048)")
    p.add_argument("--no-deepspeed", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")


def run(a, out: Path) -> Record:
    import torch

    from packtrain.config import load_run_config
    from packtrain.model.attention import available_backends
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs

    device, overrides = "cuda", []
    if a.smoke:
        device, overrides, a.backends, a.no_deepspeed, a.steps, a.docs = "cpu", SMOKE_MODEL, "sdpa", True, 2, 200
    elif not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device: this suite runs on the GPU machine (or pass --smoke)")
    cfg = load_run_config(a.recipe, overrides)
    avail = available_backends(device, cfg.train.precision)
    backends = [b for b in a.backends.split(",") if b]
    record = Record(suite="train-smoke", study="the train stage on every attention backend + DeepSpeed",
                    command=a.command, machine=machine_info(),
                    settings={"recipe": a.recipe, "overrides": overrides, "steps": a.steps, "ds_steps": a.ds_steps,
                              "backends": backends, "deepspeed": not a.no_deepspeed, "docs": a.docs},
                    goals={"isolation_max_abs_err": ISOLATION_TOL, "runs_without_error": True},
                    extra={"recipe": a.recipe, "available_backends": avail, "isolation": []})
    work = Path(tempfile.mkdtemp(prefix="packtrain-smoke-"))
    print(f"synthetic data → {work}", file=sys.stderr)
    make_synthetic_inputs(work, n_docs=a.docs, vocab_size=cfg.tokenize.vocab_size, budget=cfg.pack.budget)
    iso = {"device": device, "precision": "fp32"} if a.smoke else {}
    specs = [{"kind": "isolation", "backend": b, **iso} for b in backends if b in avail]
    compile_ = False if a.no_compile or a.smoke else None
    specs += [{"kind": "run", "recipe": a.recipe, "overrides": overrides, "data": str(work),
               "out": str(work / f"run-{b}"), "attention": b, "steps": a.steps, "compile": compile_}
              for b in backends if b in avail]
    if not a.no_deepspeed:
        ds_attn = "varlen" if "varlen" in avail else "sdpa"
        for stage, offload in ((2, False), (3, True)):
            specs.append({"kind": "run", "recipe": a.recipe, "data": str(work), "attention": ds_attn,
                          "out": str(work / f"run-ds{stage}{'-offload' if offload else ''}"), "steps": a.ds_steps,
                          "engine": "deepspeed", "zero_stage": stage, "offload": offload, "compile": False})
    for b in backends:
        if b not in avail:
            record.rows.append({"attention": b, "error": f"not available here (available: {avail})"})
    failed = False
    for spec in specs:
        print(f"→ {json.dumps({k: v for k, v in spec.items() if k not in ('data', 'out', 'recipe')})}",
              file=sys.stderr, flush=True)
        try:   # each spec in a fresh interpreter (per-run peaks, DeepSpeed state); --smoke: in this one
            r = _run_one(spec) if a.smoke else _child(spec, a.timeout)
        except Exception:  # noqa: BLE001 - record and continue with the next run
            r = {**spec, "error": traceback.format_exc()[-2000:]}
        failed |= bool(r.get("error")) or r.get("ok") is False
        (record.extra["isolation"] if spec["kind"] == "isolation" else record.rows).append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    record.goal_met = {"isolation": all(r.get("ok") for r in record.extra["isolation"]),
                       "runs_without_error": not failed}
    print(json.dumps({"failed": failed, "runs": [
        {k: r.get(k) for k in ("attention", "engine", "zero_stage", "real_tokens_per_s", "peak_alloc_gib",
                               "recompiles", "error")} for r in record.rows]}, indent=1))
    return record


if __name__ == "__main__":
    sys.exit(child_main())
