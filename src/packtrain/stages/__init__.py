"""Stage runners: the one entry point per stage that every adapter calls.

The CLI (`packtrain <stage>`), the KFP components, `dvc.yaml` (through the CLI) and the Airflow DAG all call
these functions, so a stage behaves the same everywhere. A runner takes the whole `RunConfig` (for tracking
and telemetry), passes only its own section to the library function, opens the stage's MLflow run
(`packtrain.tracking.stage_run`, run name = stage name), writes its stats JSON and returns the stats dict.
Every input and output is a directory:

    run_ingest(cfg, out_dir)                                   → out_dir/documents.parquet, ingest_result.json
    run_validate(cfg, docs_dir, out_dir)                       → out_dir/report.json, data_docs/  (raises ValidationFailed;
                                                                 the failed report goes to <out>.failed/)
    run_tokenize(cfg, docs_dir, out_dir)                       → token store (packtrain.data.token_store) in out_dir
    run_pack(cfg, tokens_dir, out_dir)                         → out_dir/train/, out_dir/eval/, pack_result.json
    run_train(cfg, packs_dir, tokens_dir, out_dir, resume=False, overwrite=False) → out_dir/model/, train_result.json, checkpoints/
    run_evaluate(cfg, model_dir, packs_dir, out_dir)           → out_dir/evaluate_result.json, samples.json
    run_register(cfg, model_dir, eval_dir, train_dir, out_dir) → out_dir/register_result.json

Default directories come from `packtrain.paths.RunPaths(cfg.workdir)`: <workdir>/<stage>/.
Each runner lives in `packtrain.stages.<stage>`; importing this package imports none of them (`packtrain --help`
reads the stage table). Who calls them by stage name imports them: `packtrain.pipeline.runtime.RUNNERS`, and each
stage command (`packtrain.commands.<stage>`). The list of stages, their inputs and outputs is
`packtrain.stages.table.STAGES` (the stage table).
"""

from __future__ import annotations

from packtrain.stages.table import STAGE_NAMES, STAGES, StageSpec, stage_spec

__all__ = ["STAGES", "STAGE_NAMES", "StageSpec", "stage_spec"]
