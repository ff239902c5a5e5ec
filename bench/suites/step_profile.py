"""Where one packtrain training step goes: a torch.profiler trace of a few steady steps, kernels grouped by kind.

    python -m bench step-profile --model qwen2-0.5b --out bench/results/step_profile_qwen2_0.5b.json
    python -m bench step-profile --smoke --out /tmp/sp        # CPU: tiny Llama, CPU ops instead of kernels
                                                              # (the fused loss eager: its ops land in head/loss)

The model, data and settings are gpu-throughput's packtrain variant (the product's train loop: varlen, bf16,
per-layer compile, fused loss, fused AdamW; a real family's shape as a random-init checkpoint). After `--warmup`
steps (compile included) `--steps` steps run under the profiler; per step it reports the wall time (synchronised),
the device time of every kernel kind and its share of the wall, the device-idle share (wall − Σ kernel time, an
upper bound on launch gaps and host waits: kernels on two streams overlapping would lower it) and the kernel
count, plus the heaviest kernels by name. Kinds:

    head       the LM head's matmuls: GEMM kernels launched inside the head + loss (below)
    loss       every other kernel launched there, and by name anywhere: packtrain's compiled cross-entropy
               (inductor names it after its ops, e.g. triton_red_fused__to_copy_…_logsumexp_…), softmax /
               log-softmax / cross-entropy / nll kernels, Liger's cross-entropy and gradient-scaling kernels
    gemm       cuBLAS / CUTLASS / nvjet matmuls          attention  flash / fmha kernels
    norm       RMSNorm kernels: Liger's, and inductor's …_mul_pow_sum_… (the fused RMSNorm, named after its ops)
    optimizer  fused AdamW / multi-tensor apply
    fused      the other inductor (triton_*) kernels      copy       memcpy / memset / copies
    other      everything else

"Inside the head + loss" is by the profile's op tree, not by name (a matmul kernel's name does not say which
matmul): a kernel whose launching op runs under HEAD_LOSS_OPS — packtrain's fused loss (`train.loss=fused`,
`train.loss_kernel=torch`: the autograd Function FusedLinearCE, whose forward holds the head matmuls, the
compiled loss kernel and the gradient matmuls; its backward only scales) or Liger's. The chunked and standard
losses run plain ops under no such range: their head matmuls count as gemm, their log-softmax kernels as loss.
Otherwise the first kind whose name pattern matches (KINDS).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from bench.harness import Record, machine_info

SUMMARY = "one packtrain step under torch.profiler: device time by kernel kind, idle share, heaviest kernels"
DEVICE = "gpu"

GEMM = r"gemm|cutlass|nvjet|xmma|cublas|sm90_|matmul|addmm|\bmm\b"
KINDS = (("attention", r"flash|fmha|attn"),
         ("loss", r"liger_cross|element_mul_kernel|cross_entropy|log_softmax|softmax|logsumexp|nll_loss"),
         ("norm", r"rms|layer_norm|norm_|pow_sum"), ("optimizer", r"adam|multi_tensor"), ("gemm", GEMM),
         ("copy", r"memcpy|memset|copy"), ("fused", r"^triton_|triton"))
HEAD_LOSS_OPS = ("FusedLinearCE", "LigerFusedLinearCrossEntropyFunction")
"""Ranges (autograd Functions: the profiler names a forward by its class, the backward CLASSBackward) whose
kernels are the LM head + loss: packtrain.train.fused_loss's and Liger's fused linear cross-entropy."""


def kind_of(name: str, in_head_loss: bool = False) -> str:
    """The kind of a kernel (module doc); `in_head_loss`: launched under a HEAD_LOSS_OPS range.

    >>> kind_of("flash_fwd_kernel"), kind_of("nvjet_tst_128x256"), kind_of("triton_poi_fused_add_0"), kind_of("x")
    ('attention', 'gemm', 'fused', 'other')
    >>> kind_of("nvjet_tst_128x256", in_head_loss=True), kind_of("triton_poi_fused_mul_0", in_head_loss=True)
    ('head', 'loss')
    >>> kind_of("triton_per_fused__to_copy__unsafe_view_add_div_expand_mul_pow_sum_view_9")   # fused RMSNorm
    'norm'
    """
    low = name.lower()
    if in_head_loss:
        return "head" if re.search(GEMM, low) else "loss"
    return next((k for k, pat in KINDS if re.search(pat, low)), "other")


def in_head_loss(event) -> bool:
    """Whether a profiler event (torch.autograd.profiler_util.FunctionEvent) is, or runs under, a HEAD_LOSS_OPS
    range (forward or backward)."""
    while event is not None:
        if event.name.removeprefix("autograd::engine::evaluate_function: ").removesuffix("Backward") in HEAD_LOSS_OPS:
            return True
        event = event.cpu_parent
    return False


def head_loss_kernels(events, cuda: bool) -> dict[str, tuple[int, float]]:
    """{kernel name: (calls, ms)} of what ran inside the head + loss: on CUDA the device kernels of the ops under
    a HEAD_LOSS_OPS range, on the CPU those ops' own time."""
    out: dict[str, tuple[int, float]] = {}

    def add(name: str, us: float) -> None:
        calls, ms = out.get(name, (0, 0.0))
        out[name] = (calls + 1, ms + us / 1e3)

    for e in events:
        if not in_head_loss(e):
            continue
        if cuda:
            for k in e.kernels:
                add(k.name, k.duration)
        elif e.self_cpu_time_total > 0:
            add(e.key, e.self_cpu_time_total)
    return out


def add_arguments(p) -> None:
    p.add_argument("--model", default="qwen2-0.5b", help="a gpu-throughput size (350m, 1b, qwen2-0.5b, …)")
    p.add_argument("--steps", type=int, default=3, help="steps profiled")
    p.add_argument("--warmup", type=int, default=6, help="steps before the profile (compile, allocator)")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--loss", default="fused")
    p.add_argument("--top", type=int, default=20, help="kernels listed by name")
    p.add_argument("--packtrain-set", action="append", default=[], metavar="KEY=VALUE")


def _profiled_steps(first: int, n: int, cuda: bool, box: dict):
    """Wrap packtrain.train.loop.run_step: steps first … first+n−1 (0-based) run under torch.profiler; `box` gets
    the profiler and the synchronised wall time of those steps. Restored by the returned undo()."""
    import torch

    from packtrain.train import loop

    inner = loop.run_step
    seen = {"n": 0}

    def run_step(*a, **kw):
        k = seen["n"]
        seen["n"] += 1
        if k == first:
            if cuda:
                torch.cuda.synchronize()
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
            box["prof"] = torch.profiler.profile(activities=acts)
            box["prof"].__enter__()
            box["t0"] = time.perf_counter()
        out = inner(*a, **kw)
        if k == first + n - 1:
            if cuda:
                torch.cuda.synchronize()
            box["wall_s"] = time.perf_counter() - box["t0"]
            box["prof"].__exit__(None, None, None)
        return out

    loop.run_step = run_step

    def undo() -> None:
        loop.run_step = inner

    return undo


def summarize(prof, wall_s: float, steps: int, cuda: bool, top: int) -> dict:
    """Per-step device time by kind, the idle share and the heaviest kernels of a finished profile."""
    from torch.autograd import DeviceType

    inside = head_loss_kernels(prof.events(), cuda)
    rows = []   # (name, kind, calls, ms): a kernel's time inside the head + loss apart from the rest of its time
    for e in prof.key_averages():
        if cuda:
            if e.device_type != DeviceType.CUDA:
                continue
            t_us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        else:
            t_us = e.self_cpu_time_total
        if t_us <= 0:
            continue
        calls, ms = int(e.count), float(t_us) / 1e3
        in_calls, in_ms = inside.get(e.key, (0, 0.0))
        in_calls, in_ms = min(in_calls, calls), min(in_ms, ms)
        if in_ms > 0:
            rows.append((e.key, kind_of(e.key, in_head_loss=True), in_calls, in_ms))
        if ms - in_ms > 0:
            rows.append((e.key, kind_of(e.key), calls - in_calls, ms - in_ms))
    step_ms = wall_s * 1e3 / steps
    by_kind: dict[str, float] = {}
    for _, kind, _, ms in rows:
        by_kind[kind] = by_kind.get(kind, 0.0) + ms / steps
    busy = sum(by_kind.values())
    return {
        "step_ms": round(step_ms, 3),
        "device_ms_by_kind": {k: round(v, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "share_of_step": {k: round(v / step_ms, 4) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "busy_ms": round(busy, 3), "idle_share": round(max(0.0, 1 - busy / step_ms), 4) if cuda else None,
        "kernels_per_step": round(sum(c for _, _, c, _ in rows) / steps, 1),
        "top": [{"name": n[:160], "kind": k, "calls_per_step": round(c / steps, 2), "ms_per_step": round(ms / steps, 3)}
                for n, k, c, ms in sorted(rows, key=lambda r: -r[3])[:top]],
    }


def run(args, out: Path) -> Record:
    import argparse

    import torch

    from bench.suites import gpu_throughput as gt

    opts = argparse.Namespace(model=args.model, layers=None, vocab=None, attention="varlen", loss=args.loss,
                              no_compile=False, peak_tflops=790.0, seed=0, packtrain_set=list(args.packtrain_set))
    rows, budget, model, steps, warmup = args.rows, args.budget, args.model, args.steps, args.warmup
    if args.smoke:
        rows, budget, model, steps, warmup = 1, 128, "tiny", 1, 1
        vars(opts).update(model="tiny", attention="sdpa", loss="fused", no_compile=True, vocab=512)
    spec = gt.model_spec(model, opts)
    vocab = opts.vocab or spec.get("vocab_size", 32768)
    device = torch.device("cpu" if args.smoke else "cuda")
    cuda = device.type == "cuda"
    n_docs = 400 if args.smoke else max(20000, (steps + warmup) * rows * 12)
    lengths = gt.make_lengths("lognormal", n_docs, budget, 0, None)
    docs = gt.doc_tokens(lengths, vocab, 0)
    box: dict = {}
    undo = _profiled_steps(warmup, steps, cuda, box)
    try:
        row = gt.run_packtrain_variant(model, vocab, docs, rows, budget, steps, warmup, device, opts)
    finally:
        undo()
    if "prof" not in box or "wall_s" not in box:
        raise SystemExit(f"step-profile: the run ended before step {warmup + steps} (rows {rows}, budget {budget})")
    prof = summarize(box["prof"], box["wall_s"], steps, cuda, args.top)
    # the run's own tok/s and MFU are medians over a handful of steps, the profiled ones among them: not
    # throughput figures (gpu-throughput measures those), so only what the profile does not distort is kept
    prof.update({"recompiles": row["recompiles"], "peak_alloc_gib": row["peak_alloc_gib"]})
    return Record(suite="step-profile", study=f"{model}, {rows} × {budget} packed tokens, loss {opts.loss}: "
                  f"{steps} steps profiled after {warmup}", command=args.command, machine=machine_info(),
                  settings={"model": model, "rows": rows, "budget": budget, "steps": steps, "warmup": warmup,
                            "loss": opts.loss, "set": list(args.packtrain_set)},
                  rows=[prof], smoke=bool(args.smoke))
