"""Typed config plumbing: strict pydantic models, recipe loading, `--set dotted.key=value` overrides.

Every stage config derives from `StrictModel`: unknown keys are rejected and every value is validated at
load time. Errors name the dotted field path, the offending value and what is allowed, e.g.::

    recipe tiny-cpu: pack.budgett: unknown key (allowed: budget, strategy, window, ...)
    --set pack.budget=abc: pack.budget: 'abc' is not an integer
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from packtrain.errors import ConfigError


class StrictModel(BaseModel):
    """Base for every config: unknown keys are errors, assignments are validated, instances are frozen."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True)


def format_validation_error(err: ValidationError, model: type[BaseModel], origin: str) -> str:
    """Turn pydantic's error list into lines naming field path, value and what is allowed."""
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        value = e.get("input")
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, e["loc"][:-1])
            lines.append(f"{origin}: {path}: unknown key (allowed: {', '.join(allowed)})")
        else:
            msg = e["msg"]
            ctx = e.get("ctx") or {}
            if "expected" in ctx:
                msg = f"must be one of {ctx['expected']}"
            lines.append(f"{origin}: {path}: {value!r} is not allowed: {msg}")
    return "\n".join(lines)


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the sub-model at `loc`, for 'unknown key' messages."""
    cur: Any = model
    for part in loc:
        fields = getattr(cur, "model_fields", None)
        if not fields or part not in fields:
            return []
        ann = fields[part].annotation
        cur = ann
    fields = getattr(cur, "model_fields", None)
    return sorted(fields) if fields else []


def parse_override(text: str) -> tuple[list[str], Any]:
    """`'pack.budget=4096'` → (['pack', 'budget'], 4096). The value is parsed as YAML (so `true`, `1e-4`,
    `[1,2]` and `null` work); the config schema then checks its type."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected dotted.key=value, e.g. --set pack.budget=4096")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"--set {text!r}: empty key segment in {key!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `--set` overrides to a raw recipe dict (before validation), creating nested dicts."""
    out = _deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        cur = out
        for part in path[:-1]:
            nxt = cur.get(part)
            if nxt is None:
                nxt = cur[part] = {}
            elif not isinstance(nxt, dict):
                raise ConfigError(f"--set {text!r}: {part!r} is a value, not a section")
            cur = nxt
        cur[path[-1]] = value
    return out


def _deepcopy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d


def read_yaml(path: Path) -> dict:
    """Read a recipe file; a non-mapping or unparsable file is a ConfigError naming the file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"recipe file not found: {path}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"recipe {path}: not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'pack': {'budget': 2048}} → {'pack.budget': 2048}; used for MLflow params."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
