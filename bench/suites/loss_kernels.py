"""The LM head + cross-entropy alone, every implementation side by side on the real shapes: time, memory, error.

    python -m bench loss-kernels --out bench/results/loss_kernels.json          # H200, ~1-2 min
    python -m bench loss-kernels --smoke --out /tmp/lk                           # CPU: small shapes, seconds

For each shape, N = rows × budget hidden states h (N, H) in bf16 and an LM-head weight w (V, H) held in fp32
(the master weight, as under bf16 autocast) run forward + backward under bf16 autocast through:

    liger            train.loss=fused, train.loss_kernel=liger (Liger's Triton FLCE; its chunk is N / ⌈V/H⌉)
    torch@C          train.loss=fused, train.loss_kernel=torch, train.loss_chunk_tokens=C (train/fused_loss.py)
    chunked@2048     train.loss=chunked (checkpointed chunks, logits recomputed in backward)

Reported per (shape, implementation): the median ms of `--repeats` timed calls after 3 warm-ups (synchronised;
compile happens in the warm-ups), the peak memory above the inputs (GiB), and the relative error of the loss and
of both gradients against an fp32 reference on the same bf16-rounded inputs (full fp32 logits), so "faster" is
never "less exact". The head's FLOPs (6·N·H·V; 4·N·H·V for a frozen head) over the time give its TFLOP/s.

Shapes: qwen2-0.5b (H 896, V 151,936, tied), gemma3-1b (H 1152, V 262,144: a Gemma-style 256k vocabulary),
llama-1b (H 2048, V 32,768: the 1b recipe's), llama3-8b-lora (H 4096, V 128,256, frozen head).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from bench.harness import Record, machine_info

SUMMARY = "LM head + cross-entropy alone: Liger vs packtrain's fused kernel vs chunked — ms, memory, error"
DEVICE = "gpu"

SHAPES = {  # name: (H, V, head trains)
    "qwen2-0.5b": (896, 151_936, True),
    "gemma3-1b": (1152, 262_144, True),
    "llama-1b": (2048, 32_768, True),
    "llama3-8b-lora": (4096, 128_256, False),
}
SMOKE_SHAPES = {"tiny": (64, 512, True), "tiny-frozen": (64, 512, False)}


def add_arguments(p) -> None:
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--tokens", type=int, default=8 * 2048, help="N hidden states a call (8 × 2048)")
    p.add_argument("--chunks", default="2048,4096,8192,16384", help="loss_chunk_tokens values for the torch kernel")
    p.add_argument("--impls", default="liger,torch,chunked", help="which implementations")
    p.add_argument("--repeats", type=int, default=10)


def _loss_fn(impl: str, chunk: int):
    """(h, w, targets) → loss sum, through the product's own modules."""
    from packtrain.train.fused_loss import fused_linear_ce_sum
    from packtrain.train.loss import fused_loss_fn, lm_loss_sum

    if impl == "liger":
        liger = fused_loss_fn()
        if liger is None:
            return None

        def run(h, w, t):
            return liger(w.to(h.dtype), h, t).float()
        return run
    if impl == "torch":
        return lambda h, w, t: fused_linear_ce_sum(h, w, t, chunk)
    import torch

    class Head(torch.nn.Module):
        def __init__(self, w):
            super().__init__()
            self.weight = w

        def forward(self, x):
            return torch.nn.functional.linear(x, self.weight)
    return lambda h, w, t: lm_loss_sum(h, Head(w), torch.cat([t.new_full((1,), -100), t[:-1]]), chunk)


def _reference(h, w, t):
    """fp32 loss and gradients from full fp32 logits of the same (bf16-rounded) inputs."""
    import torch
    import torch.nn.functional as F

    h32 = h.detach().float().requires_grad_()
    w32 = w.detach().to(torch.bfloat16).float().requires_grad_(w.requires_grad)
    loss = F.cross_entropy(h32 @ w32.t(), t, ignore_index=-100, reduction="sum")
    loss.backward()
    out = (loss.detach(), h32.grad, w32.grad if w.requires_grad else None)
    del h32, w32
    return out


def _rel(a, b) -> float | None:
    if a is None or b is None:
        return None
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def measure(impl: str, chunk: int, h0, w0, t, repeats: int, ref, cuda: bool) -> dict:
    import torch

    fn = _loss_fn(impl, chunk)
    if fn is None:
        return {"error": "liger-kernel is not installed"}
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dev = h0.device.type

    def call():
        h = h0.detach().requires_grad_()
        w = w0.detach().requires_grad_(w0.requires_grad)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=cuda):
            loss = fn(h, w, t)
        loss.backward()
        return loss.detach(), h.grad, w.grad

    try:
        for _ in range(3):
            out = call()
        sync()
        base = torch.cuda.memory_allocated() if cuda else 0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            out = call()
            sync()
            times.append(time.perf_counter() - t0)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else None
    except torch.OutOfMemoryError as e:
        return {"error": f"OOM: {str(e)[:200]}"}
    loss, gh, gw = out
    return {"ms": round(statistics.median(times) * 1e3, 3), "peak_above_inputs_gib": peak and round(peak, 3),
            "loss_rel_err": _rel(loss, ref[0]), "grad_h_rel_err": _rel(gh, ref[1]), "grad_w_rel_err": _rel(gw, ref[2])}


def run(args, out: Path) -> Record:
    import torch

    cuda = not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    shapes = SMOKE_SHAPES if args.smoke else {k: SHAPES[k] for k in args.shapes.split(",") if k}
    n = 256 if args.smoke else args.tokens
    chunks = [64, 256] if args.smoke else [int(c) for c in args.chunks.split(",") if c]
    impls = [i for i in args.impls.split(",") if i]
    repeats = 2 if args.smoke else args.repeats
    rows = []
    for name, (H, V, trains) in shapes.items():
        torch._dynamo.reset()   # a fresh compile cache per shape: dynamo's limit of 8 shapes a function would
        #                         otherwise send the later shapes to eager (a training run has one or two)
        g = torch.Generator(device=device).manual_seed(0)
        h = torch.randn(n, H, device=device, generator=g).to(torch.bfloat16 if cuda else torch.float32)
        w = (0.02 * torch.randn(V, H, device=device, generator=g)).requires_grad_(trains)
        t = torch.randint(0, V, (n,), device=device, generator=g)
        t[::97] = -100                                    # document starts
        t[-1] = -100                                      # the last position predicts nothing (loss.next_token_targets)
        ref = _reference(h, w, t)
        flops = (6 if trains else 4) * n * H * V
        for impl in impls:
            for chunk in (chunks if impl == "torch" else [2048]):
                r = measure(impl, chunk, h, w, t, repeats, ref, cuda)
                if "ms" in r:
                    r["head_tflops"] = round(flops / (r["ms"] / 1e3) / 1e12, 1)
                rows.append({"shape": name, "H": H, "V": V, "tokens": n, "head_trains": trains,
                             "impl": impl if impl != "torch" else f"torch@{chunk}",
                             "chunk": chunk if impl != "liger" else None, **r})
                print(rows[-1], flush=True)
                if cuda:
                    torch.cuda.empty_cache()
        del h, w, t, ref
    return Record(suite="loss-kernels", study=f"LM head + cross-entropy forward+backward on {n} tokens",
                  command=args.command, machine=machine_info(),
                  settings={"tokens": n, "shapes": list(shapes), "chunks": chunks, "impls": impls,
                            "repeats": repeats}, rows=rows, smoke=bool(args.smoke))
