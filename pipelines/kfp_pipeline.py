"""The packtrain KFP pipeline: call graph and Kubernetes settings only (the work is in the components).
Installed as `packtrain.pipelines.kfp_pipeline`; `packtrain pipeline compile` writes its IR.

The graph is the stage table's (packtrain.stages.table): one task per stage, each input artifact wired from the
task that outputs it under the same name, `after` as an explicit dependency:

    ingest ─documents─► validate ─┐ (after)
       └────documents──────────► tokenize ─tokens─► pack ─packs─► train ─model─► evaluate ─evaluation─► register
                                    └──tokens───────────────────────┘    packs ──┘        model ──────────┘

Parameters: `config` (the whole RunConfig as one JSON string; default: the compiled recipe's), `data_version`
(DVC md5 of the source: part of ingest's cache key) and `code_version` (packtrain version + git sha: part of
every stage's key; default: the compiling checkout's, `packtrain pipeline compile --code-version` to pin it).

Kubernetes settings, at compile time, from `PipelineConfig` and `train.gpus`/`train.device`:
- the table's GPU stages (train, evaluate) of a recipe that trains on a GPU: the GPU image,
  `set_accelerator_type(gpu_type)` with `set_accelerator_limit(train.gpus)` for train (one node; the train stage
  launches train.gpus ranks itself, packtrain.train.launch; multi-node is `packtrain pipeline pytorchjob`) and 1
  for evaluate; the GPU CPU/memory requests; /dev/shm as a memory emptyDir (`shm_size`; Docker's 64 MiB default
  breaks DataLoader workers and NCCL);
- the other stages, and every stage of a recipe with train.device cpu: the CPU image and CPU/memory requests;
- images by digest when the recipe gives it (`pipeline.base_image_digest`, `cpu_image_digest`), else by tag;
- retries (`retries`, 30 s backoff ×2) on the table's transient stages — ingest (remote sources), train
  (preemption, NCCL timeouts), evaluate, register (MLflow server) — not on validate/tokenize/pack, which
  are deterministic: a retry would fail the same way;
- every stage: MLFLOW_TRACKING_URI (required) and MLFLOW_TRACKING_USERNAME/_PASSWORD (optional) from the
  secret `mlflow_secret`, the KFP run id
  (`dsl.PIPELINE_JOB_ID_PLACEHOLDER` → KFP_RUN_ID → MLflow tag `kfp.run_id`); caching on except for the
  stages whose output depends on the registry as it is now (evaluate: the champion) or changes it (register:
  an alias) — StageSpec.cluster_cache.

Caching on a cluster: KFP reuses a task's outputs when its component spec (image, command, body) and its
inputs (parameters; upstream artifacts) are unchanged. Ingest's inputs are config + data_version +
code_version, so "data md5 + config + code version" is its key, and every later stage inherits it through
its input artifacts (a cached upstream yields the same artifacts). Locally `packtrain run` uses the stage
cache instead (packtrain.pipeline.cache).
"""

from typing import NamedTuple

from kfp import dsl, kubernetes

from packtrain import __version__
from packtrain.components import COMPONENTS
from packtrain.config import PipelineConfig
from packtrain.stages.table import ARTIFACTS, STAGE_NAMES, STAGES, StageSpec

MLFLOW_SECRET_KEYS = ("MLFLOW_TRACKING_URI",)
MLFLOW_OPTIONAL_KEYS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")

StageStats = NamedTuple("StageStats", [(name, str) for name in STAGE_NAMES])
"""The pipeline's outputs: each stage's stats as JSON (`packtrain run` prints the summary from them)."""


def _configure(task: dsl.PipelineTask, spec: StageSpec, pcfg: PipelineConfig, gpus: int) -> dsl.PipelineTask:
    """Image, resources, shared memory, retries, secret and caching of one stage's task. `gpus`: accelerators
    of the train task (0: none requested); the other GPU stages run one process and get one."""
    task.set_display_name(spec.name)
    task.set_caching_options(enable_caching=spec.cluster_cache)
    if spec.gpu and gpus > 0:
        task.set_container_image(pcfg.image(gpu=True))
        task.set_cpu_request(pcfg.gpu_cpu_request).set_memory_request(pcfg.gpu_memory_request)
        task.set_accelerator_type(pcfg.gpu_type).set_accelerator_limit(gpus if spec.name == "train" else 1)
        kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory",
                                   size_limit=pcfg.shm_size)
    else:   # a CPU stage, or a GPU stage of a recipe that trains on the CPU (train.device cpu): no GPU asked for
        task.set_container_image(pcfg.image(gpu=False))
        task.set_cpu_request(pcfg.cpu_request).set_memory_request(pcfg.memory_request)
    if spec.transient and pcfg.retries > 0:
        task.set_retry(num_retries=pcfg.retries, backoff_duration="30s", backoff_factor=2.0)
    kubernetes.use_secret_as_env(task, secret_name=pcfg.mlflow_secret,
                                 secret_key_to_env={k: k for k in MLFLOW_SECRET_KEYS})
    # credentials are optional keys of the same secret (a server without auth needs only the URI)
    kubernetes.use_secret_as_env(task, secret_name=pcfg.mlflow_secret,
                                 secret_key_to_env={k: k for k in MLFLOW_OPTIONAL_KEYS}, optional=True)
    return task


def build_pipeline(pcfg: PipelineConfig | None = None, gpus: int = 1, config: str = "",
                   code_version: str = __version__):
    """The `@dsl.pipeline` for one PipelineConfig and `gpus` accelerators for train (images, GPUs, requests,
    secret are compile-time; packtrain.pipeline.kfp_ops.accelerators(cfg) derives `gpus` from a RunConfig).
    `config` (the recipe's RunConfig as JSON) and `code_version` are the run-time parameters' defaults, so the
    compiled package runs from the KFP UI as it is (each can still be given per run)."""
    pcfg = pcfg or PipelineConfig()
    config_default, code_default = config, code_version

    @dsl.pipeline(name="packtrain", description="ingest → validate → tokenize → pack → train → evaluate → "
                  "register: packed LM training tracked in MLflow")
    def packtrain_pipeline(config: str = config_default, data_version: str = "",
                           code_version: str = code_default) -> StageStats:
        # the KFP run id as an explicit argument: the driver resolves it (→ KFP_RUN_ID → MLflow tag kfp.run_id)
        common = {"config": config, "code_version": code_version, "kfp_run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER}
        tasks: dict[str, dsl.PipelineTask] = {}
        for spec in STAGES:
            component = COMPONENTS[spec.name]
            artifacts = {a: tasks[ARTIFACTS[a]].outputs[a] for a in spec.inputs}
            extra = {"data_version": data_version} if "data_version" in component.component_spec.inputs else {}
            task = _configure(component(**artifacts, **common, **extra), spec, pcfg, gpus)
            for earlier in spec.after:   # tokenize after validate: a failed suite stops the run before training
                task.after(tasks[earlier])
            tasks[spec.name] = task
        return StageStats(**{name: tasks[name].outputs["Output"] for name in STAGE_NAMES})

    return packtrain_pipeline


packtrain_pipeline = build_pipeline()
"""The pipeline with the default PipelineConfig and one train GPU: what pipelines/packtrain_pipeline.yaml holds."""
