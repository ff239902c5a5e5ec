"""Checks of a whole RunConfig that no single section can make, run by `load_run_config` before any stage.

Attention backend × model family. Every stage that runs the model picks an attention backend for the family of
`model.init_from` (packtrain.model.families: Gemma2's soft-cap cannot run on sdpa or varlen):

    use                                          setting              training   auto picks (CPU / CUDA)
    train                                        train.attention      yes        sdpa, eager / varlen, flex, sdpa, eager
    step-0 loss of a warm start, evaluate        evaluate.attention   no         the same order
    register / export (load on the CPU)          none: always auto    no         sdpa, eager

`auto` takes the first backend in that order that runs on the device and that the family allows (eager always
does, so auto never fails: Gemma2 → eager on the CPU, flex on CUDA). An explicit backend the family refuses
is a ConfigError here, naming the setting, the value, the family and the allowed values (exit 2), before
ingest, validate, tokenize or pack has run. Whether a backend runs on the device (varlen needs CUDA) is
checked where the device is known: the train and evaluate stages.

The family is read from a local init directory's config.json (no transformers import); a scratch model is
Llama-style (every backend allowed); a registry source (models:/..., champion) is checked by the stages
once downloaded.

Packages a suite needs × this environment (`check_suite_packages`). An lm-eval task suite (evaluate.suites entry
whose path is a task .yaml) is scored by lm-evaluation-harness through its HF model class, which imports
accelerate; lm-eval is a dependency of packtrain, but an environment may still lack it (an install with --no-deps,
a trimmed image, the Airflow venv of older versions). Scoring the suite would then fail at the evaluate stage,
after training. The check runs where a run starts — `packtrain run` (both runners), the Airflow DAG's first task
in local mode, and the train and evaluate stages themselves (`dvc repro`, `packtrain train`, a KFP pod) — and
refuses with a ConfigError (exit 2) naming the suite, the package, this Python and the fix:

    evaluate.suites[0] ('wordorder', @recipes/tasks/wordorder/wordorder.yaml) is an lm-eval task, which needs
    package lm-eval (import lm_eval: No module named 'lm_eval'); this Python (/w/.venv-airflow/bin/python) lacks
    it. Install it there: pip install 'lm-eval<0.5,>=0.4.10' (in a checkout: `make setup` for .venv, `make
    setup-airflow` for .venv-airflow), or leave the suite out (--set evaluate.suites=[]).

It reads import specs and installed metadata only (~1 ms; nothing is imported).
"""

from __future__ import annotations

from typing import Protocol

from packtrain.config.evaluate import EvalConfig
from packtrain.config.model import ModelConfig
from packtrain.config.train import TrainConfig
from packtrain.errors import ConfigError


class RunSections(Protocol):
    """The sections of a RunConfig these checks read (a Protocol, so this module sits below the RunConfig that
    calls it: packtrain.config imports it, never the other way round)."""

    @property
    def model(self) -> ModelConfig: ...
    @property
    def train(self) -> TrainConfig: ...
    @property
    def evaluate(self) -> EvalConfig: ...


def attention_uses(cfg: RunSections) -> list[tuple[str, str, bool]]:
    """(setting, value, training) of every use of an attention backend in a run."""
    return [("train.attention", cfg.train.attention, True),
            ("evaluate.attention", cfg.evaluate.attention, False),
            ("register (export load)", "auto", False)]


def check_attention_settings(cfg: RunSections) -> dict[str, list[str]]:
    """{setting: the backends the init model's family allows for that use} ({} when the family is not known
    at load time: scratch, a registry source, no readable config.json); ConfigError for an explicit backend
    the family refuses.

    Gemma2 init directory → {"train.attention": ["eager", "flex"], "evaluate.attention": ["eager", "flex"],
    "register (export load)": ["eager", "flex"]}; `train.attention=sdpa` → ConfigError "model.init_from
    <dir>: family Gemma2 (gemma2) with train.attention=sdpa is refused: ... (allowed for Gemma2: auto, eager,
    flex)".
    """
    from packtrain.model.families import allowed_backends, check_attention
    from packtrain.model.init_from import init_checkpoint_config, init_from_value

    family_cfg = init_checkpoint_config(cfg.model)
    if family_cfg is None:
        return {}   # unknown architectures are refused by the loader, naming the directory
    where = f"model.init_from {init_from_value(cfg.model)}"
    out = {}
    for key, value, training in attention_uses(cfg):
        try:
            allowed = allowed_backends(family_cfg, training)
        except (TypeError, ValueError, KeyError):
            return {}   # a config.json without the family's fields: the loader refuses it, naming the directory
        if value != "auto":
            check_attention(family_cfg, value, training, where=where, key=key)
        out[key] = allowed
    return out


TASK_SUFFIXES = (".yaml", ".yml")
"""A suite path with this suffix is an lm-eval task YAML: packtrain.evaluate.suites.TASK_SUFFIXES, repeated here
because the evaluate room imports config, never the other way round (tests/unit/test_suite_preflight.py checks
that the two agree)."""

TASK_SUITE_MODULES: tuple[tuple[str, str], ...] = (("lm_eval", "lm-eval"), ("accelerate", "accelerate"))
"""(module, distribution) an lm-eval task suite imports (packtrain.evaluate.tasks.score_task): lm-eval itself and
accelerate, which its HF model class (lm_eval.models.huggingface) imports; lm-eval's own Requires-Dist are checked
from its metadata."""


def _missing_module(module: str) -> str | None:
    """Why `import module` would fail ("No module named 'lm_eval'"), None when it is importable. A finder that
    raises ImportError (a blocker on sys.meta_path) counts as missing."""
    import importlib.util

    try:
        return None if importlib.util.find_spec(module) is not None else f"No module named {module!r}"
    except (ImportError, ValueError) as e:
        return str(e) or f"No module named {module!r}"


def _missing_requirements(dist: str) -> list[str]:
    """The Requires-Dist of installed distribution `dist` (no extras) that are not installed ([] when `dist` is
    not installed itself: its import check speaks for it)."""
    import importlib.metadata as md

    from packaging.requirements import InvalidRequirement, Requirement

    try:
        requires = md.requires(dist) or []
    except md.PackageNotFoundError:
        return []
    out = []
    for raw in requires:
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            md.distribution(req.name)
        except md.PackageNotFoundError:
            out.append(req.name)
    return out


def _pin_of(dist: str) -> str:
    """`dist` with packtrain's own version range (`lm-eval<0.5,>=0.4.10`), or the bare name."""
    import importlib.metadata as md

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    try:
        for raw in md.requires("packtrain") or []:
            req = Requirement(raw)
            if canonicalize_name(req.name) == canonicalize_name(dist) and req.marker is None:
                return f"{dist}{req.specifier}"
    except md.PackageNotFoundError:   # a source tree on PYTHONPATH, not installed
        pass
    return dist


def missing_suite_packages(evaluate: EvalConfig) -> list[tuple[int, str, str, str]]:
    """(suite index, distribution, why, pip spec) for each package a configured suite needs that this environment lacks,
    in suite order; [] when every suite can be scored here. Text suites need nothing beyond packtrain's core."""
    task = next((i for i, sc in enumerate(evaluate.suites) if str(sc.path).lower().endswith(TASK_SUFFIXES)), None)
    if task is None:
        return []
    out = [(dist, f"import {module}: {why}") for module, dist in TASK_SUITE_MODULES
           if (why := _missing_module(module)) is not None]
    if not out:   # importable, but an install with --no-deps may have left lm-eval's own dependencies out
        out = [(name, "lm-eval requires it") for name in _missing_requirements("lm-eval")]
    return [(task, dist, why, _pin_of(dist)) for dist, why in out]   # the first task suite speaks for all


def check_suite_packages(evaluate: EvalConfig) -> None:
    """ConfigError (exit 2) when a configured suite needs a package this environment lacks (module doc), naming the
    suite, each missing package, this Python and how to install them; nothing when every suite can be scored."""
    missing = missing_suite_packages(evaluate)
    if not missing:
        return
    import shlex
    import sys

    i = missing[0][0]
    sc = evaluate.suites[i]
    names = ", ".join(dict.fromkeys(dist for _, dist, _, _ in missing))
    whys = "; ".join(why for _, _, why, _ in missing)
    pins = " ".join(shlex.quote(pin) for pin in dict.fromkeys(pin for _, _, _, pin in missing))
    plural = "s" if len({d for _, d, _, _ in missing}) > 1 else ""
    raise ConfigError(
        f"evaluate.suites[{i}] ({sc.name!r}, {sc.path}) is an lm-eval task, which needs package{plural} {names} "
        f"({whys}); this Python ({sys.executable}) lacks {'them' if plural else 'it'}. Install {'them' if plural else 'it'} "
        f"there: pip install {pins} (in a checkout: `make setup` for .venv, `make setup-airflow` for .venv-airflow), "
        f"or leave the suite out (--set evaluate.suites=[]).")
