"""What a config value may be, in words, and pydantic errors turned into one line per field.

`describe_allowed(type)` reads the constraints off a field's type (`an integer ≥ 1`, `a finite number > 0`,
`one of 'bfd', 'ffd'`); `format_validation_error` uses it so that every rejected value is reported as
`<origin>: <dotted.path>: <value> is not allowed: must be <what is allowed> — <the field's doc>`.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator
from typing import Annotated, Any, Literal, Union, cast, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo


class Allowed:
    """Annotation marker: what an error message says is allowed, for types whose constraints do not say it
    (a regex says little to a user)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"Allowed({self.text!r})"


def describe_allowed(annotation: Any, metadata: list | tuple = ()) -> str | None:
    """What a value of this type may be, in words; None when the type is not one the configs use.

    >>> from packtrain.config.base import Float, PositiveInt
    >>> describe_allowed(PositiveInt)
    'an integer ≥ 1'
    >>> from pydantic import Field
    >>> describe_allowed(Annotated[Float, Field(ge=0, lt=1)] | None)
    'a finite number ≥ 0 and < 1, or null'
    """
    tp, meta = _unwrap(annotation, metadata)
    for m in reversed(meta):        # the outermost marker wins: Annotated[Text, Allowed("a path")]
        if isinstance(m, Allowed):
            return m.text
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        parts = [describe_allowed(a, () if a is type(None) else meta) for a in args]
        if any(p is None for p in parts):
            return None
        return _join_or(cast(list[str], parts))   # no None among them (checked above)
    if tp is type(None):
        return "null"
    if origin is Literal:
        values = [_show(v) for v in get_args(tp)]
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    if tp is bool:
        return "true or false"
    if tp is int:
        return _with_bounds("an integer", meta)
    if tp is float:
        finite = any(getattr(m, "allow_inf_nan", True) is False for m in meta)
        return _with_bounds("a finite number" if finite else "a number", meta)
    if tp is str:
        min_len = max([m.min_length for m in meta if isinstance(m, at.MinLen)], default=0)
        text = "a non-empty string" if min_len else "a string"
        pattern = next((m.pattern for m in meta if getattr(m, "pattern", None)), None)
        return f"{text} matching {pattern}" if pattern else text
    if origin is tuple and get_args(tp) and Ellipsis not in get_args(tp):
        items = [describe_allowed(a) for a in get_args(tp)]
        if None in items:
            return None
        if len(set(items)) == 1:
            return f"a list of {len(items)} values, each {items[0]}"
        return "a list [" + ", ".join(items) + "]"  # type: ignore[arg-type]
    if origin is list and get_args(tp):
        item = describe_allowed(get_args(tp)[0])
        return f"a list, each item {item}" if item else None
    return None


def _unwrap(annotation: Any, metadata: list | tuple) -> tuple[Any, list]:
    """Annotated[X, m1, Field(ge=1)] → (X, [m1, Ge(1)]), recursively; grouped constraints expanded."""
    meta: list = []
    tp = annotation
    while get_origin(tp) is Annotated:
        args = get_args(tp)
        tp, meta = args[0], [*args[1:], *meta]
    return tp, _expand([*metadata, *meta])


def _expand(meta: list) -> list:
    out: list = []
    for m in meta:
        if isinstance(m, FieldInfo):
            out.extend(_expand(list(m.metadata)))
        elif isinstance(m, at.GroupedMetadata):
            out.extend(_expand(list(m)))
        else:
            out.append(m)
    return out


def _with_bounds(text: str, meta: list) -> str:
    bounds = []
    for m in meta:
        for cls, attr, sym in ((at.Gt, "gt", ">"), (at.Ge, "ge", "≥"), (at.Lt, "lt", "<"), (at.Le, "le", "≤")):
            if isinstance(m, cls):
                bounds.append(f"{sym} {_show(getattr(m, attr))}")
    return f"{text} {' and '.join(bounds)}" if bounds else text


def _join_or(parts: list[str]) -> str:
    if len(parts) <= 2:
        return " or ".join(parts) if not any(" and " in p for p in parts) else ", or ".join(parts)
    return ", ".join(parts[:-1]) + " or " + parts[-1]


def _show(value: Any) -> str:
    """A value as the user writes it in YAML or --set: true/false/null, strings quoted, no 'np.float64'."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, int | float):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ---- validation errors → one line per field -------------------------------------------------------------------

def format_validation_error(err: ValidationError, model: type[BaseModel], origin: str,
                            overrides: list[str] | None = None) -> str:
    """Turn pydantic's error list into one line per offending field: where the value came from (the `--set`
    that set it, else `origin`), the dotted field path, the value and what is allowed::

        --set train.lr=inf: train.lr: 'inf' is not allowed: must be a finite number > 0
        recipe r.yaml: pack.budget: 0 is not allowed: must be an integer ≥ 2 — tokens per pack (...)
        recipe r.yaml + --set model.hidden_size=65: model: hidden_size (65) must be divisible by num_heads (4)
    """
    keys = [(text.split("=", 1)[0].strip(), text) for text in overrides or []]
    lines: list[str] = []
    seen: set[str] = set()
    for e in err.errors():
        loc = e["loc"]
        if e["type"] == "missing" and loc and isinstance(loc[-1], int):
            loc = loc[:-1]          # a tuple too short: report the field, not its missing item
        path, target, field = _resolve(model, loc)
        if e["type"] == "extra_forbidden":
            path = ".".join(str(p) for p in e["loc"])
            moved = _moved_to(model, e["loc"])
            if moved:
                lines.append(f"{_origin(path, keys, origin)}: {path}: removed: set {moved[0]} instead"
                             + (f" — {moved[1]}" if moved[1] else ""))
                continue
            known = _allowed_keys(model, e["loc"][:-1])
            lines.append(_unknown_key(path, known, keys, origin))
            continue
        if path in seen:            # a union reports one error per member: one line per field is enough
            continue
        seen.add(path)
        msg = _strip_prefix(e["msg"])
        if isinstance(target, type) and issubclass(target, BaseModel):      # a section (or the root) itself
            where = _origin(path, keys, origin, section=True)
            if e["type"] in ("model_type", "model_attributes_type", "dict_type"):
                lines.append(f"{where}: {path}: {_show(e.get('input'))} is not allowed: must be a mapping "
                             f"with keys {', '.join(_allowed_keys(model, e['loc']))}")
            else:                   # a cross-field rule of a model_validator: its message names the fields
                lines.append(f"{where}: {path}: {msg}" if path else f"{where}: {msg}")
            continue
        hint = ""
        if e["type"] not in ("value_error", "assertion_error"):     # custom validators say it themselves
            allowed = describe_allowed(*target) if target else None
            ctx = e.get("ctx") or {}
            if allowed:
                msg = f"must be {allowed}"
            elif "expected" in ctx:
                msg = f"must be one of {ctx['expected']}"
            hint = _hint(field)
        lines.append(f"{_origin(path, keys, origin)}: {path}: {_show(e.get('input'))} is not allowed: {msg}"
                     + (f" — {hint}" if hint else ""))
    return "\n".join(lines)


def _resolve(model: type[BaseModel], loc: tuple) -> tuple[str, Any, FieldInfo | None]:
    """Walk `loc` through the schema: (dotted path, target, FieldInfo). The target is a model class (the
    error is about a section) or (annotation, metadata) of the value; union-member tags in `loc` are dropped,
    list/tuple indices and dict keys kept."""
    parts: list[str] = []
    target: Any = model
    field: FieldInfo | None = None
    for p in loc:
        if isinstance(target, type) and issubclass(target, BaseModel):
            f = _field(target, p)
            if f is None:
                break
            parts.append(str(p))
            field, target = f, (f.annotation, list(f.metadata))
            target = _as_model(*target)
            continue
        tp, meta = _unwrap(*target)
        tp = _strip_none(tp)
        origin = get_origin(tp)
        if isinstance(p, int) and origin in (list, tuple):
            args = get_args(tp)
            item = args[0] if origin is list or Ellipsis in args else args[min(p, len(args) - 1)]
            parts.append(str(p))
            field, target = None, _as_model(item, [])
        elif origin is dict:
            parts.append(str(p))
            field, target = None, _as_model(get_args(tp)[1], [])
        else:                       # a union-member tag such as 'literal[...]' or 'function-after[...]'
            break
    return ".".join(parts), target, field


def _as_model(annotation: Any, metadata: list) -> Any:
    """A (possibly Optional) model class becomes the class itself; anything else stays (annotation, meta)."""
    tp, _ = _unwrap(annotation, [])
    tp = _strip_none(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    return (annotation, metadata)


def _strip_none(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0], [])[0]
    return tp


def _field(model: type[BaseModel], key: Any) -> FieldInfo | None:
    fields = model.model_fields
    if key in fields:
        return fields[key]
    return next((f for f in fields.values() if f.alias == key), None)


def _unknown_key(path: str, known: list[str], keys: list[tuple[str, str]], origin: str) -> str:
    """The line for an unknown key `path`: the `--set` that gave it (its key is `path` or under it: `--set
    trian.lr=1` gives the unknown section `trian`), else `origin`; the nearest allowed spelling, as the key the
    user meant to set, then what is allowed::

        --set trian.lr=1: trian: unknown key — did you mean train.lr? (allowed: evaluate, ingest, ...)
        recipe r.yaml: pack.budgett: unknown key — did you mean pack.budget? (allowed: budget, ...)
    """
    import difflib

    given = [(k, t) for k, t in keys if k == path or k.startswith(path + ".")]
    where = f"--set {given[-1][1]}" if given else _origin(path, keys, origin)
    head, _, last = path.rpartition(".")
    guess = difflib.get_close_matches(last, known, n=1, cutoff=0.6)
    meant = ""
    if guess:
        fixed = f"{head}.{guess[0]}" if head else guess[0]
        rest = given[-1][0][len(path):] if given else ""   # the part of the --set key below the unknown key
        meant = f" — did you mean {fixed}{rest}?"
    return f"{where}: {path}: unknown key{meant} (allowed: {', '.join(known)})"


def _origin(path: str, keys: list[tuple[str, str]], origin: str, section: bool = False) -> str:
    """The `--set` that set `path` (or a section above it); for a section-level error the recipe plus every
    `--set` inside that section."""
    if section:
        inside = [t for k, t in keys if not path or k == path or k.startswith(path + ".")]
        return origin + "".join(f" + --set {t}" for t in inside)
    above = [t for k, t in keys if path == k or path.startswith(k + ".")]
    return f"--set {above[-1]}" if above else origin


def _strip_prefix(msg: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg


def _hint(field: FieldInfo | None) -> str:
    """The first sentence of the field's docstring, if short: says what the number means."""
    if field is None or not field.description:
        return ""
    text = " ".join(field.description.split())
    first = re.split(r"(?<=[^.\s]{2})\. ", text, maxsplit=1)[0].rstrip(".")
    return first if len(first) <= 120 else ""


def _moved_to(model: type[BaseModel], loc: tuple) -> tuple[str, str] | None:
    """('train.gpus', <its doc's first sentence>) when the unknown key at `loc` is one its section lists in
    `moved_fields` (StrictModel), else None."""
    path, section, _ = _resolve(model, loc[:-1])
    if path != ".".join(str(p) for p in loc[:-1]) or not (isinstance(section, type) and
                                                           issubclass(section, BaseModel)):
        return None
    new = getattr(section, "moved_fields", {}).get(str(loc[-1]))
    if not new:
        return None
    new_path, _, field = _resolve(model, tuple(new.split(".")))
    hint = _hint(field) if new_path == new else ""
    return new, hint


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names (YAML spelling) of the sub-model at `loc`, for 'unknown key' messages."""
    path, target, _ = _resolve(model, loc)
    if path != ".".join(str(p) for p in loc) or not (isinstance(target, type) and issubclass(target, BaseModel)):
        return []
    return sorted(f.alias or name for name, f in target.model_fields.items())


# ---- the schema as a table (docs/config.md, tests that walk every field) ------------------------------------

def iter_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every leaf field as (dotted path in YAML spelling, FieldInfo); sections are walked into, not listed.

    >>> from packtrain.config import RunConfig
    >>> dict(iter_fields(RunConfig))["validate.min_rows"].default
    10
    """
    for name, f in model.model_fields.items():
        path = prefix + (f.alias or name)
        sub = _as_model(f.annotation, [])
        if isinstance(sub, type):
            yield from iter_fields(sub, path + ".")
        else:
            yield path, f


def field_table(model: type[BaseModel]) -> str:
    """A markdown table: key | default | allowed, one row per leaf field (the reference in docs/config.md)."""
    rows = ["| key | default | allowed |", "|---|---|---|"]
    for path, f in iter_fields(model):
        default = f.default if not isinstance(f.default, tuple) else list(f.default)
        allowed = describe_allowed(f.annotation, list(f.metadata)) or "see the field's docstring"
        rows.append(f"| `{path}` | `{_show(default)}` | {allowed.replace('|', '¦')} |")
    return "\n".join(rows)
