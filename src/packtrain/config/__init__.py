"""The root run config: one typed section per stage, loaded from `recipes/<name>.yaml` plus `--set` overrides.

Each stage receives only its own section (`cfg.pack`, `cfg.train`, ...), never the whole `RunConfig`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError

from packtrain.config.base import PathStr, StrictModel, Text, apply_overrides, flatten, read_yaml
from packtrain.config.data import IngestConfig, TokenizeConfig, ValidateConfig
from packtrain.config.evaluate import EvalConfig, RegisterConfig
from packtrain.config.messages import format_validation_error
from packtrain.config.model import ModelConfig, RopeScaling
from packtrain.config.packing import PackConfig
from packtrain.config.pipeline import PipelineConfig, PlanConfig
from packtrain.config.tracking import GuardActions, GuardConfig, TelemetryConfig, TrackingConfig
from packtrain.config.train import CheckpointConfig, DeepSpeedOptions, Fp8Options, FsdpOptions, TrainConfig
from packtrain.errors import ConfigError

__all__ = [
    "RunConfig", "load_run_config", "recipe_dir", "list_recipes", "IngestConfig", "ValidateConfig",
    "TokenizeConfig", "PackConfig", "ModelConfig", "TrainConfig", "CheckpointConfig", "DeepSpeedOptions",
    "TelemetryConfig", "GuardConfig", "GuardActions", "TrackingConfig", "EvalConfig", "RegisterConfig", "PipelineConfig", "PlanConfig",
    "Fp8Options", "FsdpOptions", "RopeScaling",
    "flatten",
]


class RunConfig(StrictModel):
    """A whole run. `workdir` holds every stage's outputs (see packtrain.paths)."""

    name: Text = "tiny-cpu"
    """Run family: MLflow run names and tags; defaults to the recipe file's name."""
    workdir: PathStr = "data"
    """Directory of every stage's outputs, the MLflow sqlite store and the buffer (relative to the cwd)."""
    ingest: IngestConfig = IngestConfig()
    validate_: ValidateConfig = Field(ValidateConfig(), alias="validate")
    tokenize: TokenizeConfig = TokenizeConfig()
    pack: PackConfig = PackConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    evaluate: EvalConfig = EvalConfig()
    register_: RegisterConfig = Field(RegisterConfig(), alias="register")
    telemetry: TelemetryConfig = TelemetryConfig()
    tracking: TrackingConfig = TrackingConfig()
    pipeline: PipelineConfig = PipelineConfig()
    plan: PlanConfig = PlanConfig()

    model_config = {**StrictModel.model_config, "populate_by_name": True, "protected_namespaces": ()}

    # `validate` and `register` shadow BaseModel attributes, so the fields are `validate_`/`register_`
    # in Python and `validate`/`register` in YAML, --set and to_dict().

    def to_dict(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)

    def to_yaml(self, path: Path) -> None:
        import yaml

        from packtrain.publish import atomic_write_text

        atomic_write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False))


def recipe_dir() -> Path:
    """The directory of package `packtrain.recipes`: `recipes/` of the checkout (editable install) or its copy
    inside the installed wheel (pyproject maps recipes/ to that package)."""
    import importlib.util

    spec = importlib.util.find_spec("packtrain.recipes")
    if spec is None or not spec.origin:
        # a source tree run without installing (PYTHONPATH=src, as on the GPU bench machine): recipes/ beside src/
        beside = Path(__file__).resolve().parents[3] / "recipes"
        if (beside / "__init__.py").is_file():
            return beside
        raise ConfigError("package packtrain.recipes is missing: reinstall packtrain (pip install packtrain or "
                          "pip install -e . in a checkout)")
    return Path(spec.origin).parent


def list_recipes() -> list[Path]:
    return sorted(recipe_dir().glob("*.yaml"))


def load_run_config(recipe: str | Path = "tiny-cpu", overrides: list[str] | None = None) -> RunConfig:
    """Load `recipes/<recipe>.yaml` (or a path), apply dotted overrides, validate, and run the whole-run checks
    (packtrain.config.preflight: each stage's attention backend against the init model's family).

    >>> load_run_config("tiny-cpu", ["pack.budget=512"]).pack.budget
    512
    """
    path = Path(recipe)
    if not (path.suffix in (".yaml", ".yml") or path.exists()):
        path = recipe_dir() / f"{recipe}.yaml"
        if not path.exists():
            names = ", ".join(p.stem for p in list_recipes())
            raise ConfigError(f"unknown recipe {recipe!r} (available: {names}, or a path to a .yaml file)")
    data = read_yaml(path)
    if overrides:
        data = apply_overrides(data, overrides)
    data.setdefault("name", path.stem)
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as e:
        # each line names the --set that set the value, or the recipe file
        raise ConfigError(format_validation_error(e, RunConfig, f"recipe {path.name}", overrides)) from None
    from packtrain.config.preflight import check_attention_settings

    check_attention_settings(cfg)   # attention backend × the init model's family, for every stage, before any
    return cfg
