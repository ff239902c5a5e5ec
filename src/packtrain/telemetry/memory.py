"""CUDA allocator statistics and the optional one-step memory snapshot.

    fragmentation = 1 − allocated / reserved

Reserved memory the caching allocator holds but cannot hand out (split blocks, size-class waste) is what
makes a run OOM below the card's capacity. At the peak it is `1 − max_memory_allocated / max_memory_reserved`;
"now" uses the current counters (the sampler records it over time). `alloc_retries` counts cudaMalloc
failures that forced the allocator to free its cache and retry (each one a stall of milliseconds to seconds);
`ooms` counts OutOfMemoryErrors raised. With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True both usually
stay at 0 and fragmentation under 10% for a fixed token budget.

On CPU every CUDA value is 0.0 (fragmentation None) and `cpu_peak_rss_gib` holds the peak resident memory of
the stage, so callers need no branch.

The stage's own peak, not the process's: `packtrain run` runs stages in one process, so the process's
`ru_maxrss` also holds what earlier stages peaked at — a train stage after an in-process tokenize read 1.23 GiB,
the same train after a tokenize restored from the cache 0.82 GiB, and the CI gate cried "rose 49.3%" for an
unchanged config. `begin_stage_memory()` (called as a stage starts: train, evaluate) collects garbage, hands freed
heap back to the OS (glibc `malloc_trim`) and resets the kernel's high-water mark of this process's resident set
(`/proc/self/clear_refs` ← 5, Linux ≥ 4.0); `cpu_peak_rss_gib` then reads that mark (`VmHWM` in /proc/self/status):
the peak since the stage began. Where neither file exists (not Linux) it is `ru_maxrss`, as before.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)
GIB = float(1 << 30)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """What is alive now out of the collections inside the block (gc.freeze), put back after it; nothing when the
    caller froze already (run_dag, begin_stage_memory): a collection inside then walks only what the block made."""
    import gc

    own = gc.get_freeze_count() == 0
    if own:
        gc.freeze()
    try:
        yield
    finally:
        if own:
            gc.unfreeze()


def begin_stage_memory() -> float | None:
    """Start measuring a stage's own peak resident memory (module doc); returns the resident GiB it starts from,
    None where the peak cannot be reset (then `cpu_peak_rss_gib` stays the process's `ru_maxrss`)."""
    import gc

    gc.collect()
    if gc.get_freeze_count() == 0:
        # the survivors (imported modules, caches) out of every later collection's walk, as run_dag does at each
        # stage boundary: a stage in a process of its own (or called in-process, as the tests do) then walks only
        # what it made — a full walk over torch + transformers + mlflow is ~0.3 s on 2 cores, over a test
        # process's heap ~1 s. Frozen once: what a later stage frees was made after it, and collects.
        gc.freeze()
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)   # freed heap of earlier stages leaves the resident set
    try:
        Path("/proc/self/clear_refs").write_text("5")   # resets VmHWM to the current resident set
    except OSError:
        return None
    return _status_gib("VmRSS")


def _status_gib(field: str) -> float | None:
    """`VmHWM` / `VmRSS` of /proc/self/status in GiB (None without /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / GIB   # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _peak_rss_gib() -> float:
    """Peak resident memory since `begin_stage_memory` (VmHWM), else of the whole process (ru_maxrss)."""
    hwm = _status_gib("VmHWM")
    if hwm is not None:
        return hwm
    try:
        import resource

        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        return kib * 1024 / GIB if sys.platform != "darwin" else kib / GIB
    except (ImportError, OSError):  # pragma: no cover - Windows
        return 0.0


def _cuda_device(device):
    """(torch, device) when this process has initialized CUDA, else (None, None). Never initializes it."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None, None
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if dev.type != "cuda":
        return None, None
    return torch, dev


def cuda_memory_stats(device=None) -> dict:
    """Peak and current allocator state of one CUDA device (default: current), in GiB.

    {"peak_alloc_gib": 40.1, "peak_reserved_gib": 44.0, "fragmentation": 0.089,       # at the peak
     "alloc_gib": 12.0, "reserved_gib": 44.0, "fragmentation_now": 0.727,
     "alloc_retries": 0, "ooms": 0, "cpu_peak_rss_gib": 3.2}
    """
    out: dict = {"peak_alloc_gib": 0.0, "peak_reserved_gib": 0.0, "fragmentation": None, "alloc_gib": 0.0,
                 "reserved_gib": 0.0, "fragmentation_now": None, "alloc_retries": 0, "ooms": 0,
                 "cpu_peak_rss_gib": _peak_rss_gib()}
    torch, dev = _cuda_device(device)
    if torch is None:
        return out
    stats = torch.cuda.memory_stats(dev)
    peak_alloc = stats.get("allocated_bytes.all.peak", 0)
    peak_res = stats.get("reserved_bytes.all.peak", 0)
    alloc = stats.get("allocated_bytes.all.current", 0)
    res = stats.get("reserved_bytes.all.current", 0)
    out.update(
        peak_alloc_gib=peak_alloc / GIB, peak_reserved_gib=peak_res / GIB,
        fragmentation=(1.0 - peak_alloc / peak_res) if peak_res else 0.0,
        alloc_gib=alloc / GIB, reserved_gib=res / GIB,
        fragmentation_now=(1.0 - alloc / res) if res else 0.0,
        alloc_retries=int(stats.get("num_alloc_retries", 0)), ooms=int(stats.get("num_ooms", 0)),
    )
    return out


def reset_peak_memory(device=None) -> None:
    """Reset the peak counters (e.g. after warmup, so the peak is the steady state's). No-op on CPU."""
    torch, dev = _cuda_device(device)
    if torch is not None:
        torch.cuda.reset_peak_memory_stats(dev)


@contextlib.contextmanager
def memory_snapshot(path: str | Path, enabled: bool = True, max_entries: int = 100_000) -> Iterator[Path | None]:
    """Record every allocation inside the block (one training step) and dump a pickle to `path`.

    Open the file at https://pytorch.org/memory_viz to see each tensor's lifetime and stack trace.
    Recording costs ~2-5% step time while on and the file is ~10-100 MB for one step of a 350M model.
    Yields the path that will be written, or None (and writes nothing) on CPU or when `enabled` is False.

        with memory_snapshot(out_dir / "memory_snapshot.pickle", enabled=cfg.telemetry.memory_snapshot):
            train_step(...)
    """
    torch, dev = _cuda_device(None)
    if not enabled or torch is None:
        if enabled:
            log.info("memory snapshot requested but CUDA is not available: skipped")
        yield None
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        yield path
    finally:
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            torch.cuda.memory._dump_snapshot(str(tmp))
            tmp.replace(path)
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
