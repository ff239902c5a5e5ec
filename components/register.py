"""KFP component `register`: log + register the model in MLflow and move the champion alias."""

from kfp import dsl
from kfp.dsl import Artifact, Input, Metrics, Model, Output

from packtrain.components.image import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def register(
    config: str,
    model: Input[Model],
    evaluation: Input[Artifact],
    registration: Output[Artifact],
    metrics: Output[Metrics],
    code_version: str = "",
    kfp_run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
) -> str:
    """Calls packtrain.stages.register.run_register(cfg, model.path/model, evaluation.path, model.path,
    registration.path); the stats carry the registered version and alias."""
    from packtrain.pipeline.runtime import publish_stats, run_stage_component

    stats = run_stage_component("register", config, {"model": model.path, "evaluation": evaluation.path},
                                registration.path, kfp_run_id=kfp_run_id, code_version=code_version)
    return publish_stats(stats, registration, metrics)
