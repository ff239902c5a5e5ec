"""Stage `train`: train the model on the packs, save it loadable by transformers, track the run in MLflow.

    run_train(cfg, packs_dir, tokens_dir, out_dir, resume=False)
      reads   packs_dir/train/ (pack store), tokens_dir/tokenizer/ (copied next to the model)
      writes  out_dir/model/              save_pretrained (safetensors) + tokenizer files
              out_dir/train_result.json   packtrain.stages.results.TrainResult (steps, tokens, loss curve,
                                          timings, throughput, memory, packing_fill, lineage), also returned
              out_dir/train_log.jsonl     one line per optimizer step
              out_dir/checkpoints/        resumable checkpoints (train.checkpoint: every_steps, keep_last,
                                          keep_best); quarantine/ holds ones that failed verification
              out_dir/deepspeed_config.json   (engine: deepspeed)
              out_dir/telemetry.json (+ system.png, throughput.png)   packtrain.telemetry.report
              <workdir>/compile-cache/<key>/   torch.compile's caches (packtrain.train.compile_cache; unless
                                          TORCHINDUCTOR_CACHE_DIR is set): timings.compile_cache hit | miss | off
      refuses  a fresh run (no resume) into an out_dir holding checkpoints unless overwrite (exit 2; quarantined
              checkpoints do not count and are kept either way); a run into an out_dir that another run is
              writing (exit 7, naming it: packtrain.pipeline.lock.output_lock)
      MLflow  run "train" (rank 0 only; docs/tracking.md "The MLflow layout"): params train.* and model.*;
              charts at their optimizer step: loss, real_tokens_per_s, useful_mfu (packtrain.tracking.layout.
              STEP_CHARTS); the sampler's utilization/memory as system metrics system/train_* at their sample
              time; datasets train_packs (context training) and, when it evaluates, eval_packs (eval); the final
              numbers once (`log_finals`: the pipeline run's train.* + summary.json); threshold violations as
              tags; the files above as artifacts. The register stage later logs the model as this run's output
      guard   telemetry.guard (docs/guard.md): events as metrics at their step (guard.events, guard.<signal>),
              tags packtrain.guard.events / packtrain.guard.fallbacks, out_dir/guard_events.json (artifact),
              train_result.json `guard`; a checkpoint_and_stop ends the run with GuardStopped (exit 6)
      eval    train.eval_every_steps N > 0 (packtrain.train.evaluation): eval_loss / eval_perplexity every N
              steps (train_log.jsonl; eval_loss also the MLflow metric at the step), train.early_stopping, and
              model/ = the lowest-eval_loss checkpoint; train_result.json `evaluation` (curve, best_step,
              exported_step, early_stopped), final numbers evaluation.best_eval_loss / best_step / early_stopped

Warm start (`model.init_from` not scratch; packtrain.registry.source, packtrain.model.warm_start):
      resolves  the init source before any work: a registry source is downloaded once into
                <workdir>/models/<name>/v<version>/; champion without a champion → model.init_fallback
      refuses   a token store made by another tokenizer than the init model's (model.tokenizer_check=strict),
                or holding ids ≥ its vocabulary (exit 2, both hashes named), before the MLflow run opens
      measures  the step-0 held-out loss of the initial weights on packs_dir/eval with the evaluate stage's code
                and settings: train_result.json `init_eval_loss` (+ `init`: the resolved source, the tokenizer
                check, the evaluation), final number init_eval_loss, out_dir/init_eval.json
                (a resumed run reports the number its first attempt measured)
      tags      packtrain.init_from, packtrain.init_resolved, packtrain.init_fallback_reason,
                packtrain.parent_model_version / packtrain.parent_model (the register stage copies them onto
                the new version)

One rank of a `train.gpus` > 1 launch (packtrain.train.launch.launch_ranks) runs `main` here, as
`python -m packtrain.stages.train --config run.yaml --packs P --tokens T --out O [--resume] [--overwrite]`:
run_train sees RANK and does not launch again; rank 0's PacktrainError goes to the launcher's error file.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from packtrain.config import RunConfig, flatten
from packtrain.errors import ConfigError, MissingDataError, PacktrainError
from packtrain.publish import write_json
from packtrain.stages.lineage import Lineage, make_lineage
from packtrain.stages.results import PackResult, TokenizeResult, TrainResult, from_library

if TYPE_CHECKING:
    from packtrain.train.compile_cache import CompileCache


def check_inputs(cfg: RunConfig, packs_dir: Path, tokens_dir: Path) -> tuple[Path, str]:
    """Fail before any work (and before an MLflow run opens) when an upstream output is missing or the
    attention backend (or train.precision=fp8) cannot run here; returns the tokenizer directory and the resolved
    backend."""
    from packtrain.model.attention import resolve_attention
    from packtrain.packing.store import PackStore

    device = train_device(cfg)
    if cfg.train.precision == "fp8":   # FP8 tensor cores (compute capability ≥ 8.9) + torchao, or a clear refusal
        from packtrain.train.fp8 import check_fp8_support

        check_fp8_support(device)
    backend = resolve_attention(cfg.train.attention, device, cfg.train.precision)

    split = packs_dir / "train"
    if not split.is_dir():
        raise MissingDataError(f"train packs {split} do not exist: run `packtrain pack` first or pass --packs DIR")
    PackStore.open(split, verify=False)
    if cfg.train.eval_every_steps:   # the held-out split it evaluates on (packtrain.train.evaluation)
        from packtrain.train.evaluation import build_evaluator

        build_evaluator(cfg.train, cfg.evaluate, packs_dir)
    tok = tokens_dir / "tokenizer"
    if not tok.is_dir():
        raise MissingDataError(f"tokenizer {tok} does not exist: run `packtrain tokenize` first or pass --tokens "
                               "DIR (the tokenize stage's output directory)")
    return tok, backend


def family_backend(cfg: RunConfig, init_path: Path | None, backend: str) -> str:
    """train.attention for the init checkpoint's family (packtrain.model.families.pick_attention): `backend` (the
    device's pick) for a scratch model, else auto → the first backend the family allows on the device."""
    from packtrain.model.families import checkpoint_config, pick_attention

    family_cfg = checkpoint_config(init_path)
    if family_cfg is None:
        return backend
    return pick_attention(cfg.train.attention, train_device(cfg), cfg.train.precision, family_cfg, training=True,
                          where=f"model.init_from {init_path}")


def train_device(cfg: RunConfig) -> str:
    """'cuda' unless train.device is cpu or no GPU is visible (as the training loop picks it)."""
    import torch

    return "cuda" if cfg.train.device != "cpu" and torch.cuda.is_available() else "cpu"


def summary_metrics(d: dict) -> dict[str, float]:
    """The final numbers of a TrainResult dict, each once under its train-run name (`throughput.real_tokens_per_s`,
    `final_loss`, ...): what `StageRun.log_finals` sends (the per-step series are logged during training)."""
    out = {"final_loss": d["final_loss"], "steps": d["steps"], "tokens": d["tokens"],
           "skipped_steps": d["skipped_steps"], "recompiles": d["recompiles"], "compiles": d["compiles"]}
    if d.get("init_eval_loss") is not None:   # a warm start's step-0 held-out loss (its exp is in init_eval.json)
        out["init_eval_loss"] = d["init_eval_loss"]
    ev = d.get("evaluation") or {}
    if ev:   # the names the pipeline run has them under too (train.evaluation.best_eval_loss)
        out.update({"evaluation.best_eval_loss": ev.get("best_eval_loss"), "evaluation.best_step": ev.get("best_step"),
                    "evaluation.early_stopped": float(bool(ev.get("early_stopped")))})
    guard = d.get("guard") or {}
    if guard.get("enabled"):
        out.update({"guard.events_total": len(guard.get("events") or []),
                    "guard.fallbacks_total": len(guard.get("fallbacks") or []),
                    "guard.overhead_frac": guard.get("overhead_frac")})
    for section in ("throughput", "memory", "timings", "system"):
        for k, v in flatten(d.get(section) or {}).items():
            out[f"{section}.{k}"] = v
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def refuse_existing_run(out_dir: Path, resume: bool, overwrite: bool) -> None:
    """A fresh run into an output dir with checkpoints is refused before any work (and before an MLflow run
    opens): the checkpoints are someone's training run. --resume continues it, --overwrite deletes it.
    Quarantined checkpoints do not count (they are kept either way)."""
    from packtrain.train.checkpoint import existing_run, existing_run_message

    found = existing_run(out_dir / "checkpoints")
    if found and not (resume or overwrite):
        raise ConfigError(existing_run_message(out_dir / "checkpoints", found))


def refuse_nothing_to_resume(out_dir: Path) -> None:
    """A user's `--resume` into an output dir that holds no trace of a run (missing or empty: a typo'd --out,
    say) is an error, not a silent start from step 0 (exit 5, naming the directory looked in). A directory an
    interrupted attempt wrote into (killed before its first checkpoint committed: a partial `.tmp-step_N`, a
    train log) is that run's: --resume then starts from step 0 with the warning that says so, as do quarantined
    checkpoints. (A KFP pod's train always resumes: its first attempt has nothing yet, so only the command
    checks this.)"""
    from packtrain.train.checkpoint import existing_run, quarantined

    root = out_dir / "checkpoints"
    if existing_run(root) or quarantined(root):
        return
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        where = f"{out_dir} does not exist" if not out_dir.exists() else f"{out_dir} is empty"
        raise MissingDataError(f"--resume: nothing to resume: {where} (is --out {out_dir} the run's output "
                               "directory?); run without --resume to start from step 0")


def run_train(cfg: RunConfig, packs_dir: str | Path, tokens_dir: str | Path, out_dir: str | Path,
              resume: bool = False, overwrite: bool = False) -> TrainResult | None:
    """Train (module doc); the TrainResult on rank 0, None on the other ranks (only rank 0 writes stats).

    The whole run holds the lock of `out_dir` (packtrain.pipeline.lock.output_lock): a second run into the same
    output directory, from any workdir, stops at once with OutputBusy (exit 7) naming this one. The ranks of a
    distributed launch do not lock again (the launching process, or the cluster's job, is the one run)."""
    from packtrain.config.preflight import check_suite_packages
    from packtrain.pipeline.lock import output_lock
    from packtrain.train.launch import is_rank

    check_suite_packages(cfg.evaluate)   # `dvc repro`, a KFP pod: the evaluate stage after this one must be able to run
    from packtrain.train.compile_cache import workdir_compile_cache

    # the compile caches under <workdir>/compile-cache (train/compile_cache.py); torchrun's ranks inherit them
    with contextlib.nullcontext() if is_rank() else output_lock(out_dir, "train"), \
            workdir_compile_cache(cfg.workdir, train_device(cfg)) as compile_cache:
        return _run_train(cfg, Path(packs_dir), Path(tokens_dir), Path(out_dir), resume, overwrite, compile_cache)


def _run_train(cfg: RunConfig, packs_dir: Path, tokens_dir: Path, out_dir: Path, resume: bool,
               overwrite: bool, compile_cache: CompileCache) -> TrainResult | None:
    from packtrain.model.warm_start import check_store_matches_model
    from packtrain.registry.source import resolve_init
    from packtrain.telemetry.memory import begin_stage_memory
    from packtrain.train.distributed import dist_info
    from packtrain.train.loop import train

    begin_stage_memory()   # memory.cpu_peak_rss_gib: this stage's own peak, whatever ran before it in the process
    tokenizer_dir, backend = check_inputs(cfg, packs_dir, tokens_dir)
    refuse_existing_run(out_dir, resume, overwrite)
    from packtrain.train.launch import launch_ranks, needs_launch

    if needs_launch(cfg.train.gpus):   # train.gpus ranks through torchrun, each back here; rank 0's stats
        return launch_ranks(cfg, packs_dir, tokens_dir, out_dir, resume=resume, overwrite=overwrite)
    init = resolve_init(cfg)                             # registry → <workdir>/models/<name>/v<version>/
    backend = family_backend(cfg, init.path, backend)    # auto → a backend the init model's family allows
    tokenizer_check = check_store_matches_model(tokens_dir, init, backend, cfg.model.tokenizer_check)
    model_cfg = init.model_config(cfg.model)             # init_from = the resolved directory (or scratch)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not dist_info().is_main:   # only rank 0 talks to MLflow and writes the stage's stats
        train(model_cfg, cfg.train, cfg.pack, cfg.telemetry, packs_dir, tokenizer_dir, out_dir,
              tracker=None, resume=resume, plan_cfg=cfg.plan, overwrite=overwrite, eval_cfg=cfg.evaluate)
        return None
    from packtrain.tracking import stage_run
    from packtrain.tracking.layout import system_rows

    lineage = train_lineage(packs_dir, tokens_dir, tokenizer_dir)   # the inputs as read, before training

    step0 = initial_loss(cfg, init, packs_dir, out_dir, resume)   # before the MLflow run: a refusal opens none
    with stage_run("train", cfg, section=cfg.train) as run:
        run.log_params({f"model.{k}": v for k, v in flatten(cfg.model.model_dump(mode="json")).items()})
        run.set_tags(init.tags())
        log_datasets(run, cfg, packs_dir, lineage)
        result = train(model_cfg, cfg.train, cfg.pack, cfg.telemetry, packs_dir, tokenizer_dir, out_dir,
                       tracker=run, resume=resume, plan_cfg=cfg.plan, overwrite=overwrite, eval_cfg=cfg.evaluate)
        from packtrain.versioning import hash_ahead

        hash_ahead(out_dir / "model")   # what the evaluate stage's cache key reads first: hashed beside the tail
        result.timings.update(compile_cache.timings())   # compile_cache: hit | miss | partial | off
        if result.timings["compile_cache"] != "off":
            print(compile_cache.line("train"), file=sys.stderr, flush=True)
        from packtrain.evaluate.recipe_identity import recipe_identity

        typed = from_library(TrainResult, result.to_dict(), lineage, TrainResult.FILE,
                             init_eval_loss=step0["eval_loss"] if step0 is not None else None,
                             init={**init.to_dict(), "tokenizer_check": tokenizer_check, "eval": step0},
                             packing_fill=packing_fill(packs_dir / "train"), recipe=recipe_identity(cfg))
        typed.write(out_dir)
        stats = typed.to_dict()
        run.log_finals(summary_metrics(stats))   # the pipeline run's train.* (or this run's, alone) + summary.json
        if result.report is not None:
            run.log_report(result.report)   # violation tags, telemetry.json + PNGs
            run.log_series(system_rows(result.report.samples, result.report.t0_unix))
        run.set_tags({"packtrain.train.attention": stats["setup"]["attention"],
                      "packtrain.train.engine": stats["setup"]["engine"],
                      "packtrain.train.world_size": stats["setup"]["world_size"],
                      "packtrain.train.resumed_from": stats["setup"]["resumed_from"],
                      "packtrain.train.peak_source": stats["throughput"].get("peak_source"),
                      "packtrain.train.peak_note": stats["throughput"].get("peak_note")})   # MFU caveat, if any
        for name in ("train_result.json", "train_log.jsonl", "deepspeed_config.json", "init_eval.json",
                     "guard_events.json"):
            run.log_artifact(out_dir / name)
    return typed


def train_lineage(packs_dir: Path, tokens_dir: Path, tokenizer_dir: Path) -> Lineage:
    """md5 of the train split and of tokens.bin, the upstream chain (pack_result.json, then the token store's
    tokenize_result.json) and the hash of the tokenizer copied next to the model."""
    from packtrain.data.tokenizer_files import tokenizer_hash
    from packtrain.stages.lineage import upstream_lineage
    from packtrain.versioning import data_md5

    tokens_bin = tokens_dir / "tokens.bin"
    return make_lineage({"packs": data_md5(packs_dir / "train"),
                         "tokens": data_md5(tokens_bin) if tokens_bin.is_file() else None},
                        upstream_lineage(packs_dir / PackResult.FILE), upstream_lineage(tokens_dir / TokenizeResult.FILE),
                        tokenizer_hash=tokenizer_hash(tokenizer_dir))


def packing_fill(split: Path) -> float:
    """Fill of a pack store split: real tokens / (n_packs × budget), from its meta.json (packtrain.packing.store)."""
    from packtrain.packing.store import PackStore

    store = PackStore.open(split, verify=False)
    meta = store.meta
    return round(int(meta["n_tokens"]) / max(int(meta["n_packs"]) * int(meta["budget"]), 1), 6)   # as pack_result.json


def initial_loss(cfg: RunConfig, init, packs_dir: Path, out_dir: Path, resume: bool) -> dict | None:
    """The step-0 held-out loss of a warm start (packtrain.model.warm_start.initial_eval), None from scratch.
    Measured once per run: a resume from a checkpoint reports what the first attempt wrote to init_eval.json."""
    from packtrain.model.warm_start import INIT_EVAL_FILE, initial_eval, read_init_eval
    from packtrain.train.checkpoint import existing_run

    if init.path is None:
        return None
    if resume and existing_run(out_dir / "checkpoints"):
        return read_init_eval(out_dir)
    step0 = initial_eval(init.path, packs_dir / "eval", cfg.evaluate)
    if step0 is not None:
        step0 = {**step0, "init_resolved": init.resolved}
        write_json(out_dir / INIT_EVAL_FILE, step0)
    return step0


def log_datasets(run, cfg: RunConfig, packs_dir: Path, lineage: Lineage) -> None:
    """The train run's inputs (MLflow datasets, digest = DVC md5): the train split it trains on (context
    training) and, when train.eval_every_steps evaluates during training, the held-out split (context eval)."""
    from packtrain.versioning import data_md5

    run.log_dataset(packs_dir / "train", "train_packs", lineage.input_md5.get("packs"), context="training")
    if cfg.train.eval_every_steps and (packs_dir / "eval").is_dir():
        run.log_dataset(packs_dir / "eval", "eval_packs", data_md5(packs_dir / "eval"), context="eval")


def main(argv: list[str] | None = None) -> int:
    """One rank: load the run config, train (run_train sees RANK and does not launch again)."""
    p = argparse.ArgumentParser(prog="python -m packtrain.stages.train",
                                description="one rank of a data-parallel train stage (started by launch_ranks)")
    p.add_argument("--config", required=True)
    p.add_argument("--packs", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--overwrite", action="store_true")
    a = p.parse_args(argv)
    try:
        from packtrain.config import load_run_config

        cfg = load_run_config(a.config)
        run_train(cfg, a.packs, a.tokens, a.out, resume=a.resume, overwrite=a.overwrite)
        return 0
    except PacktrainError as e:
        from packtrain.secrets import redact_text
        from packtrain.train.launch import record_error

        record_error(e)
        print(f"error (rank {os.environ.get('RANK', '0')}): {redact_text(str(e))}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    from packtrain.process_exit import freeze_heap_at_exit

    # a rank's teardown garbage-collection is 2-6 s of wall on a loaded 2-core machine, which its peers and
    # torchrun wait out
    freeze_heap_at_exit()
    sys.exit(main())
