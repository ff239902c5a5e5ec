"""KFP component `evaluate`: held-out loss/perplexity of the trained model on the eval packs."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from packtrain.components.image import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def evaluate(
    config: str,
    model: Input[Model],
    packs: Input[Dataset],
    evaluation: Output[Artifact],
    metrics: Output[Metrics],
    code_version: str = "",
    kfp_run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
) -> str:
    """Calls packtrain.stages.evaluate.run_evaluate(cfg, model.path/model, packs.path, evaluation.path)."""
    from packtrain.pipeline.runtime import publish_stats, run_stage_component

    stats = run_stage_component("evaluate", config, {"model": model.path, "packs": packs.path},
                                evaluation.path, kfp_run_id=kfp_run_id, code_version=code_version)
    return publish_stats(stats, evaluation, metrics)
