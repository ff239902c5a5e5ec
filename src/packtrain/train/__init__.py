"""The train stage: `loop.train(...) -> TrainStats` and the techniques it applies.

    loop.py             train(): the loop (one screen); TrainStats
    session.py          TrainSession: its parts built in order, per-step records, checks, final save
    parts.py            DataParts, ModelParts, Telemetry: declared fields (slots) + one builder each
    resume.py           Checkpointing: restore (resume / refuse / overwrite) and each checkpoint save
    distributed.py      ranks, devices, host-side collectives (no-ops on one process)
    torch_engine.py     TorchStepper: the plain torch/DDP engine; StepInfo, what every engine's step returns
    oom.py              the out-of-memory error naming planned and observed peaks (shape: planner's choose_shape)
    prefetch.py         Prefetcher: the next micro-batches collated in a background thread
    techniques.py       activation checkpointing, compile (+ recompile counter), AMP, AdamW, LR schedule
    loss.py             standard / chunked LM loss on packed batches
    checkpoint.py       atomic, checksummed, keep-last-K checkpoints; newest valid one for --resume
    checkpoint_manifest.py  a checkpoint's manifest.json, its sha256 tree and verify_checkpoint
    deepspeed_engine.py the only module importing deepspeed: config builder + ZeRO stepper

Submodules import torch/transformers/deepspeed inside functions.
"""
