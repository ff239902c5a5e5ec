"""Compile the KFP pipeline to IR YAML and submit it (one run or a recurring run) to a cluster.

The components and the pipeline are installed with the library (`packtrain.components`,
`packtrain.pipelines`: pyproject maps the repository's components/ and pipelines/ there), so an installed
wheel compiles and submits without a checkout.

    compile_pipeline("pipelines/packtrain_pipeline.yaml")       # the committed IR (default RunConfig)
    submit("http://ml-pipeline-ui.kubeflow:80", cfg=cfg)         # one run; returns {"run_id", "url"}
    submit(host, "0 0 3 * * 1", cfg=cfg)                         # recurring run, Mondays 03:00:00
"""

from __future__ import annotations

import json
from pathlib import Path

from packtrain.errors import ConfigError, PacktrainError

COMMITTED_IR = Path("pipelines") / "packtrain_pipeline.yaml"


def accelerators(cfg) -> int:
    """GPUs the train task requests: train.gpus (its ranks), none when train.device is cpu.

    >>> from packtrain.config import RunConfig
    >>> accelerators(RunConfig()), accelerators(RunConfig(train={"gpus": 8})), accelerators(RunConfig(train={"device": "cpu"}))
    (1, 8, 0)
    """
    return 0 if cfg.train.device == "cpu" else cfg.train.gpus


def load_pipeline(cfg=None, code_version: str | None = None):
    """The `@dsl.pipeline` for a RunConfig (its pipeline section + accelerators; the config itself and
    `code_version` as the parameters' defaults), or for a PipelineConfig alone (one train GPU: what a local kfp
    run ignores anyway, no config default); None → defaults."""
    from packtrain import __version__
    from packtrain.config import PipelineConfig
    from packtrain.pipelines.kfp_pipeline import build_pipeline

    if cfg is None or isinstance(cfg, PipelineConfig):
        return build_pipeline(cfg, code_version=code_version or __version__)
    return build_pipeline(cfg.pipeline, accelerators(cfg), config=config_json(cfg),
                          code_version=code_version or _code_version())


def config_json(cfg) -> str:
    """The RunConfig as the pipeline's `config` parameter: one JSON string, sorted keys."""
    return json.dumps(cfg.to_dict(), separators=(",", ":"), sort_keys=True)


def _code_version() -> str:
    from packtrain.versioning import code_version

    return code_version()


def compile_pipeline(out: str | Path, cfg=None, code_version: str | None = None) -> Path:
    """Compile the pipeline for the RunConfig `cfg` (None → defaults) to KFP IR YAML at `out` (temp + rename).

    The IR's tasks depend only on the component sources, the pipeline section and the train task's accelerators
    (train.gpus, train.device); the recipe itself is the default of the run-time parameter `config` (a run from
    the KFP UI needs no pasted JSON), `code_version` (None → this checkout's `0.1.0+g<sha>`) the default of
    `code_version`.
    """
    from kfp import compiler

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.tmp.yaml")  # kfp insists on a .yaml suffix
    compiler.Compiler().compile(load_pipeline(cfg, code_version), str(tmp))
    tmp.replace(out)
    return out


def pipeline_arguments(cfg, data_version: str = "") -> dict:
    """The run-time parameters of the pipeline for a RunConfig: one JSON config string + versions."""
    from packtrain.versioning import code_version

    return {"config": config_json(cfg), "data_version": data_version, "code_version": code_version()}


def submit(host: str, schedule: str | None = None, *, cfg=None, experiment: str | None = None,
           data_version: str = "", package: str | Path | None = None, namespace: str | None = None) -> dict:
    """Submit the compiled pipeline to the KFP API at `host` with the RunConfig `cfg` (None → tiny-cpu).

    Without `schedule`: one run; returns {"run_id", "url"}. With `schedule` (6-field cron, checked first):
    a recurring run; returns {"recurring_run_id", "cron"}. Raises PacktrainError when the cron is wrong or
    the host cannot be reached (message names the host).
    """
    import tempfile

    from packtrain.pipeline.cron import validate_cron

    cron = validate_cron(schedule) if schedule else None
    if cfg is None:
        from packtrain.config import load_run_config

        cfg = load_run_config("tiny-cpu")
    if not host:
        raise ConfigError("submit needs --host URL of the KFP API (or pipeline.kfp_host in the recipe)")
    experiment = experiment or cfg.tracking.experiment
    args = pipeline_arguments(cfg, data_version)
    with tempfile.TemporaryDirectory(prefix="packtrain-kfp-") as d:
        path = Path(package) if package else compile_pipeline(Path(d) / "packtrain_pipeline.yaml", cfg)
        try:
            import kfp

            client = kfp.Client(host=host, namespace=namespace or "kubeflow")
            if cron is None:
                res = client.create_run_from_pipeline_package(
                    str(path), arguments=args, run_name=f"packtrain-{cfg.name}", experiment_name=experiment)
                return {"run_id": res.run_id, "url": f"{host.rstrip('/')}/#/runs/details/{res.run_id}"}
            exp = client.create_experiment(experiment)
            rr = client.create_recurring_run(
                experiment_id=exp.experiment_id, job_name=f"packtrain-{cfg.name}-weekly", cron_expression=cron,
                pipeline_package_path=str(path), params=args, max_concurrency=1, no_catchup=True)
            return {"recurring_run_id": rr.recurring_run_id, "cron": cron}
        except PacktrainError:
            raise
        except Exception as e:  # kfp raises urllib3/ApiException/ValueError depending on the failure
            raise PacktrainError(f"could not submit to KFP at {host}: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0][:300] if str(e) else ''}") from None


def wait_for_run(host: str, run_id: str, timeout_s: int, namespace: str | None = None) -> str:
    """Block until the KFP run ends; returns its final state (SUCCEEDED, FAILED, ...)."""
    import kfp

    client = kfp.Client(host=host, namespace=namespace or "kubeflow")
    run = client.wait_for_run_completion(run_id, timeout=timeout_s)
    return str(getattr(run, "state", "UNKNOWN"))
