"""Values that cannot work are refused when the config loads (exit 2), naming the field and what is allowed.

Three layers: a table of `--set` overrides run through `load_run_config` and the real `packtrain` CLI; an
exhaustive walk of the schema that sets every numeric field to nan/inf/-inf/true/false and every text field to
'' and spaces (so a field added later is checked without editing this file); hypothesis properties that values
inside a field's declared bounds load unchanged and values outside are refused by name.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Annotated, Literal, Union, get_args, get_origin

import annotated_types as at
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic.fields import FieldInfo

from packtrain.cli import main as cli_main
from packtrain.config import RunConfig, load_run_config
from packtrain.config.messages import describe_allowed, field_table, iter_fields
from packtrain.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
PACKTRAIN = Path(sys.executable).parent / "packtrain"        # the console script of this venv

# (overrides, dotted field the error names, words the message must contain)
REJECTED: list[tuple[tuple[str, ...], str, str]] = [
    (("train.lr=inf",), "train.lr", "'inf' is not allowed: must be a finite number > 0"),
    (("train.lr=.nan",), "train.lr", "nan is not allowed: must be a finite number > 0"),
    (("train.lr=-.inf",), "train.lr", "-inf is not allowed"),
    (("train.lr=1e400",), "train.lr", "'1e400' is not allowed: must be a finite number"),
    (("train.lr=0",), "train.lr", "0 is not allowed: must be a finite number > 0"),
    (("train.lr=true",), "train.lr", "true is not allowed: must be a finite number > 0"),
    (("pack.budget=0",), "pack.budget", "0 is not allowed: must be an integer ≥ 2 — Tokens per pack"),
    (("pack.budget=-512",), "pack.budget", "-512 is not allowed: must be an integer ≥ 2"),
    (("pack.budget=true",), "pack.budget", "true is not allowed: must be an integer ≥ 2"),
    (("pack.budget=512.5",), "pack.budget", "512.5 is not allowed: must be an integer"),
    (("pack.budget=abc",), "pack.budget", "'abc' is not allowed: must be an integer"),
    (("train.budget=auto",), "train.budget", "removed: set train.rows instead — Packs per micro-batch"),
    (("train.budget=1024",), "train.budget", "removed: set train.rows instead"),
    (("plan.max_budget=4096",), "plan.max_budget", "removed: set plan.max_rows instead"),
    (("register.margin=0.01",), "register.margin", "removed: set register.promotion.delta instead"),
    (("train.rows=0",), "train.rows", "0 is not allowed: must be an integer ≥ 1 or 'auto'"),
    (("train.rows=false",), "train.rows", "false is not allowed: must be an integer ≥ 1 or 'auto'"),
    (("train.rows=automatic",), "train.rows", "'automatic' is not allowed"),
    (("train.grad_accum=true",), "train.grad_accum", "true is not allowed: must be an integer ≥ 1"),
    (("train.max_steps=0",), "train.max_steps", "must be an integer ≥ 1"),
    (("train.warmup_steps=-1",), "train.warmup_steps", "must be an integer ≥ 0"),
    (("train.min_lr_ratio=1.5",), "train.min_lr_ratio", "must be a finite number ≥ 0 and ≤ 1"),
    (("train.weight_decay=.inf",), "train.weight_decay", "must be a finite number ≥ 0"),
    (("train.betas=[0.9, 1.0]",), "train.betas.1", "1.0 is not allowed: must be a finite number ≥ 0 and < 1"),
    (("train.betas=[0.9]",), "train.betas", "must be a list of 2 values, each a finite number ≥ 0 and < 1"),
    (("train.grad_clip=-.inf",), "train.grad_clip", "must be a finite number ≥ 0"),
    (("train.seed=-1",), "train.seed", "must be an integer ≥ 0 and ≤ 4294967295"),
    (("train.threads=0",), "train.threads", "must be an integer ≥ 1 or null"),
    (("train.deepspeed.zero_stage=true",), "train.deepspeed.zero_stage", "true is not allowed: must be one of 0, 1, 2, 3"),
    (("train.checkpoint.keep_last=0",), "train.checkpoint.keep_last", "must be an integer ≥ 1"),
    (("model.num_layers=0",), "model.num_layers", "must be an integer ≥ 1"),
    (("model.rope_theta=.inf",), "model.rope_theta", "must be a finite number > 0"),
    (("model.init_std=-0.02",), "model.init_std", "must be a finite number > 0"),
    (("tokenize.eval_fraction=1",), "tokenize.eval_fraction", "must be a finite number ≥ 0 and < 1"),
    (("tokenize.vocab_size=true",), "tokenize.vocab_size", "must be an integer ≥ 260 and ≤ 1048576"),
    (("validate.max_duplicate_ratio=-0.1",), "validate.max_duplicate_ratio", "≥ 0 and ≤ 1"),
    (("ingest.default_corpus_mb=.nan",), "ingest.default_corpus_mb", "must be a finite number > 0"),
    (("ingest.max_docs=0",), "ingest.max_docs", "must be an integer ≥ 1 or null"),
    (("ingest.source=''",), "ingest.source", "must be a non-empty path (not only spaces) or null"),
    (("workdir=",), "workdir", "'' is not allowed: must be a non-empty path"),
    (("tracking.experiment='  '",), "tracking.experiment", "must be a non-empty string (not only spaces)"),
    (("tracking.flush_interval_s=-1",), "tracking.flush_interval_s", "must be a finite number ≥ 0"),
    (("tracking.buffer_dir=''",), "tracking.buffer_dir", "must be a non-empty path"),
    (("telemetry.min_utilization=false",), "telemetry.min_utilization", "false is not allowed"),
    (("plan.device_memory_gib=0",), "plan.device_memory_gib", "must be a finite number > 0 or null"),
    (("plan.target_fraction=0",), "plan.target_fraction", "must be a finite number > 0 and ≤ 1"),
    (("evaluate.prompts=['def ', '']",), "evaluate.prompts.1", "must be a non-empty string"),
    (("evaluate.sample_tokens=0",), "evaluate.sample_tokens", "must be an integer ≥ 1"),
    (("register.promotion.confidence=1",), "register.promotion.confidence", "must be a finite number > 0.5 and < 1"),
    (("register.model_name=-lm",), "register.model_name", "starts with a letter or digit"),
    (("pipeline.shm_size=0",), "pipeline.shm_size", "must be a Kubernetes quantity > 0"),
    (("pipeline.memory_request=lots",), "pipeline.memory_request", "must be a Kubernetes quantity"),
    (("pipeline.data_pvc=My_PVC",), "pipeline.data_pvc", "must be a Kubernetes object name"),
    (("pipeline.schedule=0 3 * * 1",), "pipeline.schedule", "did you mean '0 0 3 * * 1'"),
    (("pipeline.retries=-1",), "pipeline.retries", "must be an integer ≥ 0"),
    (("pipeline.run_timeout_s=10",), "pipeline.run_timeout_s", "must be an integer ≥ 60"),
    # cross-field rules: reported on the section, naming the recipe and the --set values inside it
    (("model.hidden_size=72", "model.num_heads=8"), "model", "(the head dimension) must be even"),
    (("model.hidden_size=65",), "model", "hidden_size (65) must be divisible by num_heads (4)"),
    (("validate.min_chars=10", "validate.max_chars=5"), "validate", "min_chars (10) must be ≤ max_chars (5)"),
    (("train.deepspeed.offload_params=true",), "train.deepspeed", "offload_params needs zero_stage 3"),
]


def _id(row) -> str:
    return " ".join(row[0])


def _is_leaf(field: str) -> bool:
    """A field (or an item of a list field, or a removed key a section names in moved_fields), not a section whose
    cross-field rule failed."""
    section, _, key = field.rpartition(".")
    sections = {(f.alias or n): f for n, f in RunConfig.model_fields.items()}   # YAML spelling: register, validate
    moved = getattr(sections.get(section) and sections[section].annotation, "moved_fields", {})
    return field in FIELDS or field.rsplit(".", 1)[0] in FIELDS or key in moved


@pytest.mark.parametrize("overrides,field,words", REJECTED, ids=[_id(r) for r in REJECTED])
def test_load_run_config_rejects_with_field_and_allowed(overrides, field, words):
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", list(overrides))
    msg = str(e.value)
    assert f"{field}: " in msg and words in msg, msg
    if _is_leaf(field):                                 # a field: the line names the --set that set it
        assert msg.startswith(f"--set {overrides[0]}: {field}: "), msg
    else:                                               # a section's rule: the recipe plus its --set values
        assert msg.startswith("recipe tiny-cpu.yaml + " + " + ".join(f"--set {o}" for o in overrides)), msg


@pytest.mark.parametrize("overrides,field,words", REJECTED, ids=[_id(r) for r in REJECTED])
def test_cli_exits_2_naming_the_field(overrides, field, words, capsys):
    argv = ["plan"] + [a for o in overrides for a in ("--set", o)]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{field}: " in err and words in err and "Traceback" not in err, err


def test_console_script_reports_every_bad_field_at_once():
    """The installed `packtrain` entry point, one process for all field rows: exit 2, one line per field."""
    seen: dict[str, tuple] = {}
    for row in REJECTED:
        if len(row[0]) == 1 and _is_leaf(row[1]):
            seen.setdefault(row[0][0].split("=")[0], row)       # one row per key (a later --set would win)
    argv = [str(PACKTRAIN), "plan"] + [a for (o,), _, _ in seen.values() for a in ("--set", o)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    for (o,), field, words in seen.values():
        assert f"--set {o}: {field}: " in p.stderr and words in p.stderr, (o, p.stderr)
    assert len(p.stderr.strip().splitlines()) == len(seen)


def test_console_script_cross_field_rule():
    p = subprocess.run([str(PACKTRAIN), "plan", "--set", "model.hidden_size=72", "--set", "model.num_heads=8"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 2
    assert p.stderr.strip() == ("error: recipe tiny-cpu.yaml + --set model.hidden_size=72 + --set model.num_heads=8: "
                                "model: hidden_size / num_heads = 9 (the head dimension) must be even for rotary "
                                "embeddings")


@pytest.mark.parametrize("override,key,value", [
    ("pack.budget=4096", "pack.budget", 4096),
    ("pack.budget='4096'", "pack.budget", 4096),        # a quoted number is still a number
    ("pack.budget=4096.0", "pack.budget", 4096),
    ("train.rows=auto", "train.rows", "auto"),
    ("train.rows=16", "train.rows", 16),
    ("train.lr=1e-4", "train.lr", 1e-4),                # YAML reads 1e-4 as a string: still a number
    ("train.lr=3.0e-4", "train.lr", 3e-4),
    ("train.warmup_steps=50", "train.warmup_steps", 50),    # ≥ max_steps is legal: lr never reaches its peak
    ("tokenize.eval_fraction=0", "tokenize.eval_fraction", 0.0),
    ("telemetry.warmup_steps=0", "telemetry.warmup_steps", 0),
    ("train.grad_clip=0", "train.grad_clip", 0.0),
    ("ingest.source=null", "ingest.source", None),
    ("ingest.source=corpus dir/a.txt", "ingest.source", "corpus dir/a.txt"),
    ("pipeline.cpu_request=4", "pipeline.cpu_request", "4"),  # YAML int → Kubernetes quantity text
    ("pipeline.memory_request=500Mi", "pipeline.memory_request", "500Mi"),
    ("pipeline.schedule=@weekly", "pipeline.schedule", "@weekly"),
    ("train.deepspeed.zero_stage=3", "train.deepspeed.zero_stage", 3),
    ("train.seed=4294967295", "train.seed", 4294967295),
])
def test_legal_values_still_load(override, key, value):
    cfg = load_run_config("tiny-cpu", [override]).to_dict()
    section, *rest = key.split(".")
    got = cfg[section]
    for k in rest:
        got = got[k]
    assert got == value and type(got) is type(value)


def test_origin_is_the_recipe_file_or_the_set(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("pack:\n  budget: 0\ntrain:\n  lr: .inf\n")
    with pytest.raises(ConfigError) as e:
        load_run_config(recipe, ["train.lr=0.01", "train.rows=0"])
    assert str(e.value).splitlines() == [
        "recipe bad.yaml: pack.budget: 0 is not allowed: must be an integer ≥ 2 — Tokens per pack (= one row of a "
        "micro-batch)",
        "--set train.rows=0: train.rows: 0 is not allowed: must be an integer ≥ 1 or 'auto' — Packs per micro-batch "
        "(rows of pack.budget tokens), or 'auto': the memory planner picks the most that fit",
    ]


def test_params_yaml_loads():
    assert load_run_config(REPO / "params.yaml").pack.budget >= 2


def test_docs_field_table_is_current():
    doc = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    assert field_table(RunConfig) in doc, ("docs/config.md's field table is stale: regenerate it with the command "
                                           "given above the table")


# ---- the schema walk: every field, present and future -------------------------------------------------------

def _members(f: FieldInfo) -> list[tuple[object, list]]:
    """Non-None members of a field's type as (type, constraints), field-level constraints included."""
    tp, meta = f.annotation, list(f.metadata)
    args = get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)
    out = []
    for a in args:
        if a is type(None):
            continue
        m = list(meta)
        while get_origin(a) is Annotated:
            a, *extra = get_args(a)
            for x in extra:
                m.extend(x.metadata if isinstance(x, FieldInfo) else [x])
        out.append((a, m))
    return out


def _is_number(tp) -> bool:
    return tp in (int, float) or (get_origin(tp) is Literal and all(
        isinstance(v, int) and not isinstance(v, bool) for v in get_args(tp)))


FIELDS = dict(iter_fields(RunConfig))
NUMERIC = sorted(p for p, f in FIELDS.items() if any(_is_number(t) for t, _ in _members(f)))
NUMERIC_TUPLES = sorted(p for p, f in FIELDS.items() if any(
    get_origin(t) is tuple and all(_is_number(_members(FieldInfo.from_annotation(a))[0][0]) for a in get_args(t))
    for t, _ in _members(f)))
TEXT = sorted(p for p, f in FIELDS.items() if any(t is str for t, _ in _members(f)))
BAD_NUMBERS = {".nan": "nan", ".inf": "inf", "-.inf": "-inf", "true": "true", "false": "false"}


def test_walk_finds_the_fields():
    assert {"train.lr", "pack.budget", "train.rows", "train.deepspeed.zero_stage", "plan.device_memory_gib"} <= set(NUMERIC)
    assert NUMERIC_TUPLES == ["train.betas"]
    assert {"workdir", "name", "ingest.source", "pipeline.schedule", "register.model_name"} <= set(TEXT)
    assert len(NUMERIC) >= 60 and len(TEXT) >= 20


@pytest.mark.parametrize("raw", BAD_NUMBERS)
@pytest.mark.parametrize("path", NUMERIC)
def test_every_numeric_field_rejects_nan_inf_and_booleans(path, raw):
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", [f"{path}={raw}"])
    f = FIELDS[path]
    assert str(e.value).startswith(f"--set {path}={raw}: {path}: {BAD_NUMBERS[raw]} is not allowed: must be "
                                   f"{describe_allowed(f.annotation, list(f.metadata))}"), str(e.value)


@pytest.mark.parametrize("raw", BAD_NUMBERS)
@pytest.mark.parametrize("path", NUMERIC_TUPLES)
def test_every_item_of_a_numeric_list_rejects_nan_inf_and_booleans(path, raw):
    default = list(FIELDS[path].default)
    for i in range(len(default)):
        items = [raw if j == i else json.dumps(v) for j, v in enumerate(default)]
        with pytest.raises(ConfigError) as e:
            load_run_config("tiny-cpu", [f"{path}=[{', '.join(items)}]"])
        assert f"{path}.{i}: {BAD_NUMBERS[raw]} is not allowed: must be a finite number" in str(e.value)


@pytest.mark.parametrize("value", ["", " ", "\t", "  \n "])
@pytest.mark.parametrize("path", TEXT)
def test_every_text_field_rejects_empty_and_blank(path, value):
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", [f"{path}={json.dumps(value)}"])
    assert f": {path}: {value!r} is not allowed: must be " in str(e.value), str(e.value)


def test_every_numeric_field_uses_a_shared_type():
    """A bare `int`/`float` would accept true/false (and a float nan/inf): the walk above would fail too, but this
    names the cause."""
    from pydantic import AllowInfNan

    from packtrain.config.base import NoBool

    for path in NUMERIC:
        for tp, meta in _members(FIELDS[path]):
            if _is_number(tp):
                assert NoBool in meta, f"{path}: use Int/Float/... from packtrain.config.base"
                if tp is float:
                    assert AllowInfNan(False) in meta, f"{path}: use Float/... from packtrain.config.base"


# ---- properties: inside the declared bounds loads unchanged, outside is refused by name ---------------------

_CROSS_FIELD = {"model.hidden_size", "model.num_heads", "model.num_kv_heads", "validate.min_chars",
                "validate.max_chars", "model.rope_scaling.original_max_position_embeddings",
                "model.rope_scaling.low_freq_factor", "model.rope_scaling.high_freq_factor",   # read per rope type
                "train.early_stopping.patience", "train.early_stopping.min_delta"}   # need train.eval_every_steps


def _bounds(path: str) -> tuple[type, dict]:
    tp, meta = next((t, m) for t, m in _members(FIELDS[path]) if t in (int, float))
    b: dict = {}
    for m in meta:
        for cls, key in ((at.Ge, "ge"), (at.Gt, "gt"), (at.Le, "le"), (at.Lt, "lt")):
            if isinstance(m, cls):
                b[key] = getattr(m, key)
    return tp, b


RANGED = [p for p in NUMERIC if p not in _CROSS_FIELD and any(t in (int, float) for t, _ in _members(FIELDS[p]))]


def _inside(tp, b) -> st.SearchStrategy:
    if tp is int:
        return st.integers(b.get("ge", b.get("gt", -(2**40) - 1) + 1), b.get("le", b.get("lt", 2**40 + 1) - 1))
    return st.floats(min_value=b.get("ge", b.get("gt", -1e12)), max_value=b.get("le", b.get("lt", 1e12)),
                     exclude_min="gt" in b, exclude_max="lt" in b, allow_nan=False, allow_infinity=False)


def _outside(tp, b) -> st.SearchStrategy | None:
    sides = []
    low, high = b.get("ge", b.get("gt")), b.get("le", b.get("lt"))
    if low is not None:
        top = low - (1 if tp is int and "ge" in b else 0)
        sides.append(st.integers(-(2**40), top) if tp is int else    # -0.0 is not below 0.0: filtered
                     st.floats(max_value=top, min_value=-1e12).filter(lambda x: x < low if "ge" in b else True))
    if high is not None:
        bottom = high + (1 if tp is int and "le" in b else 0)
        sides.append(st.integers(bottom, 2**40) if tp is int else
                     st.floats(min_value=bottom, max_value=1e12).filter(lambda x: x > high if "le" in b else True))
    return st.one_of(sides) if sides else None


BOUNDED = [p for p in RANGED if _outside(*_bounds(p)) is not None]


def _set(path: str, value) -> str:
    return f"{path}={value!r}"      # repr: 1e-05 (YAML: a string, parsed as a number by the schema), 5, -0.5


def _get(cfg, path: str):
    d = cfg.to_dict()
    for k in path.split("."):
        d = d[k]
    return d


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_values_inside_bounds_load_unchanged(data):
    path = data.draw(st.sampled_from(RANGED), label="field")
    tp, b = _bounds(path)
    value = data.draw(_inside(tp, b), label="value")
    assert _get(load_run_config("tiny-cpu", [_set(path, value)]), path) == value


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_values_outside_bounds_are_refused_by_name(data):
    path = data.draw(st.sampled_from(BOUNDED), label="field")
    tp, b = _bounds(path)
    value = data.draw(_outside(tp, b), label="value")
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", [_set(path, value)])
    f = FIELDS[path]
    assert str(e.value).startswith(f"--set {_set(path, value)}: {path}: ")
    assert f"must be {describe_allowed(f.annotation, list(f.metadata))}" in str(e.value)


@settings(max_examples=100, deadline=None)
@given(path=st.sampled_from(TEXT), value=st.text(alphabet=" \t\n\r\x0b\x0c", max_size=6))
def test_property_blank_text_is_refused(path, value):
    with pytest.raises(ConfigError) as e:
        load_run_config("tiny-cpu", [f"{path}={json.dumps(value)}"])
    assert f"{path}: " in str(e.value) and "is not allowed" in str(e.value)
