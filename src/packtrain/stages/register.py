"""Stage `register`: log the model to MLflow, register a version, move the champion or challenger alias.

    run_register(cfg, model_dir, eval_dir, train_dir, out_dir)
      reads   model_dir/ (save_pretrained + tokenizer), eval_dir/evaluate_result.json (required),
              eval_dir/suites.json + suite_scores.parquet (required: the paired evaluation the decision is made
              from, register.promotion; docs/validation.md),
              train_dir/train_result.json (optional: lineage tags MFU, peak memory, git sha, dataset md5)
      writes  out_dir/register_result.json   packtrain.stages.results.RegisterResult: version, decision, both
                                             numbers, tags, lineage (md5 of model + evaluate_result.json); returned
      MLflow  run "register": metrics candidate_value/champion_value/promoted, tags packtrain.decision/...,
              artifacts register_result.json, validation/, gate/; the logged model goes to the pipeline's train
              run (its output, source run; docs/tracking.md "The MLflow layout"), alone to this run; Model
              Registry version of that logged model + alias (champion by compare-and-set on the version it was
              gated against, else challenger)

Tracking store unreachable (before or during the registration): the stage still succeeds (exit 0). The
registration is one buffered op, like the metrics (packtrain.tracking.buffer), with a copy of the model in
the buffer; register_result.json says decision "deferred", version null, and names the op id and the
buffer. The op is applied — decision, version, aliases, and register_result.json rewritten in place if it
still names the op — when the store is back (the next tracked call of any stage) or by
`packtrain mlflow replay`, which lists what it registered.
"""

from __future__ import annotations

from pathlib import Path

from packtrain.config import RunConfig
from packtrain.errors import ConfigError, InputDataError
from packtrain.stages.lineage import make_lineage, upstream_lineage
from packtrain.stages.results import EvaluateResult, RegisterResult, TrainResult, from_library


def run_register(cfg: RunConfig, model_dir: str | Path, eval_dir: str | Path, train_dir: str | Path,
                 out_dir: str | Path) -> RegisterResult:
    from packtrain.data.tokenizer_files import tokenizer_hash
    from packtrain.evaluate.loading import check_model_dir
    from packtrain.registry.adapter import registry_model_dir
    from packtrain.registry.op import build_registration, deferred_result, promotion_verdict
    from packtrain.registry.outcome import RegisterOutcome
    from packtrain.tracking import stage_run
    from packtrain.versioning import data_md5, file_md5

    if not cfg.tracking.enabled:
        raise ConfigError("register needs the MLflow Model Registry: tracking.enabled is false "
                          "(set --set tracking.enabled=true)")
    model_dir, eval_dir, train_dir, out_dir = Path(model_dir), Path(eval_dir), Path(train_dir), Path(out_dir)
    check_model_dir(registry_model_dir(model_dir))   # a LoRA model/ registers its merged/ (adapter_registry)
    evaluation = EvaluateResult.from_dir(eval_dir)   # missing: MissingDataError; stale/odd keys: InputDataError
    ev = evaluation.to_dict()
    metric = ev.get(cfg.register_.metric)
    if isinstance(metric, bool) or not isinstance(metric, (int, float)):
        raise InputDataError(f"{eval_dir / EvaluateResult.FILE}: field {cfg.register_.metric!r} is missing or "
                             f"not a number (got {metric!r}); register.metric allows eval_loss, perplexity")
    lineage = make_lineage({"model": data_md5(model_dir), "evaluation": file_md5(eval_dir / EvaluateResult.FILE)},
                           evaluation.lineage, upstream_lineage(train_dir / TrainResult.FILE),
                           tokenizer_hash=tokenizer_hash(model_dir))
    verdict = promotion_verdict(eval_dir, cfg.register_)   # before any MLflow call: bad input registers nothing
    op = build_registration(model_dir, ev, train_dir / TrainResult.FILE, cfg.register_, verdict=verdict)
    op["result_path"] = str((out_dir / RegisterResult.FILE).resolve())
    op["version_tags"].update(_heldout_tags(eval_dir, (train_dir / TrainResult.FILE).is_file()))
    from packtrain.registry import install_handlers

    install_handlers()   # the op is applied through the tracking client's handler
    with stage_run("register", cfg, section=cfg.register_) as run:
        out = run.submit(op)   # live: the result; store unreachable: None (buffered with a model copy)
        if out is None:
            client = run.client
            assert client is not None   # tracking is enabled (checked above)
            lib = deferred_result(op, run.run_id, client.shown_uri, client.buffer_dir).to_dict()
        else:
            lib = RegisterOutcome(**out).to_dict()
        result = from_library(RegisterResult, lib, lineage, RegisterResult.FILE)
        result.write(out_dir)
    return result


def _heldout_tags(eval_dir: Path, trained: bool) -> dict[str, str]:
    """Version tags heldout.path/.md5/.n: the eval packs the evaluation scored as suite recent, so a later
    challenger is scored on this model's own domain (packtrain.evaluate.champion_domain); and, for a model trained
    by this config (`trained`: its train_result.json is there), packtrain.config_hash/.train_seed, so a later seed
    rerun of it is never promoted (packtrain.evaluate.recipe_identity)."""
    import json

    from packtrain.evaluate.champion_domain import heldout_tags
    from packtrain.evaluate.paired_scores import MANIFEST_FILE
    from packtrain.evaluate.recipe_identity import identity_tags

    manifest = json.loads((eval_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    return {**heldout_tags(manifest), **(identity_tags(manifest) if trained else {})}
