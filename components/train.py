"""KFP component `train`: packs (+ tokenizer) → trained model directory (Model), on N GPUs of one node."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from packtrain.components.image import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def train(
    config: str,
    packs: Input[Dataset],
    tokens: Input[Dataset],
    model: Output[Model],
    metrics: Output[Metrics],
    code_version: str = "",
    kfp_run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
) -> str:
    """Calls packtrain.stages.train.run_train(cfg, packs.path, tokens.path, model.path); the Model
    artifact is the train output dir (model/, train_result.json, checkpoints/)."""
    from packtrain.pipeline.runtime import publish_stats, run_stage_component

    stats = run_stage_component("train", config, {"packs": packs.path, "tokens": tokens.path}, model.path,
                                kfp_run_id=kfp_run_id, code_version=code_version)
    return publish_stats(stats, model, metrics)
