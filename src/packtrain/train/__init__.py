"""The train stage: `loop.train(...) -> TrainResult` and the techniques it applies.

    loop.py             train(): the loop (one screen); TrainResult
    session.py          TrainSession: its parts built in order, per-step records, checks, final save
    parts.py            DataParts, ModelParts, Telemetry: declared fields (slots) + one builder each
    resume.py           Checkpointing: restore (resume / refuse / overwrite) and each checkpoint save
    runtime.py          ranks/devices, TorchStepper, OOM error (the micro-batch shape: planner's choose_shape)
    techniques.py       activation checkpointing, compile (+ recompile counter), AMP, AdamW, LR schedule
    loss.py             standard / chunked LM loss on packed batches
    checkpoint.py       atomic, checksummed, keep-last-K checkpoints; newest valid one for --resume
    checkpoint_manifest.py  a checkpoint's manifest.json, its sha256 tree and verify_checkpoint
    deepspeed_engine.py the only module importing deepspeed: config builder + ZeRO stepper

Submodules import torch/transformers/deepspeed inside functions.
"""
