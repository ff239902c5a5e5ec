"""KFP component `ingest`: source (or the default corpus) → documents table (Dataset)."""

from kfp import dsl
from kfp.dsl import Dataset, Metrics, Output

from packtrain.components.image import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def ingest(
    config: str,
    documents: Output[Dataset],
    metrics: Output[Metrics],
    data_version: str = "",
    code_version: str = "",
    kfp_run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
) -> str:
    """Calls packtrain.stages.ingest.run_ingest(cfg, documents.path); `data_version` (DVC md5 of the
    source) and `code_version` only enter KFP's cache key and the stats."""
    from packtrain.pipeline.runtime import publish_stats, run_stage_component

    stats = run_stage_component("ingest", config, {}, documents.path, kfp_run_id=kfp_run_id,
                                code_version=code_version, data_version=data_version)
    return publish_stats(stats, documents, metrics)
