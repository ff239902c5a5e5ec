"""Chaining the stages: `packtrain run` (in process or through kfp.local), the KFP pipeline (compile, submit),
the stage cache, multi-node specs.

    compile_pipeline(out, cfg=None) -> Path           KFP IR YAML (pipelines/packtrain_pipeline.yaml)
    submit(host, schedule=None, cfg=...) -> dict      one run, or a recurring run on a 6-field cron
    run_local(cfg, runner="in-process") -> dict       the whole DAG on this machine + summary (runner "kfp":
                                                      the compiled DAG through kfp.local)
    run_dag(cfg, run_dir, ...) -> {stage: stats}      the stage table walked in this process (pipeline.dag)
    validate_cron(expr) -> str                        6-field KFP cron or a ConfigError explaining why
    build_job(cfg, nodes, gpus_per_node, kind) -> [ConfigMap, PyTorchJob|TrainJob]

kfp is imported inside the functions (this package is imported by `packtrain --help`'s commands).
"""

from __future__ import annotations


def compile_pipeline(out, cfg=None):
    from packtrain.pipeline.kfp_ops import compile_pipeline as _f

    return _f(out, cfg)


def submit(host, schedule=None, **kw):
    from packtrain.pipeline.kfp_ops import submit as _f

    return _f(host, schedule, **kw)


def run_local(cfg, **kw):
    from packtrain.pipeline.local import run_local as _f

    return _f(cfg, **kw)


def run_dag(cfg, run_dir, **kw):
    from packtrain.pipeline.dag import run_dag as _f

    return _f(cfg, run_dir, **kw)


def validate_cron(expr):
    from packtrain.pipeline.cron import validate_cron as _f

    return _f(expr)


def build_job(cfg, nodes, gpus_per_node, kind="pytorchjob", **kw):
    from packtrain.pipeline.multinode import build_job as _f

    return _f(cfg, nodes, gpus_per_node, kind, **kw)


__all__ = ["compile_pipeline", "submit", "run_local", "run_dag", "validate_cron", "build_job"]
