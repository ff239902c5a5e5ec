"""`build_report`: one run's telemetry as a flat summary, threshold violations, a JSON file and PNG plots.

    report = build_report(out_dir, cfg.telemetry, meter=meter, sampler=sampler,
                          memory=cuda_memory_stats(), extra={"peak_tflops": peak / 1e12})
    report.summary     {"real_tokens_per_s": 79500.0, "useful_mfu": 0.41, "utilization": 0.97,
                        "fragmentation": 0.06, "padding": 0.004, ...}
    report.violations  ["utilization: 0.720 < 0.900 (telemetry.min_utilization)"]
    report.files       [out_dir/telemetry.json, out_dir/system.png, out_dir/throughput.png]

No MLflow here; `StageRun.log_report(report)` sends it (tags packtrain.violation.*, artifacts telemetry/ and
plots/); the samples become MLflow system metrics through packtrain.tracking.layout.system_rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtrain.config import TelemetryConfig
from packtrain.publish import write_json
from packtrain.telemetry.thresholds import check_thresholds


@dataclass
class TelemetryReport:
    summary: dict[str, Any]
    violations: list[str]
    files: list[Path] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)   # the sampler's records (also in telemetry.json)
    t0_unix: float | None = None                         # wall-clock time of the samples' t = 0 (None: no sampler)


def build_report(out_dir: str | Path, cfg: TelemetryConfig, meter=None, sampler=None,
                 memory: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None,
                 since_t: float = 0.0, plots: bool = True, until_t: float | None = None) -> TelemetryReport:
    """Merge meter (steady state), sampler (samples with t ≥ since_t) and memory stats; check thresholds.

    Key collisions resolve in this order (later wins): sampler, meter, memory, extra. The sampler's
    `kind`/`n_samples` become `sampler_kind`/`sampler_samples`. Writes out_dir/telemetry.json with the
    summary, the violations, per-step records and samples (t: seconds after `samples_t0_unix`, the wall clock
    when sampling started), plus system.png / throughput.png.
    """
    from packtrain.telemetry import plots as P

    out_dir = Path(out_dir)
    summary: dict[str, Any] = {}
    samples: list[dict] = []
    t0_unix = getattr(sampler, "started_unix", None)
    if sampler is not None:
        s = dict(sampler.summary(since_t, until_t))
        summary["sampler_kind"] = s.pop("kind")
        summary["sampler_samples"] = s.pop("n_samples")
        summary.update(s)
        samples = list(sampler.samples)
    records = list(meter.records) if meter is not None else []
    if meter is not None:
        summary.update(meter.summary())
    if memory:
        summary.update({k: v for k, v in memory.items() if v is not None})
    summary.update(extra or {})
    violations = check_thresholds(summary, cfg)
    files = [out_dir / "telemetry.json"]
    write_json(files[0], {"summary": summary, "violations": violations, "thresholds": {
        "min_utilization": cfg.min_utilization, "max_fragmentation": cfg.max_fragmentation,
        "max_padding": cfg.max_padding}, "steps": records, "samples": samples, "samples_t0_unix": t0_unix})
    if plots and samples:
        files.append(P.plot_system(samples, out_dir / "system.png"))
    if plots and records:
        files.append(P.plot_throughput(records, out_dir / "throughput.png"))
    return TelemetryReport(summary, violations, files, samples, t0_unix)
