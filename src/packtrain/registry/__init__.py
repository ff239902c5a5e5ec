"""The model registry room: a model logged to and loaded from the MLflow Model Registry, and the promotion
operation that registers a version and moves the champion/challenger aliases.

    op.py            build the registration op (`build_registration`: JSON, no MLflow call) and the verdict it
                     carries (`promotion_verdict`: the paired evaluation under register.promotion)
    apply.py         apply the op to MLflow (`apply_registration`: model, version, aliases, run logging; idempotent,
                     and by content: the same weights and lineage are one version)
    outcome.py       `RegisterOutcome`: what applying the op did (the register stage's record extends it)
    champion.py      the decision: verdict → alias, the gate against the champion, the compare-and-set
    model.py         log a model directory (`log_model_dir`), load a version back (`load_champion`, `load_registered`)
    files.py         the `files` flavor: the exported files as they are
    adapter.py       a LoRA model: its merged/ registered, its adapter files as artifacts
    lineage_tags.py  the lineage tags of a version, read from the upstream stages' results
    source.py        a registered version as a starting point (`model.init_from`: download, cache, resolve)

The register stage (packtrain.stages.register) builds the op and submits it through its tracked run; the tracking
buffer applies it live, or later when the store was down, through the handler `install_handlers` registers
(packtrain.tracking.store_ops.register_handler): a plain call, no import by name. The CLI, the pipeline's stage
components and the register stage install it; a process that never did keeps a buffered registration pending
(never rejected) until one that has replays it.

Import from the module that defines a name (`from packtrain.registry.model import load_champion`): the package
itself holds only `install_handlers`, so importing it costs no torch/mlflow import.
"""

from __future__ import annotations

__all__ = ["install_handlers"]


def install_handlers() -> None:
    """Register the buffered op kinds this room applies (`register_model` → apply_registration) with the tracking
    buffer; idempotent."""
    from packtrain.registry.apply import apply_registration
    from packtrain.tracking.store_ops import register_handler

    register_handler("register_model", apply_registration)
