"""KFP component `tokenize`: documents → BPE tokenizer + memory-mappable token store (Dataset)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Output

from packtrain.components.image import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def tokenize(
    config: str,
    documents: Input[Dataset],
    tokens: Output[Dataset],
    metrics: Output[Metrics],
    code_version: str = "",
    kfp_run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
) -> str:
    """Calls packtrain.stages.tokenize.run_tokenize(cfg, documents.path, tokens.path)."""
    from packtrain.pipeline.runtime import publish_stats, run_stage_component

    stats = run_stage_component("tokenize", config, {"documents": documents.path}, tokens.path,
                                kfp_run_id=kfp_run_id, code_version=code_version)
    return publish_stats(stats, tokens, metrics)
