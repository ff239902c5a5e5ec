"""The images the components name: the ones docker/Dockerfile (GPU) and docker/Dockerfile.cpu build.

Defaults come from `PipelineConfig` (ghcr.io/packtrain/packtrain[-cpu]:<version>); PACKTRAIN_IMAGE and
PACKTRAIN_CPU_IMAGE override them at import time, and the pipeline sets each task's image from the
recipe's `pipeline.base_image`/`pipeline.cpu_image` (`set_container_image`). docker/registry.txt lists
the same names; tests/pipelines/test_docker.py checks that they agree.
"""

from __future__ import annotations

import os

from packtrain.config import PipelineConfig

_DEFAULTS = PipelineConfig()

GPU_IMAGE: str = os.environ.get("PACKTRAIN_IMAGE") or _DEFAULTS.base_image
"""train and evaluate: CUDA base, GPU torch, packtrain[deepspeed]."""
CPU_IMAGE: str = os.environ.get("PACKTRAIN_CPU_IMAGE") or _DEFAULTS.cpu_image
"""ingest, validate, tokenize, pack, register: CPU torch, packtrain."""
