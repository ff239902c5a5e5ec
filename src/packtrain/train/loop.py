"""`train(...)`: the training loop over packed micro-batches. Setup lives in `session.TrainSession` (parts.py).

One optimizer step = `grad_accum` micro-batches of fixed shape (1, rows·budget). The loss of each micro-batch
is its token-loss sum divided by the label tokens of the whole window on all ranks (÷W more, since DDP and
DeepSpeed average gradients over W ranks), so the step's gradient is the token-mean over the window no matter
how the documents were packed or accumulated (packing.batches.token_mean_loss).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtrain.faults import active, fault_arg
from packtrain.record_fields import MEMORY_ONLY, record_dict

if TYPE_CHECKING:
    import torch

    from packtrain.packing.batches import PackedBatch
    from packtrain.train.evaluation import Evaluator
    from packtrain.train.guard_run import RunGuard
    from packtrain.train.parts import ModelParts
    from packtrain.train.session import TrainSession
    from packtrain.train.torch_engine import StepInfo


@dataclass
class TrainStats:
    """What a training run did: the train stage's record (packtrain.stages.results.TrainResult) holds these
    fields, by inheritance, plus the stage's own."""

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
    timings: dict                   # setup_s, train_s, checkpoint_s, save_s, total_s + non_step_timings()
    throughput: dict                # Telemetry.summary(): tokens/s, MFU, step-time percentiles, the peak MFU is
                                    # against (peak_tflops, peak_source, peak_reliable, peak_note)
    memory: dict                    # cuda_memory_stats(): peak alloc/reserved GiB, fragmentation
    system: dict                    # SystemSampler.summary() over the steady state: utilization
    violations: list[str]           # telemetry thresholds (utilization, fragmentation, padding) not met
    telemetry_files: list[str]      # telemetry.json (+ system.png, throughput.png) in out_dir
    setup: dict                     # attention, precision, engine, rows, budget, grad_accum, world_size, ...
    params: dict                    # total / embedding / non_embedding
    model_dir: str | None
    checkpoint: str | None
    evaluation: dict | None = None  # train.eval_every_steps: curve, best, early stop (packtrain.train.evaluation)
    guard: dict | None = None       # telemetry.guard: steady state, events, fallbacks (packtrain.train.guard_run)
    history: list[dict] = field(default_factory=list, repr=False, metadata=MEMORY_ONLY)
    report: Any = field(default=None, repr=False, metadata=MEMORY_ONLY)   # telemetry.report.TelemetryReport (rank 0)

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self)


def train(model_cfg, train_cfg, pack_cfg, telemetry_cfg, packs_dir, tokenizer_dir, out_dir, tracker=None,
          resume: bool = False, plan_cfg=None, overwrite: bool = False, eval_cfg=None) -> TrainStats:
    """Train on `packs_dir/train` and write `out_dir/model` (+ checkpoints, train_log.jsonl).

    tokenizer_dir: the tokenize stage's output (its tokenizer/ is copied next to the model).
    tracker: a `packtrain.tracking.StageRun` (per-step metrics with step=) or None.
    resume: continue from the newest valid checkpoint in out_dir/checkpoints (corrupt ones quarantined).
    overwrite: start from step 0 even though out_dir/checkpoints holds checkpoints (they are deleted); without
    it (and without resume) such a directory is refused. A non-finite loss, gradient norm or weights stop the
    run with TrainingDiverged (exit 8) before anything of that step is saved.
    eval_cfg: the evaluate config train.eval_every_steps evaluates with (packtrain.train.evaluation; None →
    EvalConfig()); with it on, model/ holds the lowest-eval_loss checkpoint and train.early_stopping may end
    the run before max_steps. telemetry_cfg.guard: the utilization guard watches each interval and may checkpoint
    and stop (GuardStopped, exit 6) or fall back (packtrain.train.guard_run).
    """
    from tqdm import tqdm

    from packtrain.train.evaluation import build_evaluator
    from packtrain.train.guard_run import RunGuard
    from packtrain.train.session import TrainSession

    t_start = time.perf_counter()
    evaluator = build_evaluator(train_cfg, eval_cfg, Path(packs_dir))   # None: train.eval_every_steps 0
    with TrainSession(model_cfg, train_cfg, pack_cfg, telemetry_cfg, packs_dir, tokenizer_dir, out_dir,
                      tracker, plan_cfg) as s:
        start = s.restore(resume, overwrite)
        s.release_setup_memory()
        guard = RunGuard(s, telemetry_cfg, start)
        s.on_close(guard.close)   # the watchdog thread, NVML, a compile_off stance: gone however the run ends
        batches = s.data.start(s.device)
        bar = tqdm(total=train_cfg.max_steps, initial=start, desc="train", unit="step", file=sys.stderr,
                   disable=not s.dist.is_main, dynamic_ncols=True)
        s.on_close(bar.close)   # a failing step ends the bar's line: the `error:` line then starts its own
        t_loop = time.perf_counter()
        last_step, stopped = _run_steps(s, batches, start, guard, evaluator, bar)
        bar.close()
        t_steps_end = time.perf_counter()
        s.end_steady_state()
        last = s.checkpoints.last
        if last is None or not last.name.endswith(f"{last_step:06d}"):
            s.check_finite_weights(last_step)   # (a checkpoint at the last step checked them already)
        exported = evaluator.restore_best(s, last_step) if evaluator is not None else last_step
        t_save = time.perf_counter()
        model_dir = s.save_model()
        result = _result(s, start, t_steps_end - t_loop, time.perf_counter() - t_save, time.perf_counter() - t_start,
                         model_dir)
        result.timings.update(non_step_timings(result.history, t_start, t_loop, t_steps_end, time.perf_counter()))
        if evaluator is not None:
            result.evaluation = _evaluation(s, evaluator, exported, stopped)
        result.guard = guard.finish()
        return result


def _run_steps(s: TrainSession, batches: Iterator[PackedBatch], start: int, guard: RunGuard,
               evaluator: Evaluator | None, bar: Any) -> tuple[int, bool]:
    """Optimizer steps start+1..max_steps, each recorded, checkpointed when due, evaluated when due (early
    stopping may end them); returns (the last step taken, whether early stopping ended the run)."""
    max_steps = s.cfg.max_steps
    last_end = time.perf_counter()     # when the previous step's numbers reached the host
    # One step behind on CUDA without a loss scaler: the host reads step t's loss/grad norm only after it
    # has queued step t+1, so the GPU never idles on a per-step `.item()` (NVML util 94% → 99%). Over
    # several GPUs the sums over ranks are host all-reduces (gloo), which do not drain the GPU either.
    deferred = s.device.type == "cuda" and s.parts.step_is_async()
    world = s.dist.world_size
    pending: StepDone | None = None
    last_step = start
    for step in range(start + 1, max_steps + 1):
        done = _take_step(s, step, batches, guard, deferred)
        if pending is not None:
            last_end = _finish(s, bar, pending, world, last_end, guard)
        pending = done
        evaluate = evaluator is not None and evaluator.due(step)
        if not deferred or s.checkpoint_due(step) or step == max_steps or evaluate:
            last_end = _finish(s, bar, pending, world, last_end, guard, evaluator if evaluate else None)
            pending = None
        guard.idle()
        state = evaluator.state(s) if evaluate and evaluator is not None else None
        if s.checkpoint_due(step) or (state is not None and state.best_step == step):   # a new lowest eval_loss
            s.save_checkpoint(step)
            last_end = time.perf_counter()   # saving is not part of the next step's time
        if guard.pending:   # events of the steps recorded so far: report; checkpoint + stop or fall back
            if pending is not None:
                last_end = _finish(s, bar, pending, world, last_end, guard)
                pending = None
            guard.act(step)
            last_end = time.perf_counter()
        last_step = step
        if state is not None and state.stop:
            return last_step, True
    return last_step, False


def _take_step(s: TrainSession, step: int, batches: Iterator[PackedBatch], guard: RunGuard,
               deferred: bool) -> StepDone:
    """Draw the step's window of grad_accum micro-batches and queue its forward, backward and optimizer step;
    its numbers stay on the device (`_finish` reads them)."""
    import torch

    from packtrain.train.guard_run import inject_recompile

    m, ga, world, compiled = s.parts, s.data.shape.grad_accum, s.dist.world_size, s.cfg.compile
    guard.begin(step, "data")
    t0 = time.perf_counter()
    window = [next(batches) for _ in range(ga)]                     # ga × (1, rows·budget)
    delay = fault_arg("train.slow_data", step) or fault_arg(f"train.slow_data_rank{s.dist.rank}", step)
    if delay:                                                        # fault-injection test hook
        time.sleep(float(delay) * ga)
    data_wait = time.perf_counter() - t0
    guard.begin(step, "step")
    n_labels = guard.global_sum(sum(b.n_label_tokens for b in window))   # window label tokens, all ranks
    lr = m.scheduler.get_last_lr()[0]
    if fault_arg("train.recompile", step) is not None:              # fault-injection test hook
        inject_recompile(s, window[0], compiled)
    try:
        loss_sum, info = run_step(m, window, n_labels / world, s.device, compiled)
    except torch.OutOfMemoryError as e:
        raise s.oom(step) from e
    stall = fault_arg("train.slow_step", step) or fault_arg(f"train.slow_step_rank{s.dist.rank}", step)
    if stall:                                                        # fault-injection test hook
        time.sleep(float(stall))
    if not info.skipped:
        m.scheduler.step()
    return StepDone(step, window, n_labels, loss_sum, lr, info, data_wait, s.device if deferred else None)


def non_step_timings(history: list[dict], t_start: float, t_loop: float, t_steps_end: float, t_end: float
                     ) -> dict[str, float]:
    """Where a run's wall time went besides steady steps (perf_counter seconds):
    process_to_loop_s   process start (psutil) → the first step begins: imports, model build, data, restore
    setup_to_loop_s     train() entered → the first step begins
    first_step_s        the first step's own time (compile, kernel selection, allocator warm-up)
    compile_s           first_step_s − the median step time: what the first step cost over a steady one
    after_steps_s       the last step ends → train() returns: final checks, best-checkpoint restore, export"""
    import statistics

    try:
        import psutil

        since_process = time.time() - psutil.Process().create_time() - (time.perf_counter() - t_loop)
    except Exception:   # psutil unavailable or no access: the part inside train() is still known
        since_process = float("nan")
    steps = [float(h["step_time_s"]) for h in history if h.get("step_time_s") is not None]
    first = steps[0] if steps else 0.0
    median = statistics.median(steps[1:]) if len(steps) > 1 else first
    return {"process_to_loop_s": round(since_process, 3), "setup_to_loop_s": round(t_loop - t_start, 3),
            "first_step_s": round(first, 3), "compile_s": round(max(first - median, 0.0), 3),
            "after_steps_s": round(t_end - t_steps_end, 3)}


def run_step(m: ModelParts, window: list[PackedBatch], label_divisor: float, device: torch.device,
             compiled: bool) -> tuple[torch.Tensor, StepInfo]:
    """Forward + backward over the window's micro-batches, then one optimizer step. Returns the window's loss
    sum (a 0-d tensor on `device`, not synced) and the step's info."""
    import torch

    from packtrain.model.attention import model_inputs
    from packtrain.packing.batches import token_mean_loss

    loss_sum = torch.zeros((), device=device)
    for i, b in enumerate(window):
        b = b.to(device)
        with m.autocast():
            ls = m.module(labels=b.labels, **model_inputs(b, m.backend, compiled))   # fp32 scalar
        m.stepper.backward(token_mean_loss(ls, label_divisor), last=i == len(window) - 1)
        loss_sum += ls.detach()
    return loss_sum, m.stepper.step()


class StepDone:
    """A step whose kernels are queued: its loss sum and grad norm stay on the GPU until `_finish` reads them
    (through a pinned copy + event when deferred, so the read waits for this step only, not the next)."""

    __slots__ = ("step", "window", "n_labels", "lr", "info", "data_wait", "loss_sum", "event", "host")

    def __init__(self, step: int, window: list[PackedBatch], n_labels: float, loss_sum: torch.Tensor, lr: float,
                 info: StepInfo, data_wait: float, device: torch.device | None) -> None:
        import torch

        self.step, self.window, self.n_labels, self.lr, self.info = step, window, n_labels, lr, info
        self.data_wait, self.loss_sum = data_wait, loss_sum
        self.event: torch.cuda.Event | None = None
        self.host: torch.Tensor | None = None
        if device is not None:
            norm = info.grad_norm if isinstance(info.grad_norm, torch.Tensor) else None
            vals = torch.stack([loss_sum.float(), norm.float() if norm is not None else loss_sum.float()])
            self.host = torch.empty(2, dtype=torch.float32, pin_memory=True)
            self.host.copy_(vals, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()

    def values(self) -> tuple[float, float | None]:
        import torch

        if self.event is not None and self.host is not None:
            self.event.synchronize()
            loss_sum, norm = float(self.host[0]), float(self.host[1])
            return loss_sum, (norm if isinstance(self.info.grad_norm, torch.Tensor) else self.info.grad_norm)
        g = self.info.grad_norm
        return float(self.loss_sum.item()), (float(g) if g is not None else None)


def _finish(s: TrainSession, bar: Any, d: StepDone, world: int, last_end: float, guard: RunGuard,
            evaluator: Evaluator | None = None) -> float:
    """Read a step's numbers on the host and record them; returns when that happened. The step time is the time
    between the host seeing consecutive steps complete, which in steady state is the GPU's step time. With an
    `evaluator` the held-out loss is measured after the step's checks and recorded with it (its time is not
    the step's, nor the next one's)."""
    loss_sum, norm = d.values()
    now = time.perf_counter()
    step_time = now - last_end
    d.info.grad_norm = norm
    loss = guard.global_sum(loss_sum) / max(d.n_labels, 1)
    if active(f"train.nan_loss@{d.step}"):   # fault-injection test hook (packtrain.faults)
        loss = float("nan")
    s.check_step_finite(d.step, loss, norm, bool(d.info.skipped))   # before it is logged as a good step
    if evaluator is not None:
        guard.idle()   # an evaluation is not a step the hang watchdog should time
    ev = evaluator.evaluate(s) if evaluator is not None else None
    m = s.record(d.step, d.window, d.n_labels, loss, d.lr, d.info, step_time, d.data_wait, extra=ev)
    guard.observe(d.step)
    if ev is not None and evaluator is not None:
        evaluator.log(s, d.step, ev)
        now = time.perf_counter()
    bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{m['real_tokens_per_s'] * world:,.0f}")
    bar.update(1)
    return now


def _evaluation(s: TrainSession, evaluator: Evaluator, exported: int, stopped: bool) -> dict:
    """train_result.json `evaluation`: {"every_steps", "curve": [{"step", "eval_loss"}], "best_step",
    "best_eval_loss", "exported_step" (whose weights model/ holds), "early_stopped", "stopped_at",
    "early_stopping": {patience, min_delta} | None}."""
    st = evaluator.state(s)
    h = s.checkpoints.history
    es = evaluator.early_stopping
    return {"every_steps": evaluator.every,
            "curve": [{"step": x["step"], "eval_loss": x["eval_loss"]} for x in h if "eval_loss" in x],
            "best_step": st.best_step, "best_eval_loss": st.best_loss, "exported_step": exported,
            "early_stopped": stopped, "stopped_at": h[-1]["step"] if stopped and h else None,
            "early_stopping": es.model_dump() if es is not None else None}


def _result(s: TrainSession, start: int, train_s: float, save_s: float, total_s: float,
            model_dir: Path | None) -> TrainStats:
    report, memory, system = s.telemetry_report()
    h, cfg, m, shape, c = s.checkpoints.history, s.cfg, s.parts, s.data.shape, s.checkpoints
    counter = m.compile_counter
    return TrainStats(
        steps=len(h), start_step=start,
        tokens=sum(x["real_tokens"] for x in h), label_tokens=sum(x["label_tokens"] for x in h),
        slot_tokens=sum(x["slot_tokens"] for x in h),
        final_loss=h[-1]["loss"] if h else None,
        loss_curve=[x["loss"] for x in h], lr_curve=[x["lr"] for x in h],
        skipped_steps=sum(bool(x["skipped"]) for x in h),
        compiles=counter.compiles if counter else None,
        recompiles=counter.recompiles if counter else None,
        timings={**s.timings, "train_s": train_s, "save_s": save_s, "total_s": total_s},
        throughput=s.telemetry.summary(), memory=memory, system=system,
        violations=list(report.violations) if report else [],
        telemetry_files=[str(f) for f in report.files] if report else [],
        setup={"attention": m.backend, "precision": cfg.precision, "engine": cfg.engine,
               "device": str(s.device), "rows": shape.rows, "budget": shape.budget,
               "tokens_per_micro_batch": shape.tokens, "grad_accum": shape.grad_accum,
               "rows_source": shape.source, "world_size": s.dist.world_size,
               "activation_checkpointing": cfg.activation_checkpointing, "checkpointed_layers": len(m.ac_layers),
               "compile": cfg.compile, "loss": cfg.loss, "allocator_expandable_segments": s.allocator_env,
               "adapter": cfg.adapter.type, "loss_on": cfg.loss_on,
               "resumed_from": c.resumed_from},
        params=m.params.to_dict(),
        model_dir=str(model_dir) if model_dir else None,
        checkpoint=str(c.last) if c.last else None,
        history=h, report=report,
    )
