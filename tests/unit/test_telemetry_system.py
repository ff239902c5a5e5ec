"""SystemSampler (NVML or the CPU fallback), CUDA memory stats on CPU, plots and the telemetry report."""

from __future__ import annotations

import logging
import struct
import time

import pytest

from packtrain.config import TelemetryConfig
from packtrain.telemetry import memory, plots, sampler
from packtrain.telemetry.meter import ThroughputMeter
from packtrain.telemetry.report import build_report
from packtrain.telemetry.thresholds import TelemetryWarning


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def test_sampler_records_and_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(sampler, "_warned_no_nvml", False)
    caplog.set_level(logging.WARNING, logger="packtrain.telemetry.sampler")
    s1 = sampler.SystemSampler(interval_s=0.05).start()
    _busy(0.3)
    s1.stop()
    s2 = sampler.SystemSampler(interval_s=0.05).start()
    time.sleep(0.12)
    s2.stop()
    assert len(s1.samples) >= 3  # ~6 ticks in 0.3 s plus the one at stop
    assert all(0.0 <= r["util"] <= 100.0 and r["mem_used_gib"] > 0 for r in s1.samples)
    times = [r["t"] for r in s1.samples]
    assert times == sorted(times)
    warnings = [r for r in caplog.records if "NVML unavailable" in r.getMessage()]
    if s1.kind == "cpu":  # this machine: no NVML → one warning for two samplers
        assert len(warnings) == 1
        assert {"sys_util", "sys_mem_used_gib"} <= set(s1.samples[0])
        summ = s1.summary()
        assert summ["kind"] == "cpu" and summ["n_samples"] == len(s1.samples)
        assert 0.0 <= summ["utilization"] <= 1.0  # a fraction
        assert summ["utilization"] > 0.0  # the busy loop used CPU
    else:  # GPU machine
        assert warnings == [] and "power_w" in s1.samples[0] and s1.samples[0]["gpus"]


def test_sampler_forced_cpu_backend_does_not_warn(caplog, monkeypatch):
    monkeypatch.setattr(sampler, "_warned_no_nvml", False)
    caplog.set_level(logging.WARNING, logger="packtrain.telemetry.sampler")
    with sampler.SystemSampler(interval_s=0.5, backend="cpu") as s:
        pass
    assert s.kind == "cpu" and len(s.samples) == 1  # the sample taken at stop
    assert not [r for r in caplog.records if "NVML" in r.getMessage()]
    assert s.summary(since_t=10.0)["n_samples"] == 1  # nothing after 10 s: falls back to all samples
    with pytest.raises(ValueError, match="interval_s"):
        sampler.SystemSampler(0)


def test_summary_has_one_line_per_gpu_when_several_are_sampled():
    """Data-parallel runs sample every GPU of the node; the summary keeps each GPU's own utilization and memory
    next to the mean, so one lagging GPU is visible."""
    s = sampler.SystemSampler(interval_s=0.5, backend="cpu")

    def rec(t, u0, u1):
        gpus = [{"index": i, "util": u, "mem_used_gib": 30.0 + i} for i, u in enumerate((u0, u1))]
        return {"t": t, "util": (u0 + u1) / 2, "mem_used_gib": 61.0, "gpus": gpus}

    s.samples = [rec(1.0, 98, 60), rec(2.0, 100, 62), rec(3.0, 96, 64)]
    summ = s.summary()
    assert summ["utilization"] == pytest.approx(0.80)   # median of the per-sample means
    assert summ["per_gpu"] == [{"index": 0, "utilization": pytest.approx(0.98), "mem_used_max_gib": 30.0},
                               {"index": 1, "utilization": pytest.approx(0.62), "mem_used_max_gib": 31.0}]
    s.samples = [{"t": 1.0, "util": 90.0, "mem_used_gib": 1.0, "gpus": [{"index": 0, "util": 90.0,
                                                                         "mem_used_gib": 1.0}]}]
    assert "per_gpu" not in s.summary()   # one GPU: the summary is already that GPU's


def test_system_series_are_mlflow_system_metrics_at_their_sample_time_with_per_gpu_lines():
    """The sampler's records become `system/train_*` points: timestamp = when sampled (the sampler's wall-clock
    start + t), step = the sample's index; several GPUs also get one line each."""
    from packtrain.tracking.layout import system_rows

    two = {"t": 0.25, "util": 80.0, "mem_used_gib": 61.0,
           "gpus": [{"index": 0, "util": 98.0, "mem_used_gib": 30.0}, {"index": 1, "util": 62.0, "mem_used_gib": 31.0}]}
    rows = system_rows([{"t": 0.0, "util": 10.0}, two], 1_700_000_000.0)
    assert rows[0] == ("system/train_utilization_percentage", 10.0, 1_700_000_000_000, 0)
    m = {k: (v, ts, step) for k, v, ts, step in rows[1:]}
    assert m["system/train_utilization_percentage"] == (80.0, 1_700_000_000_250, 1)
    assert m["system/train_memory_used_gib"] == (61.0, 1_700_000_000_250, 1)
    assert (m["system/train_gpu0_utilization_percentage"][0], m["system/train_gpu1_utilization_percentage"][0]) == \
        (98.0, 62.0)
    assert m["system/train_gpu1_memory_used_gib"][0] == 31.0
    assert all(k.startswith("system/") for k in m)      # the UI's System metrics tab, not a model metric
    one = {**two, "gpus": two["gpus"][:1]}
    assert not [k for k, *_ in system_rows([one], 0.0) if "gpu" in k]


@pytest.mark.filterwarnings("ignore::packtrain.telemetry.thresholds.TelemetryWarning")   # an idle sampler
def test_the_sampler_records_its_wall_clock_start_in_the_report(tmp_path):
    import json

    before = time.time()
    with sampler.SystemSampler(interval_s=0.05, backend="cpu") as s:
        time.sleep(0.12)
    report = build_report(tmp_path, TelemetryConfig(), sampler=s, plots=False)
    assert before <= report.t0_unix <= time.time() and report.samples
    assert json.loads((tmp_path / "telemetry.json").read_text())["samples_t0_unix"] == report.t0_unix


def test_cuda_memory_stats_on_cpu_are_zeros():
    stats = memory.cuda_memory_stats()
    assert stats["peak_alloc_gib"] == 0.0 and stats["peak_reserved_gib"] == 0.0
    assert stats["fragmentation"] is None and stats["alloc_retries"] == 0 and stats["ooms"] == 0
    assert stats["cpu_peak_rss_gib"] > 0.01  # this Python process holds > 10 MiB
    memory.reset_peak_memory()  # no-op without CUDA


def test_memory_snapshot_is_a_noop_without_cuda(tmp_path):
    with memory.memory_snapshot(tmp_path / "snap.pickle") as path:
        pass
    assert path is None and not (tmp_path / "snap.pickle").exists()


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_plots_write_png(tmp_path):
    samples = [{"t": i * 0.5, "util": 50 + i, "sys_util": 60.0, "mem_used_gib": 1 + 0.1 * i} for i in range(10)]
    p1 = plots.plot_system(samples, tmp_path / "system.png")
    gpu = [{"t": float(i), "util": 95.0, "mem_used_gib": 60.0, "power_w": 600.0, "alloc_gib": 40.0,
            "reserved_gib": 44.0, "fragmentation": 0.09} for i in range(5)]
    p2 = plots.plot_system(gpu, tmp_path / "gpu.png")
    m = ThroughputMeter(0)
    for i in range(8):
        m.record(i, 0.1 + 0.01 * i, 0.0, 3900, 4096, 4e12, 5e12, 1e15)
    p3 = plots.plot_throughput(m.records, tmp_path / "tp.png")
    p4 = plots.plot_length_histogram([3, 10, 10, 40, 300, 2048, 5000], fill=0.9953, path=tmp_path / "len.png",
                                     budget=2048)
    for p in (p1, p2, p3, p4):
        w, h = _png_size(p)
        assert w >= 400 and h >= 250 and p.stat().st_size > 5000
    assert not list(tmp_path.glob(".*tmp*"))  # temp files renamed away
    with pytest.raises(ValueError):
        plots.plot_length_histogram([], 1.0, tmp_path / "empty.png")


def test_build_report_merges_and_flags(tmp_path):
    m = ThroughputMeter(warmup_steps=1)
    for i in range(4):  # 3,000 of 4,096 slots real → padding 0.268 > 0.05
        m.record(i, 0.2, 0.0, 3000, 4096, 1e12, 2e12, 1e13)
    with sampler.SystemSampler(0.05, backend="cpu") as s:
        time.sleep(0.12)
    with pytest.warns(TelemetryWarning):
        rep = build_report(tmp_path, TelemetryConfig(), meter=m, sampler=s, memory=memory.cuda_memory_stats(),
                           extra={"peak_tflops": 10.0})
    assert rep.summary["padding"] == pytest.approx(1 - 3000 / 4096)
    assert rep.summary["sampler_kind"] == "cpu" and rep.summary["peak_tflops"] == 10.0
    assert "fragmentation" not in rep.summary  # None on CPU is dropped, so it is not checked
    assert any(v.startswith("padding:") for v in rep.violations)
    names = sorted(p.name for p in rep.files)
    assert names == ["system.png", "telemetry.json", "throughput.png"]
    assert all(p.stat().st_size > 0 for p in rep.files)
