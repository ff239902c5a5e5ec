"""Stage `evaluate`: held-out loss/perplexity of the trained model on the eval packs, generation samples.

    run_evaluate(cfg, model_dir, packs_dir, out_dir)
      reads   model_dir/ (save_pretrained + tokenizer), packs_dir/eval/ (pack store), packs_dir/pack_result.json
      writes  out_dir/evaluate_result.json   packtrain.stages.results.EvaluateResult (EvalStats + lineage: md5
                                         of the model and the eval split), also returned
              out_dir/samples.json       [{"prompt", "completion", "n_new_tokens"}]
              out_dir/suite_scores.parquet  per-document NLL, tokens, UTF-8 bytes (and task accuracy) of the
                                         challenger and the champion on every suite (packtrain.evaluate.paired_scores)
              out_dir/suites.json        the suites scored (md5, n, role), both models, the settings
              <workdir>/compile-cache/<key>/  torch.compile's caches under evaluate.compile (packtrain.train.
                                         compile_cache): timings.compile_cache hit | miss | off
      MLflow  run "evaluate": metrics eval_loss, perplexity, eval_tokens_per_s, eval_peak_memory_gib, ...;
              suite.<name>.<model>.bits_per_byte / .acc (+ .acc_stderr); every file as an artifact; the eval
              packs as a dataset input (digest = lineage input_md5["packs"]); tag packtrain.eval.against

The champion is `register.model_name@champion` of the run's registry (evaluate.against); none yet → the
challenger is scored alone and suites.json says so. The register stage decides from these files
(docs/validation.md).

Both files are written into a staging directory next to out_dir, read back and published together
(packtrain.publish.staged_output): a failed or killed evaluation leaves the previous out_dir byte-identical.
"""

from __future__ import annotations

import sys
from pathlib import Path

from packtrain.config import RunConfig
from packtrain.errors import MissingDataError
from packtrain.publish import check_replaceable, staged_output, write_json
from packtrain.stages.lineage import Lineage, make_lineage
from packtrain.stages.results import EvaluateResult, PackResult, TrainResult, from_library

OUTPUTS = (EvaluateResult.FILE, "samples.json", "suite_scores.parquet", "suites.json")


def run_evaluate(cfg: RunConfig, model_dir: str | Path, packs_dir: str | Path, out_dir: str | Path
                 ) -> EvaluateResult:
    from packtrain.config.preflight import check_suite_packages
    from packtrain.evaluate.loading import check_model_dir
    from packtrain.evaluate.perplexity import evaluate
    from packtrain.packing.store import PackStore
    from packtrain.telemetry.memory import begin_stage_memory
    from packtrain.tracking import stage_run

    check_suite_packages(cfg.evaluate)   # a task suite lm-eval is missing for: now, not after the held-out loss
    from packtrain.evaluate.seed_spread import resolve_seed_spread

    resolve_seed_spread(cfg)   # a seed-spread record of another recipe: before any model is loaded
    begin_stage_memory()   # its peak memory on the CPU: this stage's own, whatever ran before it in the process
    model_dir, packs_dir, out_dir = Path(model_dir), Path(packs_dir), Path(out_dir)
    check_replaceable(out_dir, OUTPUTS, "evaluate")
    check_model_dir(model_dir)
    split = packs_dir / "eval"
    if not split.is_dir():
        raise MissingDataError(f"eval packs {split} do not exist: run `packtrain pack` first (it writes "
                               f"<packs>/eval) or pass --packs DIR")
    PackStore.open(split)   # a broken pack store fails here, before an MLflow run is opened
    from packtrain.evaluate.suites import load_suites

    load_suites(cfg.evaluate)   # and a bad suite (missing file, unknown format, malformed task YAML)
    import time

    t_lineage = time.perf_counter()
    lineage = evaluate_lineage(model_dir, packs_dir)
    lineage_s = time.perf_counter() - t_lineage
    from packtrain.train.compile_cache import device_type, workdir_compile_cache

    with stage_run("evaluate", cfg, section=cfg.evaluate) as run, \
            staged_output(out_dir, OUTPUTS, "evaluate") as tmp, \
            workdir_compile_cache(cfg.workdir, device_type(cfg.evaluate.device)) as compile_cache:
        from packtrain.evaluate.loading import load_for_eval

        t0 = time.perf_counter()
        loaded = load_for_eval(model_dir, cfg.evaluate)   # once, for the held-out loss and the suites
        load_s = time.perf_counter() - t0
        result = evaluate(model_dir, split, cfg.evaluate, loaded=loaded)
        result.timings["load_s"] = round(load_s, 3)
        result.timings["lineage_s"] = round(lineage_s, 3)
        t_suites = time.perf_counter()
        suite_timings: dict = {}
        manifest = score_against(cfg, model_dir, split, tmp, run, loaded, suite_timings)
        del loaded
        result.timings["suites_s"] = round(time.perf_counter() - t_suites, 3)
        result.timings.update({f"suites_{k}": v for k, v in suite_timings.items()})
        result.timings["total_s"] = round(time.perf_counter() - t0, 3)
        result.timings.update(compile_cache.timings())   # compile_cache: hit | miss | partial | off
        if result.timings["compile_cache"] != "off":
            print(compile_cache.line("evaluate"), file=sys.stderr, flush=True)
        typed = from_library(EvaluateResult, result.to_dict(), lineage, EvaluateResult.FILE)
        write_json(tmp / "samples.json", result.samples)
        typed.write(tmp)
        _check_written(tmp, typed, out_dir)
        run.log_metrics({
            "eval_loss": result.eval_loss, "perplexity": result.perplexity,
            "eval_tokens_per_s": result.tokens_per_s, "eval_seconds": result.seconds,
            "eval_label_tokens": result.n_label_tokens, "eval_real_tokens": result.n_real_tokens,
            "eval_batches": result.n_batches, "eval_complete": float(result.complete),
            **{f"eval_{k}": float(v) for k, v in result.timings.items() if not isinstance(v, str)},
            **({"eval_peak_memory_gib": result.peak_memory_gib} if result.peak_memory_gib is not None else {}),
        })
        run.set_tags({"packtrain.eval.memory_kind": result.memory_kind, "packtrain.eval.device": result.device})
        run.log_dataset(split, name="eval_packs", digest=lineage.input_md5.get("packs"), context="eval")
        run.log_artifact(tmp / EvaluateResult.FILE)
        run.log_artifact(tmp / "samples.json")
        for f in ("suite_scores.parquet", "suites.json"):
            run.log_artifact(tmp / f)
        run.set_tags({"packtrain.eval.against": (manifest.get("against") or {}).get("label") or "none"})
    return typed


def score_against(cfg: RunConfig, model_dir: Path, split: Path, out: Path, run, loaded=None,
                  timings: dict | None = None) -> dict:
    """Score the challenger and (evaluate.against) the champion on every suite into `out`; log the per-suite
    numbers. Returns suites.json; `timings` (given) gets the seconds of its parts (paired_evaluation)."""
    import math

    from packtrain.evaluate.paired_scores import SCORES_FILE, paired_evaluation

    manifest, _ = paired_evaluation(cfg, model_dir, "champion" if cfg.evaluate.against == "champion" else "none",
                                    out, recent_packs=split, loaded=loaded, timings=timings)
    print(f"[packtrain] evaluate: {manifest['note']}", file=sys.stderr, flush=True)
    if manifest.get("champion_domain"):
        print(f"[packtrain] evaluate: {manifest['champion_domain']['line']}", file=sys.stderr, flush=True)
    import pyarrow.parquet as pq

    t = pq.read_table(out / SCORES_FILE).to_pandas()
    numbers: dict[str, float] = {}
    for (suite, model, kind), g in t.groupby(["suite", "model", "kind"], sort=True):
        if kind == "text":
            numbers[f"suite.{suite}.{model}.bits_per_byte"] = float(g["nll"].sum() / (math.log(2) * g["bytes"].sum()))
        else:
            numbers[f"suite.{suite}.{model}.acc"] = float(g["acc"].mean())
    for m in manifest.get("task_metrics", []):
        if m.get("stderr") is not None:
            numbers[f"suite.{m['suite']}.{m['model']}.{m['metric']}_stderr"] = float(m["stderr"])
    run.log_metrics(numbers)
    return manifest


def evaluate_lineage(model_dir: Path, packs_dir: Path) -> Lineage:
    """md5 of the model directory and of the eval split; the chain of the model's train_result.json (next to
    a trained model: <train out>/model → <train out>/train_result.json), then of the packs' pack_result.json;
    the hash of the model's tokenizer."""
    from packtrain.data.tokenizer_files import tokenizer_hash
    from packtrain.stages.lineage import upstream_lineage
    from packtrain.versioning import data_md5

    return make_lineage({"model": data_md5(model_dir), "packs": data_md5(packs_dir / "eval")},
                        upstream_lineage(model_dir.parent / TrainResult.FILE),
                        upstream_lineage(packs_dir / PackResult.FILE), tokenizer_hash=tokenizer_hash(model_dir))


def _check_written(staged: Path, result: EvaluateResult, out_dir: Path) -> None:
    """evaluate_result.json must read back as what was measured (register reads it), else nothing is published."""
    import json

    from packtrain.errors import InputDataError, PacktrainError

    try:
        back = EvaluateResult.from_dir(staged)
    except InputDataError:
        back = None
    if back is None or back.n_label_tokens != result.n_label_tokens:
        raise PacktrainError(f"evaluate: the staged evaluate_result.json does not read back as written; nothing "
                             f"was published to {out_dir}")
    json.loads((staged / "samples.json").read_text(encoding="utf-8"))
