"""The suites, by name (`python -m bench --list`). Each module defines

    SUMMARY                      one line for --list
    DEVICE                       "cpu" or "gpu": where its full-size run belongs (every --smoke runs on the CPU)
    add_arguments(parser)        its own options (beside --smoke and --out)
    run(args, out) -> Record     the measurement; `out` is the output folder, the record goes to out/<name>.json

and is imported only when its suite runs.
"""

from __future__ import annotations

import importlib
from types import ModuleType

SUITES = {
    "pack-speed": "bench.suites.pack_speed",
    "pack-fill": "bench.suites.pack_fill",
    "gpu-throughput": "bench.suites.gpu_throughput",
    "train-smoke": "bench.suites.train_smoke",
    "memory": "bench.suites.memory",
    "memory-plan": "bench.suites.memory_plan",
    "scaling": "bench.suites.scaling",
    "lora": "bench.suites.lora",
    "long-context": "bench.suites.long_context",
    "fp8": "bench.suites.fp8",
    "fsdp2": "bench.suites.fsdp2",
    "data-memory": "bench.suites.data_memory",
    "gate-noise": "bench.suites.gate_noise",
    "cpu-run": "bench.suites.cpu_run",
    "gpu-pipeline": "bench.suites.gpu_pipeline",
    "register-speed": "bench.suites.register_speed",
    "guard": "bench.suites.guard",
    "step-profile": "bench.suites.step_profile",
    "loss-kernels": "bench.suites.loss_kernels",
    "lora-budget": "bench.suites.lora_budget",
    "seed-spread": "bench.suites.seed_spread",
    "wordorder-chance": "bench.suites.wordorder_chance",
}


def load(name: str) -> ModuleType:
    """The module of suite `name`; an unknown name raises KeyError listing the known ones."""
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}; suites: {', '.join(SUITES)}")
    return importlib.import_module(SUITES[name])
