"""What every suite shares: the machine it ran on, timing, peak memory, and the record it writes.

    machine_info()                      one dict: host, python, platform, CPU model and count, load average,
                                        numpy / torch / transformers (+ CUDA device, peak TFLOP/s) when importable
    timed(fn, *a)                       (fn(*a), wall seconds)
    peak_rss_mib(cmd, env)              (exit code, peak RSS in MiB of the process tree, seconds) of a subprocess
    cuda_peaks_gib()                    (max_memory_allocated, max_memory_reserved) in GiB; (None, None) off CUDA
    measure_host_link()                 pinned device↔host copy GB/s, alone and beside bf16 matmuls; None off CUDA
    Record(suite, command, ...)         the JSON every suite writes: {"suite", "study", "command", "machine",
                                        "settings", "rows", "goals", "goal_met", "limits", "created", "smoke",
                                        ...extra}
    write_record(path, record)          indented JSON, atomically (temp file + rename: a timeout never leaves half)

`rows` is a list of objects, one per measured variant/configuration, each carrying numbers; `goals` the targets
the suite checks and `goal_met` {goal: bool} (empty when the suite has no target); `limits` says, for a goal
not met, what limited it (the measured limit) and what was tried — `python -m bench report` shows it beside the
goal ({{goals FILE}}). Heavy libraries are
imported inside the functions, so `python -m bench --list` stays fast.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

GIB = 1 << 30
PEAK_TFLOPS_H200 = 790.0
"""bf16 dense peak measured on the H200 (the datasheet says 989): MFU is counted against it."""


def command_line(suite: str, argv: list[str]) -> str:
    """The command as a record states it: `python -m bench SUITE ARGS...`."""
    return shlex.join(["python", "-m", "bench", suite, *argv])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return None


def machine_info(peak_tflops: float | None = None) -> dict:
    """The machine a record was measured on. Versions of the libraries a suite may use are read from the
    installed metadata (no import); the CUDA device when torch is already imported or `peak_tflops` is given
    (the GPU suites count MFU against it)."""
    info: dict = {"host": platform.node(), "python": platform.python_version(), "platform": platform.platform(),
                  "cpu": _cpu_model(), "cpus": os.cpu_count(), "load_avg": round(os.getloadavg()[0], 2)}
    for pkg in ("numpy", "torch", "transformers", "peft", "deepspeed", "torchao", "liger-kernel"):
        info[pkg.replace("-", "_")] = _version(pkg)
    info["device"] = "cpu"
    if "torch" in sys.modules or (peak_tflops is not None and info["torch"]):
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update(device=props.name, device_count=torch.cuda.device_count(),
                        device_memory_gib=round(props.total_memory / GIB, 2), cuda=torch.version.cuda)
    if peak_tflops is not None:
        info["peak_tflops_bf16"] = peak_tflops
    return info


def timed(fn, *a, **kw) -> tuple[object, float]:
    """(fn(*a, **kw), wall seconds)."""
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t0


def peak_rss_mib(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> tuple[int, float, float]:
    """Run `cmd`; (exit code, peak RSS in MiB over the process and its children sampled every 50 ms, seconds).
    Its stderr tail is printed when it fails."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ps, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            peak = max(peak, ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True)))
        except psutil.Error:
            pass
        time.sleep(0.05)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode:
        print(err[-2000:], file=sys.stderr)
    return proc.returncode, peak / 2**20, time.perf_counter() - t0


def cuda_peaks_gib() -> tuple[float | None, float | None]:
    """(max_memory_allocated, max_memory_reserved) in GiB since the last reset; (None, None) without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None, None
    return torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB


def measure_host_link(gib: float = 2.0, reps: int = 3) -> dict | None:
    """Pinned device→host and host→device copy bandwidth in GB/s on this machine's GPU, alone and while bf16
    8192² matmuls keep the default stream busy (what an overlapped offload would see); None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    n = int(gib * 2**30)
    dev, host = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, pin_memory=True)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def copy_gbs(to_host: bool, busy: bool) -> float:
        best = 0.0
        for _ in range(reps):
            torch.cuda.synchronize()
            if busy:
                for _ in range(40):
                    a @ a
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(side):
                start.record()
                (host.copy_(dev, non_blocking=True) if to_host else dev.copy_(host, non_blocking=True))
                end.record()
            torch.cuda.synchronize()
            best = max(best, n / 1e9 / (start.elapsed_time(end) / 1e3))
        return round(best, 1)

    return {"d2h_gb_per_s": copy_gbs(True, False), "h2d_gb_per_s": copy_gbs(False, False),
            "d2h_beside_matmuls_gb_per_s": copy_gbs(True, True), "bytes": n, "device": torch.cuda.get_device_name()}


@dataclass
class Record:
    """One suite run, as written to `<out>/<suite>.json`."""

    suite: str
    command: str
    machine: dict
    settings: dict = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    goals: dict = field(default_factory=dict)
    goal_met: dict = field(default_factory=dict)
    limits: dict = field(default_factory=dict)
    """{goal: {"limit": what limited it, with its measured number, "tried": [what was tried, …]}} for goals of
    goal_met that are not met; empty when every goal is met or nothing is known yet (optional: older records
    lack it)."""
    study: str = ""
    """What the run measures, in words (e.g. "FP8 vs bf16 at 3B")."""
    smoke: bool = False
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    extra: dict = field(default_factory=dict)
    """Suite-specific blocks (comparisons, data summaries), written at the top level beside the fields above."""

    def to_dict(self) -> dict:
        d = asdict(self)
        return {**{k: v for k, v in d.items() if k != "extra"}, **d["extra"]}


REQUIRED = ("suite", "command", "machine", "settings", "rows", "goals", "goal_met", "created")


def check_record(doc: dict) -> list[str]:
    """What is wrong with a written record (empty: nothing): the fields of Record, rows as a non-empty list of
    objects, and at least one number in every row that did not fail."""
    problems = [f"missing {k!r}" for k in REQUIRED if k not in doc]
    rows = doc.get("rows")
    if not isinstance(rows, list) or not rows:
        return [*problems, "rows: not a non-empty list"]
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            problems.append(f"rows[{i}]: not an object")
        elif "error" not in r and not any(isinstance(v, (int, float)) and not isinstance(v, bool)
                                          for v in r.values()):
            problems.append(f"rows[{i}]: no number in {sorted(r)}")
    if not isinstance(doc.get("goal_met"), dict) or not all(isinstance(v, bool) for v in doc["goal_met"].values()):
        problems.append("goal_met: not an object of booleans")
    return problems + limit_problems(doc)


def limit_problems(doc: dict) -> list[str]:
    """What is wrong with a record's optional `limits` (Record.limits): each names a goal of goal_met that is not
    met and holds a non-empty "limit" text and a "tried" list of texts."""
    limits, met = doc.get("limits", {}), doc.get("goal_met") or {}
    if not isinstance(limits, dict):
        return ["limits: not an object"]
    problems = []
    for goal, why in limits.items():
        if met.get(goal) is not False:
            problems.append(f"limits[{goal!r}]: not a goal of goal_met that is not met ({met.get(goal)!r})")
        if not isinstance(why, dict) or not isinstance(why.get("limit"), str) or not why["limit"].strip() \
                or not isinstance(why.get("tried"), list) or not all(isinstance(t, str) for t in why["tried"]):
            problems.append(f"limits[{goal!r}]: want {{\"limit\": text, \"tried\": [text, ...]}}, got {why!r}")
    return problems


def write_record(path: str | Path, record: Record | dict) -> Path:
    """Write `record` as indented JSON atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = record.to_dict() if isinstance(record, Record) else record
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
