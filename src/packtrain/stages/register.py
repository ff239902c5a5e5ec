"""Stage `register`: log the model to MLflow, register a version, move the champion or challenger alias.

    run_register(cfg, model_dir, eval_dir, train_dir, out_dir)
      reads   model_dir/ (save_pretrained + tokenizer), eval_dir/eval_result.json (required),
              train_dir/train_result.json (optional: lineage tags MFU, peak memory, git sha, dataset md5)
      writes  out_dir/register_result.json   RegisterResult: version, decision, both numbers, tags
      MLflow  run "register": the logged model, metrics candidate_<metric>/champion_<metric>/promoted,
              tags packtrain.decision/...; Model Registry version + alias (champion | challenger)
"""

from __future__ import annotations

from pathlib import Path

from packtrain.config import RunConfig
from packtrain.errors import ConfigError, InputDataError, MissingDataError, PacktrainError
from packtrain.paths import write_json


def run_register(cfg: RunConfig, model_dir: str | Path, eval_dir: str | Path, train_dir: str | Path,
                 out_dir: str | Path) -> dict:
    from packtrain.evaluate.lineage import read_optional_json
    from packtrain.evaluate.loading import check_model_dir
    from packtrain.evaluate.register import register_model
    from packtrain.tracking import resolve_tracking_uri, stage_run

    if not cfg.tracking.enabled:
        raise ConfigError("register needs the MLflow Model Registry: tracking.enabled is false "
                          "(set --set tracking.enabled=true)")
    model_dir, eval_dir, train_dir, out_dir = Path(model_dir), Path(eval_dir), Path(train_dir), Path(out_dir)
    check_model_dir(model_dir)
    ev = read_optional_json(eval_dir / "eval_result.json")
    if ev is None:
        raise MissingDataError(f"{eval_dir / 'eval_result.json'} does not exist: run `packtrain evaluate` "
                               f"first or pass --eval DIR")
    metric = ev.get(cfg.register_.metric)
    if isinstance(metric, bool) or not isinstance(metric, (int, float)):
        raise InputDataError(f"{eval_dir / 'eval_result.json'}: field {cfg.register_.metric!r} is missing or "
                             f"not a number (got {metric!r}); register.metric allows eval_loss, perplexity")
    with stage_run("register", cfg, section=cfg.register_) as run:
        import mlflow

        active = mlflow.active_run()
        if active is None or active.info.run_id != run.run_id:   # the store is down: metrics are buffered,
            raise PacktrainError(                                 # but a registry write cannot be
                f"register needs a reachable MLflow tracking/registry store ({resolve_tracking_uri(cfg)}); "
                f"retry when it is up (`packtrain mlflow replay` sends the buffered metrics of other stages)")
        result = register_model(model_dir, ev, train_dir / "train_result.json", cfg.register_, tracker=run)
        stats = result.to_dict()
        write_json(out_dir / "register_result.json", stats)
        run.log_artifact(out_dir / "register_result.json")
    return stats
