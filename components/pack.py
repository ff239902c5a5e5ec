"""KFP component `pack`: token store → fixed-budget packs for train and eval (Dataset)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from packtrain.components.image import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def pack(
    config: str,
    tokens: Input[Dataset],
    packs: Output[Dataset],
    metrics: Output[Metrics],
    code_version: str = "",
    kfp_run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
) -> str:
    """Calls packtrain.stages.pack.run_pack(cfg, tokens.path, packs.path)."""
    from packtrain.pipeline.runtime import publish_stats, run_stage_component

    stats = run_stage_component("pack", config, {"tokens": tokens.path}, packs.path,
                                kfp_run_id=kfp_run_id, code_version=code_version)
    return publish_stats(stats, packs, metrics)
