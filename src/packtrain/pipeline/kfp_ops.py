"""Compile the KFP pipeline to IR YAML and submit it (one run or a recurring run) to a cluster.

`components/` and `pipelines/` live at the repository root (they are adapters, not library code), so these
functions need a checkout: `repo_root()` finds it next to the package (editable install) or in the working
directory, and says so when neither has it.

    compile_pipeline("pipelines/packtrain_pipeline.yaml")       # the committed IR (default PipelineConfig)
    submit("http://ml-pipeline-ui.kubeflow:80", cfg=cfg)         # one run; returns {"run_id", "url"}
    submit(host, "0 0 3 * * 1", cfg=cfg)                         # recurring run, Mondays 03:00:00
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from packtrain.errors import ConfigError, PacktrainError

COMMITTED_IR = Path("pipelines") / "packtrain_pipeline.yaml"


def repo_root() -> Path:
    """The checkout holding components/ and pipelines/ (next to src/packtrain, else the cwd)."""
    here = Path(__file__).resolve()
    for cand in (here.parents[3], Path.cwd()):
        if (cand / "components" / "__init__.py").is_file() and (cand / "pipelines" / "kfp_pipeline.py").is_file():
            return cand
    raise PacktrainError("components/ and pipelines/ not found: run this from a packtrain checkout "
                         f"(looked in {here.parents[3]} and {Path.cwd()})", exit_code=2)


def load_pipeline(pcfg=None):
    """The `@dsl.pipeline` for `pcfg` (a PipelineConfig; None → defaults)."""
    root = str(repo_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    from pipelines.kfp_pipeline import build_pipeline

    return build_pipeline(pcfg)


def compile_pipeline(out: str | Path, pcfg=None) -> Path:
    """Compile the pipeline to KFP IR YAML at `out` (temp + rename); returns the path.

    The IR depends only on the PipelineConfig and the component sources, never on the recipe: the
    RunConfig is the run-time parameter `config`.
    """
    from kfp import compiler

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.tmp.yaml")  # kfp insists on a .yaml suffix
    compiler.Compiler().compile(load_pipeline(pcfg), str(tmp))
    tmp.replace(out)
    return out


def pipeline_arguments(cfg, data_version: str = "") -> dict:
    """The run-time parameters of the pipeline for a RunConfig: one JSON config string + versions."""
    from packtrain.pipeline.cache import code_version

    return {"config": json.dumps(cfg.to_dict(), separators=(",", ":"), sort_keys=True),
            "data_version": data_version, "code_version": code_version()}


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
        path = Path(package) if package else compile_pipeline(Path(d) / "packtrain_pipeline.yaml", cfg.pipeline)
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
