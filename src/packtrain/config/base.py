"""Typed config plumbing: strict pydantic models, shared value types, recipe loading, `--set` overrides.

Every stage config derives from `StrictModel`: unknown keys are rejected and every value is validated at
load time. Values that cannot work are refused there, not at the stage that would trip over them: numbers are
finite, sizes and counts are positive, `true`/`false` is never read as 1/0, paths and names are not empty.
Errors name where the value came from, the dotted field path, the value and what is allowed, e.g.::

    recipe tiny-cpu.yaml: pack.budgett: unknown key — did you mean pack.budget? (allowed: budget, ...)
    --set pack.budget=abc: pack.budget: 'abc' is not allowed: must be an integer ≥ 2 — tokens per pack (...)
    --set train.lr=inf: train.lr: 'inf' is not allowed: must be a finite number > 0
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar

import yaml
from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
)
from pydantic_core import PydanticCustomError

from packtrain.config.messages import Allowed
from packtrain.errors import ConfigError

__all__ = [
    "StrictModel", "NoBool", "Int", "Float",
    "PositiveInt", "NonNegativeInt", "PositiveFloat", "NonNegativeFloat", "Fraction", "Seed", "Text", "PathStr",
    "Word", "K8sName", "K8sQuantity", "parse_override", "apply_overrides", "read_yaml", "flatten",
]


class StrictModel(BaseModel):
    """Base for every config: unknown keys are errors, assignments are validated, instances are frozen.
    Field docstrings become field descriptions (quoted in error messages)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True, use_attribute_docstrings=True)

    moved_fields: ClassVar[dict[str, str]] = {}
    """Keys this section no longer has → the dotted field that replaced them: a recipe or `--set` still
    using one fails at load time naming the replacement (format_validation_error), e.g.
    `pipeline.gpus: removed: set train.gpus instead — data-parallel processes on one node, one per GPU`."""


# ---- shared value types: every config field uses one of these (or Literal / bool) ----------------------------

def _reject_bool(value: Any) -> Any:
    # pydantic's lax mode reads True as 1 and False as 0.0: `--set pack.budget=true` must not mean 1 token.
    if isinstance(value, bool):
        raise PydanticCustomError("bool_not_number", "true/false is not a number")
    return value


def _reject_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank_string", "only whitespace")
    return value


def _quantity_text(value: Any) -> Any:
    # `--set pipeline.cpu_request=4` arrives as the YAML int 4; a Kubernetes quantity is its text.
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _positive_quantity(value: str) -> str:
    if float(re.sub(r"[a-zA-Z]+$", "", value)) <= 0:
        raise PydanticCustomError("zero_quantity", "must be > 0")
    return value


NoBool = BeforeValidator(_reject_bool)

Int = Annotated[int, NoBool]
"""An integer; `true`/`false` rejected; "4096" and 4096.0 accepted (YAML and --set values)."""
Float = Annotated[float, NoBool, AllowInfNan(False)]
"""A finite number; nan/inf/-inf and `true`/`false` rejected; "1e-4" accepted (YAML reads it as a string)."""
PositiveInt = Annotated[Int, Field(ge=1)]
NonNegativeInt = Annotated[Int, Field(ge=0)]
PositiveFloat = Annotated[Float, Field(gt=0)]
NonNegativeFloat = Annotated[Float, Field(ge=0)]
Fraction = Annotated[Float, Field(ge=0, le=1)]
"""0 ≤ x ≤ 1."""
Seed = Annotated[Int, Field(ge=0, le=2**32 - 1)]
"""numpy's seed range (np.random.seed rejects negatives and ≥ 2³²)."""
Text = Annotated[str, StringConstraints(min_length=1), AfterValidator(_reject_blank),
                 Allowed("a non-empty string (not only spaces)")]
"""A non-empty string that is not only whitespace."""
PathStr = Annotated[str, StringConstraints(min_length=1), AfterValidator(_reject_blank),
                    Allowed("a non-empty path (not only spaces)")]
Word = Annotated[str, StringConstraints(pattern=r"^\S+$"), Allowed("a non-empty string without spaces")]
"""Image references, resource names, URLs."""
K8sName = Annotated[str, StringConstraints(max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),
                    Allowed("a Kubernetes object name (lowercase letters, digits, '-', '.'; "
                            "starts and ends with a letter or digit)")]
K8sQuantity = Annotated[str, BeforeValidator(_quantity_text),
                        StringConstraints(pattern=r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"),
                        AfterValidator(_positive_quantity), Allowed("a Kubernetes quantity > 0 such as 2, 500m or 16Gi")]


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


def check_unique_keys(node: yaml.Node | None, path: str = "") -> None:
    """Refuse a mapping that gives one key twice, anywhere in a composed YAML document (PyYAML keeps the last
    one silently: a recipe with `lr: 1e-3` and, further down, `lr: 1e-2` trains at 1e-2 while its reader sees
    1e-3). ConfigError: `key 'train.lr' is given twice (line 3 and line 5) ...`."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
            if key is None or key == "<<":   # complex keys and merge keys: YAML's own rules
                continue
            line, dotted = key_node.start_mark.line + 1, f"{path}{key}"
            if key in seen:
                raise ConfigError(f"key {dotted!r} is given twice (line {seen[key]} and line {line}): YAML keeps "
                                  "only the last one silently; keep one of them")
            seen[key] = line
            check_unique_keys(value_node, f"{dotted}.")
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            check_unique_keys(item, f"{path.rstrip('.')}[{i}].")


def read_yaml(path: Path) -> dict:
    """Read a recipe file; a non-mapping, empty or unparsable file, or one giving a key twice, is a ConfigError
    naming the file (and the key and its lines):

        recipe r.yaml: key 'train.lr' is given twice (line 3 and line 5): YAML keeps only the last one ...
        recipe empty.yaml is empty (0 bytes): a recipe is a mapping of sections (...)
    """
    try:
        text = path.read_text(encoding="utf-8")
        check_unique_keys(yaml.compose(text, Loader=yaml.SafeLoader))
        data = yaml.safe_load(text)
    except FileNotFoundError:
        raise ConfigError(f"recipe file not found: {path}") from None
    except ConfigError as e:
        raise ConfigError(f"recipe {path}: {e}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"recipe {path}: not valid YAML: {e}") from None
    if data is None:
        what = "0 bytes" if not text else "only comments or blank lines"
        raise ConfigError(f"recipe {path} is empty ({what}): a recipe is a mapping of sections (pack:, train:, ...); "
                          "an empty one would silently run on built-in defaults — start from a shipped recipe "
                          "(recipes/tiny-cpu.yaml) or pass --recipe tiny-cpu")
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
