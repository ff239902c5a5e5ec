"""`SystemSampler`: a daemon thread that samples the GPUs (NVML) or, without NVML, the CPU (psutil).

NVML ("nvml" kind), one record per tick, GPUs = those the run uses (torch ordinals mapped to NVML devices
through CUDA_VISIBLE_DEVICES; set CUDA_DEVICE_ORDER=PCI_BUS_ID so both orders agree)::

    {"t": 12.0, "util": 97.5, "mem_used_gib": 61.2, "mem_total_gib": 141.0, "power_w": 612.0,
     "sm_clock_mhz": 1980.0, "gpus": [{"index": 0, "util": 97.5, "mem_util": 41.0, ...}],
     "alloc_gib": 40.1, "reserved_gib": 44.0, "fragmentation": 0.089}   # last 3 once CUDA is initialized

`util` is NVML's "a kernel was running during the last sample period" (%), not SM occupancy: read it next
to MFU and tokens/s. CPU ("cpu" kind, said once per process through logging)::

    {"t": 12.0, "util": 88.0, "sys_util": 93.5, "mem_used_gib": 1.3, "sys_mem_used_gib": 9.8}

where `util` is this process's CPU time over the cores it may run on (%), `sys_util` the whole machine's.
Cost: one NVML query per GPU per tick (~0.1 ms); the thread sleeps in between and never blocks exit.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import threading
import time
from typing import Any, Literal

log = logging.getLogger(__name__)
_warn_lock = threading.Lock()
_warned_no_nvml = False

GIB = float(1 << 30)


def nvml_available() -> bool:
    """True when nvidia-ml-py is installed and the NVML library initializes (a driver is present)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def gpu_names(gpu_indices: list[int] | None = None) -> list[str]:
    """Names of the GPUs the run uses, e.g. ['NVIDIA H200']; [] without NVML. No torch import."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        return [_str(pynvml.nvmlDeviceGetName(h)) for _, h in _nvml_handles(pynvml, gpu_indices)]
    except Exception:
        return []
    finally:
        pynvml.nvmlShutdown()


def _str(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _nvml_handles(pynvml, gpu_indices: list[int] | None) -> list[tuple[int, Any]]:
    """[(torch ordinal, NVML handle)] for the requested ordinals (None: every visible device)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() == "":
        ids: list[str] = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if visible is not None:  # CUDA_VISIBLE_DEVICES="" hides every GPU
            ids = []
    else:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
    wanted = range(len(ids)) if gpu_indices is None else gpu_indices
    out = []
    for ordinal in wanted:
        if ordinal >= len(ids):
            raise ValueError(f"GPU {ordinal} is not visible (CUDA_VISIBLE_DEVICES={visible!r})")
        ident = ids[ordinal]
        if ident.isdigit():
            h = pynvml.nvmlDeviceGetHandleByIndex(int(ident))
        else:  # GPU-<uuid> or MIG-<uuid>
            h = pynvml.nvmlDeviceGetHandleByUUID(ident)
        out.append((ordinal, h))
    return out


def _cuda_memory_now() -> dict[str, float]:
    """Allocator state without importing torch: only once the process has initialized CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return {}
    alloc = torch.cuda.memory_allocated()
    reserved = torch.cuda.memory_reserved()
    return {"alloc_gib": alloc / GIB, "reserved_gib": reserved / GIB,
            "fragmentation": (1.0 - alloc / reserved) if reserved else 0.0}


class SystemSampler:
    """Sample utilization, memory, power and SM clock every `interval_s` on a daemon thread.

    >>> s = SystemSampler(0.5); s.start(); ...; s.stop(); s.summary()["utilization"]   # median fraction
    0.97

    backend: "auto" (NVML if it initializes, else CPU with a one-time warning), "nvml" or "cpu".
    One sample is taken at start (CPU: after priming psutil) and one at stop, so even a run shorter than
    `interval_s` has a measurement.
    """

    def __init__(self, interval_s: float = 1.0, gpu_indices: list[int] | None = None,
                 backend: Literal["auto", "nvml", "cpu"] = "auto"):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = float(interval_s)
        self.gpu_indices = gpu_indices
        self.samples: list[dict] = []
        self.kind: Literal["nvml", "cpu"] = "cpu"
        self.reason: str | None = None
        self._backend = backend
        self._handles: list[tuple[int, Any]] = []
        self._pynvml: Any = None   # the pynvml module once initialised (optional dependency)
        self._proc: Any = None     # psutil.Process() on the CPU kind
        self._n_cpus = 1
        self._t0 = 0.0
        self.started_unix: float | None = None   # time.time() at start(): the wall clock of the samples' t = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> SystemSampler:
        if self._thread is not None:
            return self
        self._open_backend()
        self._t0, self.started_unix = time.monotonic(), time.time()
        self._stop.clear()
        if self.kind == "nvml":
            self._sample()
        self._thread = threading.Thread(target=self._loop, name="packtrain-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> SystemSampler:
        if self._thread is None:
            return self
        self._stop.set()
        self._thread.join(timeout=max(2.0, 2 * self.interval_s))
        self._thread = None
        self._sample()
        if self._pynvml is not None:
            try:
                self._pynvml.nvmlShutdown()
            except Exception:
                pass
            self._pynvml = None
        return self

    def __enter__(self) -> SystemSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def elapsed(self) -> float:
        """Seconds since start() on the samples' clock: pass it to `summary(since_t=...)` at warmup end."""
        return time.monotonic() - self._t0 if self._t0 else 0.0

    # -- sampling ----------------------------------------------------------------------------------------
    def _open_backend(self) -> None:
        global _warned_no_nvml
        if self._backend in ("auto", "nvml"):
            try:
                import pynvml

                pynvml.nvmlInit()
                self._handles = _nvml_handles(pynvml, self.gpu_indices)
                if not self._handles:
                    pynvml.nvmlShutdown()
                    raise RuntimeError("no visible GPU")
                self._pynvml = pynvml
                self.kind = "nvml"
                return
            except Exception as e:  # library missing, no driver, no GPU
                self.reason = f"{type(e).__name__}: {e}"
        else:
            self.reason = "backend='cpu' requested"
        import psutil

        self.kind = "cpu"
        self._proc = psutil.Process()
        try:
            self._n_cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # macOS
            self._n_cpus = psutil.cpu_count() or 1
        self._proc.cpu_percent(None)  # prime: the first call returns 0.0
        psutil.cpu_percent(None)
        if self._backend != "cpu":
            with _warn_lock:
                if not _warned_no_nvml:
                    _warned_no_nvml = True
                    log.warning("NVML unavailable (%s): sampling CPU utilization instead of GPU", self.reason)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except Exception as e:  # never kill training over a failed sample
                log.debug("sample failed: %s", e)

    def _sample(self) -> None:
        t = time.monotonic() - self._t0
        rec = self._sample_nvml(t) if self.kind == "nvml" else self._sample_cpu(t)
        rec.update(_cuda_memory_now())
        with self._lock:
            self.samples.append(rec)

    def _sample_nvml(self, t: float) -> dict:
        nv = self._pynvml
        gpus = []
        for ordinal, h in self._handles:
            util = nv.nvmlDeviceGetUtilizationRates(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            try:
                power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
            except Exception:  # some boards do not report power
                power = float("nan")
            gpus.append({"index": ordinal, "util": float(util.gpu), "mem_util": float(util.memory),
                         "mem_used_gib": mem.used / GIB, "mem_total_gib": mem.total / GIB, "power_w": power,
                         "sm_clock_mhz": float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))})
        return {"t": t, "util": statistics.fmean(g["util"] for g in gpus),
                "mem_used_gib": sum(g["mem_used_gib"] for g in gpus),
                "mem_total_gib": sum(g["mem_total_gib"] for g in gpus),
                "power_w": sum(g["power_w"] for g in gpus),
                "sm_clock_mhz": statistics.fmean(g["sm_clock_mhz"] for g in gpus), "gpus": gpus}

    def _sample_cpu(self, t: float) -> dict:
        import psutil

        return {"t": t, "util": min(100.0, self._proc.cpu_percent(None) / self._n_cpus),
                "sys_util": psutil.cpu_percent(None), "mem_used_gib": self._proc.memory_info().rss / GIB,
                "sys_mem_used_gib": psutil.virtual_memory().used / GIB}

    # -- results -----------------------------------------------------------------------------------------
    def summary(self, since_t: float = 0.0, until_t: float | None = None) -> dict:
        """Over samples with since_t ≤ t ≤ until_t (e.g. warmup end .. last training step, so compiling and
        saving do not count as idle time): utilization as a fraction 0..1.

        {"kind": "nvml", "n_samples": 60, "utilization": 0.97 (median), "utilization_mean": 0.95,
         "utilization_min": 0.41, "mem_used_max_gib": 61.2, "power_mean_w": 600.0, "sm_clock_mean_mhz": 1980,
         "fragmentation_max": 0.09 (when CUDA memory was sampled),
         "system_cpu_mean": 0.99, "others_cpu_mean": 0.49 (CPU kind: the machine's CPU and what other processes
         used of it),
         "per_gpu": [{"index": 0, "utilization": 0.98, "mem_used_max_gib": 30.1}, ...] (when > 1 GPU)}
        """
        with self._lock:
            end = float("inf") if until_t is None else until_t
            recs = [r for r in self.samples if since_t <= r["t"] <= end] or list(self.samples)
        out: dict[str, Any] = {"kind": self.kind, "n_samples": len(recs)}
        if not recs:
            return out
        util = [r["util"] / 100.0 for r in recs]
        out.update(utilization=statistics.median(util), utilization_mean=statistics.fmean(util),
                   utilization_min=min(util), mem_used_max_gib=max(r["mem_used_gib"] for r in recs),
                   duration_s=recs[-1]["t"] - recs[0]["t"])
        sys_util = [r["sys_util"] / 100.0 for r in recs if r.get("sys_util") is not None]
        if sys_util:   # CPU kind: the whole machine's CPU beside this process' own share of it
            out["system_cpu_mean"] = statistics.fmean(sys_util)
            out["others_cpu_mean"] = max(0.0, out["system_cpu_mean"] - out["utilization_mean"])
        if self.kind == "nvml":
            out["power_mean_w"] = statistics.fmean(r["power_w"] for r in recs)
            out["sm_clock_mean_mhz"] = statistics.fmean(r["sm_clock_mhz"] for r in recs)
        if len(recs[0].get("gpus", ())) > 1:   # several GPUs: each one's own line, so a lagging GPU shows
            out["per_gpu"] = [
                {"index": g0["index"],
                 "utilization": statistics.median(r["gpus"][i]["util"] / 100.0 for r in recs),
                 "mem_used_max_gib": max(r["gpus"][i]["mem_used_gib"] for r in recs)}
                for i, g0 in enumerate(recs[0]["gpus"])]
        frag = [r["fragmentation"] for r in recs if "fragmentation" in r]
        if frag:
            out["fragmentation_max"] = max(frag)
            out["fragmentation_median"] = statistics.median(frag)
        return out
