"""KFP component `validate`: the Great Expectations suite on the documents table; fails the run on failure."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Output

from packtrain.components.image import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def validate(
    config: str,
    documents: Input[Dataset],
    validation: Output[Artifact],
    metrics: Output[Metrics],
    code_version: str = "",
    kfp_run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
) -> str:
    """Calls packtrain.stages.validate.run_validate(cfg, documents.path, validation.path); the
    artifact is the validation report directory (report.json, the GX results)."""
    from packtrain.pipeline.runtime import publish_stats, run_stage_component

    stats = run_stage_component("validate", config, {"documents": documents.path}, validation.path,
                                kfp_run_id=kfp_run_id, code_version=code_version)
    return publish_stats(stats, validation, metrics)
