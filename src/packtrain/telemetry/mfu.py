"""Model FLOPs utilization: FLOPs of a packed micro-batch, counted two ways, and the device's peak.

Counting (per micro-batch of `rows` packs of `budget` tokens; N = non-embedding parameters, L layers,
h hidden size, V vocabulary; sᵢ the real document segments; T_real = Σ sᵢ; T_slot = rows · budget):

    matmuls with weights   fwd 2N per token, bwd 4N            -> 6·N per token       (Kaplan et al. 2020, §2.1)
    LM head (vocab_size>0) fwd 2·h·V per token, ×3 for fwd+bwd -> 6·h·V per token
    attention, one layer, one sequence of length s:
        fwd: QKᵀ 2·s²·h + A·V 2·s²·h = 4·s²·h
        fwd+bwd (bwd = 2× fwd) = 3 · (2·2·s²·h) = 12·s²·h

    useful = (6N + 6hV) · T_real  + 12 · L · h · Σ sᵢ²          # only work inside documents
    dense  = (6N + 6hV) · T_slot  + 12 · L · h · rows · budget² # what an unpacked, unmasked kernel runs

Other families (packtrain.model.families): the attention term's h is heads · head_dim (Qwen3-0.6B: 2048 for
a hidden size of 1024), and a sliding-window layer (window W) counts sᵢ · min(sᵢ, W) instead of sᵢ² — its
kernel never computes scores further back than W (`model_flop_dims(config)` reads both off a config).

Causal halving: we count the full s² score matrix, NOT halved for the causal mask. This is the convention of
PaLM (Chowdhery et al. 2022, App. B: "6N + 12·L·H·Q·T" FLOPs per token), Megatron-LM (Narayanan et al. 2021,
eq. 3: the 1 + s/6h term) and nanoGPT/torchtitan, so packtrain's MFU compares with published numbers. A causal
FlashAttention kernel executes about half of those score FLOPs, so for a 350M Llama at s=2048 (h=1024, L=24,
N≈302M) the attention term is 12·24·1024·2048 = 0.60 GFLOP/token of 2.42 GFLOP/token (25%): under the
halved convention the same run would report ~12.5% lower MFU.

Example (the hand-computed case of tests/unit/test_telemetry_mfu.py)::

    >>> step_flops(1000, 2, 8, [3, 5], slot_tokens=16, budget=8, vocab_size=10)
    (58368.0, 128256.0)

FP8 (train.precision=fp8; docs/fp8.md): the decoder's converted linears (6·N_fp8 FLOPs per token) run at the
FP8 peak, everything else (attention, LM head, unconverted linears) at bf16's; MFU = ideal time / step time with
ideal = F_fp8/P_fp8 + (F − F_fp8)/P_bf16, i.e. F / step_time / `time_weighted_peak(F, F_fp8, P_fp8, P_bf16)`.

MFU = FLOPs / step_time / peak. `peak_flops` reads the datasheet table below (dense, no sparsity), or
`telemetry.peak_tflops` from the config (e.g. a measured 790 TFLOP/s bf16 on an H200), or for a CPU / an
unknown device measures a matmul once per process.

A measured peak is only as good as the moment it was measured: on a shared machine a probe that runs while other
processes hold the cores reads low, and the training steps that run later, when the cores are freer, then
"exceed" it (a CPU run reported MFU 102.79%). So (`estimate_peak`, `PeakEstimate`, `peak_note`):
- the probe is best-of-5 matmuls, taken before training and again after the last step (the estimate is the
  fastest of all); probes that disagree by more than 25%, or a load average above one runnable thread per core
  while probing, mark the estimate unreliable;
- MFU can never be reported above 100%: the summary's peak is at least the median steady step's useful FLOP
  rate (packtrain.telemetry.meter raises it, `peak_scale` > 1, and says so), whatever its source; each step's
  own value is capped at 1;
- the train summary carries `peak_tflops`, `peak_source`, `peak_reliable` and, when unreliable, `peak_note`
  (the `packtrain run` summary prints it next to the MFU).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

# Dense peak TFLOP/s by precision, from NVIDIA datasheets (SXM unless the name says otherwise).
# fp32 = plain CUDA-core FP32 (PyTorch's default: TF32 matmuls are off); tf32 = TF32 tensor cores.
# fp16 is taken equal to bf16 where a GPU has both. The first matching pattern wins: specific first.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    (r"GB200|\bB200\b", {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "tf32": 1100.0, "fp32": 80.0}),
    (r"H100.*PCIe", {"bf16": 756.0, "fp16": 756.0, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.2}),
    (r"H[12]00.*NVL", {"bf16": 835.0, "fp16": 835.0, "fp8": 1670.0, "tf32": 418.0, "fp32": 60.0}),
    (r"GH200|H100|H200|H800", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9}),
    (r"A100|A800", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"L40S", {"bf16": 362.1, "fp16": 362.1, "fp8": 733.0, "tf32": 183.0, "fp32": 91.6}),
    (r"\bL4\b", {"bf16": 121.0, "fp16": 121.0, "fp8": 242.0, "tf32": 60.0, "fp32": 30.3}),
    (r"A10G", {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2}),
    (r"\bA10\b", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (r"RTX 4090", {"bf16": 165.2, "fp16": 165.2, "fp8": 330.3, "tf32": 82.6, "fp32": 82.6}),
    (r"RTX 3090", {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6}),
    (r"V100", {"fp16": 125.0, "fp32": 15.7}),
    (r"\bT4\b", {"fp16": 65.0, "fp32": 8.1}),
    (r"MI300X", {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "tf32": 653.7, "fp32": 163.4}),
]

PRECISIONS = ("bf16", "fp16", "fp8", "tf32", "fp32")
_logged: set[tuple[str, str]] = set()


def step_flops(n_params_nonembed: int, n_layers: int, hidden_size: int, seq_lens: Sequence[int],
               slot_tokens: int, budget: int, vocab_size: int = 0, attn_width: int | None = None,
               windows: Sequence[int | None] | None = None) -> tuple[float, float]:
    """FLOPs of one forward+backward over a packed micro-batch: `(useful, dense)` (see module docstring).

    seq_lens: lengths of the real document segments (padding excluded), e.g. `PackedBatch.seq_lens`.
    slot_tokens: rows · budget, the micro-batch's full token count. A 350M model (N=302M, L=24, h=1024,
    V=32000) on 8 × 2048 slots all filled by 512-token documents: useful 3.54e13, dense 4.28e13.
    attn_width: heads · head_dim where it differs from hidden_size (Qwen3, Gemma). windows: per layer, a
    sliding window W (a token attends to at most W keys: s² becomes s·min(s, W)) or None; default all full.
    """
    if budget <= 0 or slot_tokens < 0 or slot_tokens % budget:
        raise ValueError(f"slot_tokens ({slot_tokens}) must be a non-negative multiple of budget ({budget})")
    real = sum(int(s) for s in seq_lens)
    if real > slot_tokens:
        raise ValueError(f"sum(seq_lens) = {real} exceeds slot_tokens = {slot_tokens}")
    wins: list[int | None] = list(windows) if windows is not None else [None] * n_layers
    if len(wins) != n_layers:
        raise ValueError(f"windows has {len(wins)} entries for {n_layers} layers")
    rows = slot_tokens // budget
    per_token = 6.0 * n_params_nonembed + 6.0 * hidden_size * vocab_size
    attn = 12.0 * (attn_width or hidden_size)
    useful = per_token * real
    dense = per_token * slot_tokens
    for w in set(wins):   # layers sharing a window share the sum
        k = wins.count(w)
        useful += attn * k * sum(int(s) * min(int(s), w or int(s)) for s in seq_lens)
        dense += attn * k * rows * budget * min(budget, w or budget)
    return useful, dense


def model_flop_dims(config) -> dict:
    """What `step_flops` needs from a transformers config, for every supported family: layers, hidden size,
    attention width (heads · head_dim), per-layer sliding windows and the LM head's vocabulary.

    >>> from transformers import LlamaConfig
    >>> model_flop_dims(LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=10))
    {'n_layers': 2, 'hidden_size': 64, 'vocab_size': 10, 'attn_width': 64, 'windows': (None, None)}
    """
    from packtrain.model.families import attention_semantics

    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return {"n_layers": int(config.num_hidden_layers), "hidden_size": int(config.hidden_size),
            "vocab_size": int(config.vocab_size), "attn_width": heads * head_dim,
            "windows": attention_semantics(config).windows}


def count_nonembedding_params(model) -> int:
    """Parameters of a torch model minus input/output embeddings (their compute is the 6·h·V term).

    Tied weights are counted once. A Llama with h=64, 2 layers, intermediate 176, vocab 4096 → 100,672
    (of 362,816 in total).
    """
    import torch

    skip: set[int] = set()
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding):
            skip.add(id(m.weight))
    get_out = getattr(model, "get_output_embeddings", None)
    out = get_out() if callable(get_out) else None
    if out is not None and getattr(out, "weight", None) is not None:
        skip.add(id(out.weight))
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen or id(p) in skip:
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def lookup_peak_tflops(device_name: str, precision: str) -> float | None:
    """Datasheet dense TFLOP/s for a device name such as 'NVIDIA H200' or None if unknown.

    >>> lookup_peak_tflops("NVIDIA H100 80GB HBM3", "bf16")
    989.4
    """
    for pattern, table in PEAK_TFLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            if precision in table:
                return table[precision]
            if precision == "bf16" and "fp32" in table:  # no bf16 tensor cores (V100, T4): runs as fp32
                return table["fp32"]
            return table.get("fp32")
    return None


PROBE_SPREAD = 0.25
"""Matmul probes whose fastest is more than 25% above their slowest were measured under contention."""


@dataclass(frozen=True)
class PeakEstimate:
    """The MFU denominator and where it came from."""

    flops: float                                    # peak FLOP/s (measured: the fastest probe)
    source: Literal["config", "datasheet", "measured"]
    probes: tuple[float, ...] = ()                  # measured: FLOP/s of every matmul probe, in order
    load_per_core: float | None = None              # measured: 1-minute load average / CPU count at the first probe
    device: str = ""                                # measured: where the probes ran ("cpu" | "cuda")
    precision: str = ""                             # measured: at which precision

    def reprobe(self) -> PeakEstimate:
        """The estimate after another round of probes (measured only; the peak is the fastest probe of all)."""
        if self.source != "measured":
            return self
        probes = (*self.probes, *probe_matmul_flops(self.device, self.precision))
        return PeakEstimate(max(probes), "measured", probes, self.load_per_core, self.device, self.precision)


def estimate_peak(device_name: str, precision: str = "bf16", override_tflops: float | None = None) -> PeakEstimate:
    """`peak_flops` with its provenance: `telemetry.peak_tflops` ("config") → the table ("datasheet") → matmul
    probes on the CPU or the current CUDA device ("measured", cached per process and thread count)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {PRECISIONS}")
    if override_tflops is not None:
        if override_tflops <= 0:
            raise ValueError(f"override_tflops must be > 0, got {override_tflops}")
        return PeakEstimate(float(override_tflops) * 1e12, "config")
    if device_name.lower() != "cpu":
        tflops = lookup_peak_tflops(device_name, precision)
        if tflops is not None:
            return PeakEstimate(tflops * 1e12, "datasheet")
    import torch

    where = "cpu" if device_name.lower() == "cpu" or not _cuda_available() else "cuda"
    probes, load = _cached_probes(where, precision, torch.get_num_threads())
    est = PeakEstimate(max(probes), "measured", probes, load, where, precision)
    if (device_name, precision) not in _logged:
        _logged.add((device_name, precision))
        log.warning("no datasheet peak for %r (%s): using a measured matmul, %.3g TFLOP/s; "
                    "set telemetry.peak_tflops to override", device_name, precision, est.flops / 1e12)
    return est


def peak_flops(device_name: str, precision: str = "bf16", override_tflops: float | None = None) -> float:
    """Peak dense FLOP/s used as the MFU denominator (`estimate_peak(...).flops`).

    Order: `override_tflops` (config `telemetry.peak_tflops`) → the table → a matmul measured once per
    process on the CPU ('cpu' or any name not in the table when no CUDA device is present) or on the current
    CUDA device. Measured numbers are an achieved-matmul ceiling, not a datasheet peak, and are logged once.
    """
    return estimate_peak(device_name, precision, override_tflops).flops


def peak_note(est: PeakEstimate, typical: float = 0.0, cpus: int | None = None) -> str | None:
    """Why MFU against `est` is not to be trusted, or None. `typical`: the median steady step's useful FLOP rate
    over `est.flops` (packtrain.telemetry.meter.ThroughputMeter.typical); above 1 the estimate is proven low.

    >>> peak_note(PeakEstimate(1e11, "measured", (1e11, 0.99e11), 0.5))   # agreeing probes, idle machine
    >>> peak_note(PeakEstimate(1e11, "measured", (0.6e11, 1e11), 0.5))
    'peak measured under contention: matmul probes 0.06-0.1 TFLOP/s disagree by 67%'
    >>> peak_note(PeakEstimate(1e11, "measured", (1e11, 1e11), 2.5), cpus=2)
    'peak measured under contention: load 5.0 on 2 cores while probing'
    >>> peak_note(PeakEstimate(1e11, "measured", (1e11,), 0.5), typical=1.0279)[:75]
    'peak measured under contention: the median training step ran 1.03x faster t'
    """
    tf = est.flops / 1e12
    if typical > 1.0:
        why = {"measured": "peak measured under contention: ", "config": "telemetry.peak_tflops too low: ",
               "datasheet": "datasheet peak too low for this device: "}[est.source]
        return (f"{why}the median training step ran {typical:.3g}x faster than the {est.source} peak "
                f"({tf:.3g} TFLOP/s); MFU is against that rate")
    if est.source != "measured":
        return None
    lo, hi = (min(est.probes), max(est.probes)) if est.probes else (est.flops, est.flops)
    if lo > 0 and hi / lo - 1 > PROBE_SPREAD:
        return (f"peak measured under contention: matmul probes {lo / 1e12:.3g}-{hi / 1e12:.3g} TFLOP/s disagree "
                f"by {hi / lo - 1:.0%}")
    if est.load_per_core is not None and est.load_per_core > 1.0:
        n = cpus or os.cpu_count() or 1
        return f"peak measured under contention: load {est.load_per_core * n:.1f} on {n} cores while probing"
    return None


def fp8_peak_flops(device_name: str, override_tflops: float | None = None) -> float:
    """FP8 dense peak FLOP/s for the FP8 matmuls of train.precision=fp8: the table's fp8 entry; with
    `telemetry.peak_tflops` (which is the bf16 peak) that override × the table's fp8/bf16 ratio (2.0 on Hopper);
    a device without an fp8 entry: 2 × its bf16 peak.

    >>> fp8_peak_flops("NVIDIA H200") / 1e12, round(fp8_peak_flops("NVIDIA H200", 790.0) / 1e12, 1)
    (1978.9, 1580.1)
    """
    bf16 = lookup_peak_tflops(device_name, "bf16") if device_name.lower() != "cpu" else None
    fp8 = None
    for pattern, table in PEAK_TFLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            fp8 = table.get("fp8")
            break
    ratio = fp8 / bf16 if fp8 and bf16 else 2.0
    if override_tflops is not None:
        return peak_flops(device_name, "bf16", override_tflops) * ratio
    if fp8:
        return fp8 * 1e12
    return peak_flops(device_name, "bf16") * ratio


def time_weighted_peak(flops: float, fp8_flops: float, peak_fp8: float, peak_bf16: float) -> float:
    """The one peak P under which flops / t / P = ideal time / t when `fp8_flops` of the `flops` run at
    `peak_fp8` and the rest at `peak_bf16`: P = F / (F₈/P₈ + (F − F₈)/P₁₆) — a harmonic, time-weighted mean.

    3B Llama with a 32,768-token vocabulary (docs/fp8.md's variant), 8×2048 full rows, dense: F = 3.216e14, F₈ = 6·2.819e9·16384 = 2.771e14 (86.1%) on an
    H200 (1978.9 / 989.4 TFLOP/s) → 1,738 TFLOP/s. No FP8 FLOPs → peak_bf16; all FP8 → peak_fp8.

    >>> round(time_weighted_peak(3.0, 2.0, 2.0, 1.0), 3)   # 2 FLOPs at 2/s + 1 at 1/s: ideal 2 s
    1.5
    """
    if flops <= 0:
        return peak_bf16
    f8 = min(max(fp8_flops, 0.0), flops)
    return flops / (f8 / peak_fp8 + (flops - f8) / peak_bf16)


def device_name(device=None) -> str:
    """'NVIDIA H200' for a CUDA device (default: the current one), 'cpu' otherwise."""
    import torch

    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return "cpu"


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


@functools.lru_cache(maxsize=8)
def _cached_probes(device: str, precision: str, threads: int) -> tuple[tuple[float, ...], float | None]:
    """The probes of the first estimate in this process for (device, precision, torch thread count), and the
    load average per core just before them."""
    try:
        load: float | None = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        load = None
    return probe_matmul_flops(device, precision), load


def probe_matmul_flops(device: str = "cpu", precision: str = "fp32", n: int = 1024, repeats: int = 5
                       ) -> tuple[float, ...]:
    """FLOP/s of each of `repeats` n×n×n matmuls (2·n³ FLOPs each) after one warm-up, not cached.

    About 0.05 s per repeat for n=1024 fp32 on one modern CPU core. fp8 is measured as bf16.
    """
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}.get(precision, torch.float32)
    if device == "cpu" and dtype == torch.float16:
        dtype = torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    a @ b  # warm-up (allocations, kernel selection)
    sync()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        sync()
        out.append(2.0 * n**3 / max(time.perf_counter() - t0, 1e-9))
    return tuple(out)


@functools.lru_cache(maxsize=8)
def measure_matmul_flops(device: str = "cpu", precision: str = "fp32", n: int = 1024, repeats: int = 3) -> float:
    """Best-of-`repeats` FLOP/s of an n×n×n matmul (2·n³ FLOPs), cached per process."""
    return max(probe_matmul_flops(device, precision, n, repeats))


def mfu(flops: float, step_time_s: float, peak: float) -> float:
    """FLOPs / step_time / peak: 4.28e13 FLOPs in 0.1 s on a 989.4 TFLOP/s GPU → 0.433."""
    if step_time_s <= 0 or peak <= 0:
        return 0.0
    return flops / step_time_s / peak
