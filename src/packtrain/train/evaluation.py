"""Held-out evaluation during training (`train.eval_every_steps`) and early stopping (`train.early_stopping`).

The evaluation is the evaluate stage's own code on the live model: `packtrain.evaluate.perplexity.open_eval_loader`
over `<packs>/eval` (the tokenize stage's held-out documents, labels masked as train.loss_on) and
`evaluate_batches` with evaluate.rows / seed / max_batches / precision and the training attention backend,
under `torch.inference_mode()` with the model in eval mode (compiled layers run eagerly: no graph of its own,
no recompile counted) — no gradient, no optimizer state, no RNG draw
from the training streams, so training continues bit-identically (tests/stages/test_train_eval.py compares
loss curves with and without it).

    step  1 … 10  11 … 20  21 … 30  31 … 40        eval_every_steps 10, early_stopping.patience 2
    eval_loss     3.91     3.52     3.55     3.60
    since best    0        0        1        2  → stop after step 40; model/ = checkpoint step_000020

Early-stopping state is a pure function of the run's history (`early_stop`: the `eval_loss` entries of
train_log.jsonl), so a resumed run continues counting where its checkpoint left off. Every evaluation that
sets a new lowest eval_loss saves a checkpoint at that step (its manifest records `eval_loss`; retention keeps
it), and at the end the loop loads that checkpoint's weights before writing model/ — the exported model is
the one with the lowest held-out loss, not the last one.

Cost: each evaluation is one pass over min(evaluate.max_batches, one epoch) eval micro-batches of
evaluate.rows × pack.budget tokens (forward only, ≈ 1/3 of a training micro-batch each) plus a checkpoint
when the loss improved; steps between evaluations run the unchanged loop.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from packtrain.config import EvalConfig, TrainConfig
    from packtrain.config.train import EarlyStoppingConfig
    from packtrain.train.session import TrainSession


@dataclass(frozen=True, slots=True)
class EarlyStop:
    """Where a run stands: the lowest eval_loss so far (first step reaching it), evaluations since the last
    improvement by more than min_delta, and whether to stop now."""

    best_step: int | None
    best_loss: float | None
    since_improvement: int
    stop: bool


def early_stop(history: list[dict], cfg: EarlyStoppingConfig | None) -> EarlyStop:
    """EarlyStop from the history's `eval_loss` entries. patience 2, min_delta 0.05:

    >>> from packtrain.config.train import EarlyStoppingConfig
    >>> h = [{"step": 10, "eval_loss": 3.0}, {"step": 20, "eval_loss": 2.98}, {"step": 30, "eval_loss": 3.1}]
    >>> early_stop(h, EarlyStoppingConfig(patience=2, min_delta=0.05))
    EarlyStop(best_step=20, best_loss=2.98, since_improvement=2, stop=True)

    (2.98 is the lowest loss — the one exported — but not an improvement by more than 0.05 on 3.0.) A
    non-finite eval_loss never improves."""
    best_step, best, ref, since = None, math.inf, math.inf, 0
    min_delta = cfg.min_delta if cfg is not None else 0.0
    for h in history:
        loss = h.get("eval_loss")
        if not isinstance(loss, (int, float)):
            continue
        finite = math.isfinite(loss)
        if finite and loss < best:
            best, best_step = float(loss), int(h["step"])
        if finite and loss < ref - min_delta:
            ref, since = float(loss), 0
        else:
            since += 1
    return EarlyStop(best_step, best if best_step is not None else None, since,
                     cfg is not None and since >= cfg.patience)


@dataclass(slots=True)
class Evaluator:
    """Evaluates the live model of a TrainSession every `every` steps and at `max_steps`."""

    split: Path                  # <packs>/eval
    every: int
    max_steps: int
    eval_cfg: EvalConfig
    loss_on: str
    early_stopping: EarlyStoppingConfig | None

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.max_steps

    def evaluate(self, s: TrainSession) -> dict[str, Any]:
        """{"eval_loss", "eval_perplexity", "eval_tokens", "eval_s"} of the current weights (rank 0's numbers
        on every rank: each rank evaluates its full replica, rank 0's result is broadcast so all decide alike)."""
        import torch

        from packtrain.config.evaluate import eval_precision
        from packtrain.evaluate.perplexity import evaluate_batches, open_eval_loader
        from packtrain.model.lora import adapter_input_casts, lora_layers
        from packtrain.train.distributed import broadcast_object

        cfg, model = self.eval_cfg, s.parts.model
        loader = open_eval_loader(self.split, cfg.rows, cfg.seed, self.loss_on, s.device.type)
        n = len(loader) if cfg.max_batches is None else min(len(loader), cfg.max_batches)
        was_training = model.training
        model.eval()
        try:
            # compiled layers (train.compile) run eagerly here: the eval shape and inference mode would otherwise
            # compile graphs of their own, counted as recompiles of the training graph; LoRA branches cast
            # their input to the adapter's dtype again (an fp32 evaluation has no autocast to do it)
            with torch.compiler.set_stance("force_eager"), adapter_input_casts(lora_layers(model), True):
                sums = evaluate_batches(model, itertools.islice(iter(loader), n), s.device,
                                        eval_precision(cfg.precision, s.device.type),
                                        total=n, backend=s.parts.backend)
        finally:
            model.train(was_training)
        loss = sums["loss_sum"] / max(sums["n_label_tokens"], 1)
        out = {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0)),
               "eval_tokens": sums["n_label_tokens"], "eval_s": round(sums["seconds"], 4)}
        return broadcast_object(out, s.dist)

    def log(self, s: TrainSession, step: int, ev: dict[str, Any]) -> None:
        """MLflow: eval_loss at `step` (every evaluation, whatever train.log_every); its perplexity, exp(eval_loss),
        is in train_log.jsonl, not a second chart of the same number."""
        if s.dist.is_main and s.tracker is not None:
            s.tracker.log_metrics({"eval_loss": ev["eval_loss"]}, step=step)

    def state(self, s: TrainSession) -> EarlyStop:
        return early_stop(s.checkpoints.history, self.early_stopping)

    def restore_best(self, s: TrainSession, last_step: int) -> int:
        """Load the weights of the lowest-eval_loss checkpoint when it is not the last step; returns the step
        whose weights the model now holds."""
        from packtrain.errors import MissingDataError
        from packtrain.train.checkpoint import step_dir_name
        from packtrain.train.checkpoint_manifest import verify_checkpoint

        best = self.state(s).best_step
        if best is None or best == last_step:
            return last_step
        path = s.checkpoints.root / step_dir_name(best)
        reason = verify_checkpoint(path) if path.is_dir() else "it is missing"
        if reason is not None:
            raise MissingDataError(f"the lowest-eval_loss checkpoint {path} cannot be exported ({reason}); model/ "
                                   "was not written")
        s.parts.stepper.load(path)
        return best


def build_evaluator(train_cfg: TrainConfig, eval_cfg: EvalConfig | None, packs_dir: Path) -> Evaluator | None:
    """The Evaluator of `train.eval_every_steps` (None when 0); MissingDataError when there are no eval packs."""
    from packtrain.config import EvalConfig
    from packtrain.errors import MissingDataError

    if not train_cfg.eval_every_steps:
        return None
    split = Path(packs_dir) / "eval"
    if not (split / "meta.json").is_file():
        raise MissingDataError(f"train.eval_every_steps={train_cfg.eval_every_steps} evaluates on {split}, which "
                               "does not exist: pack with tokenize.eval_fraction > 0 (the held-out split), or set "
                               "train.eval_every_steps=0")
    return Evaluator(split, train_cfg.eval_every_steps, train_cfg.max_steps, eval_cfg or EvalConfig(),
                     train_cfg.loss_on, train_cfg.early_stopping)
