"""Telemetry: MFU arithmetic, system sampling, CUDA memory, throughput, thresholds and plots.

Usable without MLflow (nothing here imports it). The train loop feeds a `ThroughputMeter` and a
`SystemSampler`; `report.build_report` turns them into a summary dict, threshold violations, a JSON file
and PNG plots that `packtrain.tracking.StageRun.log_report` sends to MLflow.

    mfu.step_flops(...)          -> (useful, dense) FLOPs of one fwd+bwd micro-batch
    mfu.peak_flops(name, prec)   -> FLOP/s from the datasheet table (or measured, or overridden)
    sampler.SystemSampler        NVML thread (GPU util %, memory, power, SM clock) or psutil fallback
    memory.cuda_memory_stats     peak allocated/reserved, fragmentation, allocator retries, OOMs
    meter.ThroughputMeter        per-step tokens/s, MFU, data-wait; steady-state medians
    thresholds.check_thresholds  utilization ≥ 0.90, fragmentation < 0.10, padding < 0.05
    plots.*                      matplotlib (Agg) PNGs
"""
