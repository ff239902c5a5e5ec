"""The packtrain KFP pipeline: call graph and Kubernetes settings only (the work is in the components).

    ingest ─► validate ─┐
       └──────────────► tokenize ─► pack ─► train ─► evaluate ─► register
                                       └──────────────┘   (packs also feed evaluate; train feeds register)

Parameters: `config` (the whole RunConfig as one JSON string), `data_version` (DVC md5 of the source:
part of ingest's cache key) and `code_version` (packtrain version + git sha: part of every stage's key).

Kubernetes settings from `PipelineConfig` (compile time):
- train, evaluate: `set_accelerator_type(gpu_type)` + `set_accelerator_limit(gpus)` (N GPUs on ONE node;
  multi-node is `packtrain pipeline pytorchjob`), CPU/memory requests, /dev/shm as a memory emptyDir
  (`shm_size`; Docker's 64 MiB default breaks DataLoader workers and NCCL);
- the CPU stages: CPU/memory requests, the CPU image;
- retries (`retries`, 30 s backoff ×2) on the transient stages — ingest (remote sources), train
  (preemption, NCCL timeouts), evaluate, register (MLflow server) — not on validate/tokenize/pack, which
  are deterministic: a retry would fail the same way;
- every stage: MLFLOW_TRACKING_URI (required) and MLFLOW_TRACKING_USERNAME/_PASSWORD (optional) from the
  secret `mlflow_secret`, the KFP run id
  (`dsl.PIPELINE_JOB_ID_PLACEHOLDER` → KFP_RUN_ID → MLflow tag `kfp.run_id`), caching on.

Caching on a cluster: KFP reuses a task's outputs when its component spec (image, command, body) and its
inputs (parameters; upstream artifacts) are unchanged. Ingest's inputs are config + data_version +
code_version, so "data md5 + config + code version" is its key, and every later stage inherits it through
its input artifacts (a cached upstream yields the same artifacts). Locally `packtrain run` uses the stage
cache instead (packtrain.pipeline.cache).
"""

from typing import NamedTuple

from kfp import dsl, kubernetes

from components import COMPONENTS
from packtrain import __version__
from packtrain.config import PipelineConfig

TRANSIENT = ("ingest", "train", "evaluate", "register")
GPU_STAGES = ("train", "evaluate")
MLFLOW_SECRET_KEYS = ("MLFLOW_TRACKING_URI",)
MLFLOW_OPTIONAL_KEYS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


class StageStats(NamedTuple):
    """The pipeline's outputs: each stage's stats as JSON (`packtrain run` prints the summary from them)."""

    ingest: str
    validate: str
    tokenize: str
    pack: str
    train: str
    evaluate: str
    register: str


def _configure(task: dsl.PipelineTask, stage: str, pcfg: PipelineConfig) -> dsl.PipelineTask:
    """Image, resources, shared memory, retries, secret and caching of one stage's task."""
    task.set_display_name(stage)
    task.set_caching_options(enable_caching=True)
    if stage in GPU_STAGES:
        task.set_container_image(pcfg.base_image)
        task.set_cpu_request(pcfg.gpu_cpu_request).set_memory_request(pcfg.gpu_memory_request)
        if pcfg.gpus > 0:
            task.set_accelerator_type(pcfg.gpu_type).set_accelerator_limit(pcfg.gpus)
        kubernetes.empty_dir_mount(task, volume_name="dshm", mount_path="/dev/shm", medium="Memory",
                                   size_limit=pcfg.shm_size)
    else:
        task.set_container_image(pcfg.cpu_image)
        task.set_cpu_request(pcfg.cpu_request).set_memory_request(pcfg.memory_request)
    if stage in TRANSIENT and pcfg.retries > 0:
        task.set_retry(num_retries=pcfg.retries, backoff_duration="30s", backoff_factor=2.0)
    kubernetes.use_secret_as_env(task, secret_name=pcfg.mlflow_secret,
                                 secret_key_to_env={k: k for k in MLFLOW_SECRET_KEYS})
    # credentials are optional keys of the same secret (a server without auth needs only the URI)
    kubernetes.use_secret_as_env(task, secret_name=pcfg.mlflow_secret,
                                 secret_key_to_env={k: k for k in MLFLOW_OPTIONAL_KEYS}, optional=True)
    return task


def build_pipeline(pcfg: PipelineConfig | None = None):
    """The `@dsl.pipeline` for one PipelineConfig (images, GPUs, requests, secret are compile-time)."""
    pcfg = pcfg or PipelineConfig()
    c = COMPONENTS

    @dsl.pipeline(name="packtrain", description="ingest → validate → tokenize → pack → train → evaluate → "
                  "register: packed LM training tracked in MLflow")
    def packtrain_pipeline(config: str, data_version: str = "", code_version: str = __version__) -> StageStats:
        # the KFP run id as an explicit argument: the driver resolves it (→ KFP_RUN_ID → MLflow tag kfp.run_id)
        common = {"config": config, "code_version": code_version, "kfp_run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER}
        ingest = _configure(c["ingest"](data_version=data_version, **common), "ingest", pcfg)
        validate = _configure(c["validate"](documents=ingest.outputs["documents"], **common), "validate", pcfg)
        tokenize = _configure(c["tokenize"](documents=ingest.outputs["documents"], **common), "tokenize", pcfg)
        tokenize.after(validate)  # a failing validation stops the run before any tokenizing or training
        pack = _configure(c["pack"](tokens=tokenize.outputs["tokens"], **common), "pack", pcfg)
        train = _configure(c["train"](packs=pack.outputs["packs"], tokens=tokenize.outputs["tokens"], **common),
                           "train", pcfg)
        evaluate = _configure(c["evaluate"](model=train.outputs["model"], packs=pack.outputs["packs"], **common),
                              "evaluate", pcfg)
        register = _configure(c["register"](model=train.outputs["model"],
                                            evaluation=evaluate.outputs["evaluation"], **common),
                              "register", pcfg)
        return StageStats(
            ingest=ingest.outputs["Output"], validate=validate.outputs["Output"],
            tokenize=tokenize.outputs["Output"], pack=pack.outputs["Output"], train=train.outputs["Output"],
            evaluate=evaluate.outputs["Output"], register=register.outputs["Output"],
        )

    return packtrain_pipeline


packtrain_pipeline = build_pipeline()
"""The pipeline with the default PipelineConfig: what pipelines/packtrain_pipeline.yaml holds."""
