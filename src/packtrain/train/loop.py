"""`train(...)`: the training loop over packed micro-batches. Setup lives in `session.TrainSession`.

One optimizer step = `grad_accum` micro-batches of fixed shape (1, rows·budget). The loss of each micro-batch
is its token-loss sum divided by the label tokens of the whole window on all ranks (÷W more, since DDP and
DeepSpeed average gradients over W ranks), so the step's gradient is the token-mean over the window no matter
how the documents were packed or accumulated (packing.batches.token_mean_loss).
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TrainResult:
    """What a training run did; `to_dict()` is train_result.json."""

    steps: int                      # optimizer steps completed (max_steps)
    start_step: int                 # 0, or the checkpoint step this run resumed from
    tokens: int                     # real (non-padding) tokens trained on, all ranks, all steps
    label_tokens: int
    slot_tokens: int                # rows·budget·grad_accum·W per step: real + padding
    final_loss: float | None
    loss_curve: list[float]         # per optimizer step 1..steps
    lr_curve: list[float]
    skipped_steps: int              # fp16 steps skipped by the loss scaler
    compiles: int | None            # torch.compile frames compiled (None: compile off)
    recompiles: int | None          # of which recompiles (guard failures): 0 with a fixed budget
    timings: dict                   # setup_s, train_s, checkpoint_s, save_s, total_s
    throughput: dict                # ThroughputMeter.summary(): tokens/s, MFU, step-time percentiles
    memory: dict                    # cuda_memory_stats(): peak alloc/reserved GiB, fragmentation
    system: dict                    # SystemSampler.summary() over the steady state: utilization
    violations: list[str]           # telemetry thresholds (utilization, fragmentation, padding) not met
    telemetry_files: list[str]      # telemetry.json (+ system.png, throughput.png) in out_dir
    setup: dict                     # attention, precision, engine, rows, budget, grad_accum, world_size, ...
    params: dict                    # total / embedding / non_embedding
    model_dir: str | None
    checkpoint: str | None
    history: list[dict] = field(default_factory=list, repr=False)
    report: Any = field(default=None, repr=False)   # packtrain.telemetry.report.TelemetryReport (rank 0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("history")
        d.pop("report")
        return d


def train(model_cfg, train_cfg, pack_cfg, telemetry_cfg, packs_dir, tokenizer_dir, out_dir, tracker=None,
          resume: bool = False, plan_cfg=None) -> TrainResult:
    """Train on `packs_dir/train` and write `out_dir/model` (+ checkpoints, train_log.jsonl).

    tokenizer_dir: the tokenize stage's output (its tokenizer/ is copied next to the model).
    tracker: a `packtrain.tracking.StageRun` (per-step metrics with step=) or None.
    resume: continue from the newest valid checkpoint in out_dir/checkpoints (corrupt ones skipped).
    """
    import torch
    from tqdm import tqdm

    from packtrain.model.attention import model_inputs
    from packtrain.packing.batches import token_mean_loss
    from packtrain.train.session import TrainSession

    t_start = time.perf_counter()
    with TrainSession(model_cfg, train_cfg, pack_cfg, telemetry_cfg, packs_dir, tokenizer_dir, out_dir,
                      tracker, plan_cfg) as s:
        start = s.restore(resume)
        ga, world, compiled = s.shape.grad_accum, s.dist.world_size, train_cfg.compile
        batches = s.batches()
        bar = tqdm(total=train_cfg.max_steps, initial=start, desc="train", unit="step", file=sys.stderr,
                   disable=not s.dist.is_main, dynamic_ncols=True)
        t_loop = time.perf_counter()
        for step in range(start + 1, train_cfg.max_steps + 1):
            t0 = time.perf_counter()
            window = [next(batches) for _ in range(ga)]                     # ga × (1, rows·budget)
            data_wait = time.perf_counter() - t0
            n_labels = s.global_sum(sum(b.n_label_tokens for b in window))  # window label tokens, all ranks
            lr = s.scheduler.get_last_lr()[0]
            loss_sum = torch.zeros((), device=s.device)
            try:
                for i, b in enumerate(window):
                    b = b.to(s.device)
                    with s.autocast():
                        ls = s.module(labels=b.labels, **model_inputs(b, s.backend, compiled))   # fp32 scalar
                    s.stepper.backward(token_mean_loss(ls, n_labels / world), last=i == ga - 1)
                    loss_sum += ls.detach()
                info = s.stepper.step()
            except torch.OutOfMemoryError as e:
                raise s.oom(step) from e
            if not info.skipped:
                s.scheduler.step()
            loss = s.global_sum(loss_sum.item()) / max(n_labels, 1)
            m = s.record(step, window, n_labels, loss, lr, info, time.perf_counter() - t0, data_wait)
            bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{m['real_tokens_per_s'] * world:,.0f}")
            bar.update(1)
            if s.checkpoint_due(step):
                s.save_checkpoint(step)
        bar.close()
        train_s = time.perf_counter() - t_loop
        s.end_steady_state()
        t_save = time.perf_counter()
        model_dir = s.save_model()
        return _result(s, start, train_s, time.perf_counter() - t_save, time.perf_counter() - t_start, model_dir)


def _result(s, start: int, train_s: float, save_s: float, total_s: float, model_dir: Path | None) -> TrainResult:
    report, memory, system = s.telemetry_report()
    h = s.history
    cfg = s.cfg
    return TrainResult(
        steps=len(h), start_step=start,
        tokens=sum(x["real_tokens"] for x in h), label_tokens=sum(x["label_tokens"] for x in h),
        slot_tokens=sum(x["slot_tokens"] for x in h),
        final_loss=h[-1]["loss"] if h else None,
        loss_curve=[x["loss"] for x in h], lr_curve=[x["lr"] for x in h],
        skipped_steps=sum(bool(x["skipped"]) for x in h),
        compiles=s.compile_counter.compiles if s.compile_counter else None,
        recompiles=s.compile_counter.recompiles if s.compile_counter else None,
        timings={**s.timings, "train_s": train_s, "save_s": save_s, "total_s": total_s},
        throughput=s.meter.summary(), memory=memory, system=system,
        violations=list(report.violations) if report else [],
        telemetry_files=[str(f) for f in report.files] if report else [],
        setup={"attention": s.backend, "precision": cfg.precision, "engine": cfg.engine,
               "device": str(s.device), "rows": s.shape.rows, "budget": s.shape.budget,
               "tokens_per_micro_batch": s.shape.tokens, "grad_accum": s.shape.grad_accum,
               "budget_source": s.shape.source, "world_size": s.dist.world_size,
               "activation_checkpointing": cfg.activation_checkpointing, "checkpointed_layers": len(s.ac_layers),
               "compile": cfg.compile, "loss": cfg.loss, "allocator_expandable_segments": s.allocator_env,
               "resumed_from": s.resumed_from},
        params=s.params.to_dict(),
        model_dir=str(model_dir) if model_dir else None,
        checkpoint=str(s.last_ckpt) if s.last_ckpt else None,
        history=h, report=report,
    )
