"""The stage table (packtrain.stages.table) is the one list of stages, and the stage cache key follows it:
changing any recipe field changes the keys of exactly the stages whose entry declares that field's section."""

from __future__ import annotations

import copy
import json
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from packtrain.config import RunConfig, flatten, load_run_config
from packtrain.errors import PacktrainError
from packtrain.pipeline.cache import stage_cache_key
from packtrain.pipeline.runtime import config_parts
from packtrain.stages.table import ARTIFACTS, STAGE_NAMES, STAGES, stage_spec, upstream

BASE = load_run_config("tiny-cpu")
BASE_DICT = BASE.to_dict()
LEAVES = sorted(flatten(BASE_DICT))


# ---- the table itself ----------------------------------------------------------------------------------------

def test_table_is_the_dag_in_order():
    assert STAGE_NAMES == ("ingest", "validate", "tokenize", "pack", "train", "evaluate", "register")
    assert ARTIFACTS == {"documents": "ingest", "validation": "validate", "tokens": "tokenize", "packs": "pack",
                         "model": "train", "evaluation": "evaluate", "registration": "register"}
    assert upstream("tokenize") == ("ingest", "validate")
    assert upstream("register") == ("train", "evaluate")
    assert [s.name for s in STAGES if s.gpu] == ["train", "evaluate"]
    assert [s.name for s in STAGES if s.transient] == ["ingest", "train", "evaluate", "register"]
    with pytest.raises(KeyError, match="unknown stage 'dedup' .stages: ingest, validate"):
        stage_spec("dedup")


def test_every_declared_section_and_code_path_exists():
    repo = Path(__file__).resolve().parents[2]
    for spec in STAGES:
        for path in spec.config + spec.init_config:
            node = BASE_DICT
            for part in path.split("."):
                assert part in node, f"stage {spec.name}: config {path!r} is not a RunConfig field"
                node = node[part]
        for code in spec.code:
            assert (repo / code).exists(), f"stage {spec.name}: code path {code} does not exist"
        assert (repo / "src/packtrain/stages" / f"{spec.name}.py").is_file()


def test_runners_are_the_table_entries():
    from packtrain.pipeline.runtime import RUNNERS

    assert list(RUNNERS) == list(STAGE_NAMES)
    for spec in STAGES:
        runner = RUNNERS[spec.name]
        assert (runner.__name__, runner.__module__) == (f"run_{spec.name}", f"packtrain.stages.{spec.name}")



def test_every_stage_record_is_named_stage_result_json():
    """One name pattern for every stage record: the table, the result class and the reader agree."""
    from packtrain.stages.results import RESULTS

    assert list(RESULTS) == list(STAGE_NAMES)
    for spec in STAGES:
        assert spec.stats_file == RESULTS[spec.name].FILE == f"{spec.name}_result.json"


def test_no_stage_result_repeats_its_library_fields():
    """A stage result extends its library's result class (one field list): its own fields are only the ones
    the stage adds, none of them a library field again."""
    import dataclasses

    from packtrain.stages.results import RESULTS, StageResult

    for cls in RESULTS.values():
        libs = [b for b in cls.__mro__[1:] if dataclasses.is_dataclass(b) and not issubclass(b, StageResult)]
        own = set(cls.__annotations__) - {"STAGE", "FILE"}
        for lib in libs:
            assert not own & {f.name for f in dataclasses.fields(lib)}, (cls.__name__, lib.__name__)


# ---- the cache key follows the table: every recipe field -------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _outside_the_checkout(tmp_path_factory, seed_mlflow_store):
    """Run from a temporary directory: register's config part opens the store under the recipe's relative
    workdir (`data/mlflow.db`, and a changed value's `datax/`), which must not land in the checkout. Every store
    a key opens is an empty one copied there (`seed_mlflow_store`: five fresh stores were most of this module's
    minute); the keys read the same empty registry (no champion) either way."""
    cwd = tmp_path_factory.mktemp("cwd")
    for workdir in ("data", "datax"):
        seed_mlflow_store(cwd / workdir / "mlflow.db")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        yield


@pytest.fixture(scope="module")
def places(tmp_path_factory, seed_mlflow_store) -> dict[str, str]:
    """Real directories a path-valued field can point at: a one-file corpus, a dir with a model config.json
    (each with the store a workdir there opens), a store URI."""
    root = tmp_path_factory.mktemp("places")
    (root / "corpus").mkdir()
    (root / "corpus" / "a.txt").write_text("one tiny document\n", encoding="utf-8")
    (root / "init").mkdir()
    (root / "init" / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    for store in (root / "corpus" / "mlflow.db", root / "init" / "mlflow.db", root / "other.db"):
        seed_mlflow_store(store)
    return {"corpus": str(root / "corpus"), "init": str(root / "init"),
            "store": f"sqlite:///{root / 'other.db'}"}   # in tmp: a store URI must not leak a file into the cwd


def _annotation(path: str):
    """The declared type of a dotted RunConfig field (by YAML name: `validate`, not `validate_`)."""
    model: type[BaseModel] = RunConfig
    ann = None
    for part in path.split("."):
        field = next(f for name, f in model.model_fields.items() if (f.alias or name) == part)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
    return ann


def _literals(ann) -> list:
    """Every Literal option anywhere inside an annotation (Union, Annotated, ...)."""
    if typing.get_origin(ann) is typing.Literal:
        return list(typing.get_args(ann))
    return [x for a in typing.get_args(ann) for x in _literals(a)]


def _bump_digit(s: str) -> str | None:
    for i, c in enumerate(s):
        if c.isdigit():
            return s[:i] + str((int(c) + 1) % 10) + s[i + 1:]
    return None


def _candidates(path: str, value, places: dict[str, str]) -> list:
    """Other values to try for one field, most ordinary first; validation decides which are valid."""
    opts = [o for o in _literals(_annotation(path)) if o != value]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value * 2, value - 1, 1, 0, *opts]
    if isinstance(value, float):
        return [value * 0.5, value * 1.5, value + 0.1, 0.5, 1.0, 2.0, value * 0.99, *opts]
    if isinstance(value, list):
        if value and isinstance(value[0], float):
            return [[value[0] * 0.9, *value[1:]]]
        return [[*value, "x"], value[:1], value[:-1]]
    if isinstance(value, str):
        return [*opts, _bump_digit(value), value + "x", places["init"], places["corpus"], ["q_proj"], False, True]
    # None: a value of the field's other type
    return [*opts, places["corpus"] if path == "ingest.source" else places["init"], 1024, 2, 0.5, "x",
            places["store"], ["x==1"], True, {"type": "linear", "factor": 2.0},
            {"patience": 2, "min_delta": 0.0}, "sha256:" + "0" * 64]


COMPANIONS = {"train.deepspeed.offload_params": {"train.deepspeed.zero_stage": 3},
              "train.early_stopping": {"train.eval_every_steps": 10}}
"""Fields valid only together with another value (the expected stages come from every changed leaf)."""


def _valid_changes(path: str, places: dict[str, str]) -> Iterator[tuple[RunConfig, dict[str, str]]]:
    """Configs differing from tiny-cpu in `path` (and what validation derives from it), each valid, with their keys;
    in candidate order, each tried only when the one before has been taken."""
    for cand in _candidates(path, flatten(BASE_DICT)[path], places):
        if cand is None:
            continue
        d = copy.deepcopy(BASE_DICT)
        for key, val in {**COMPANIONS.get(path, {}), path: cand}.items():
            node = d
            *head, last = key.split(".")
            for part in head:
                node = node[part]
            node[last] = val
        try:
            cfg = RunConfig.model_validate(d)
            keys = _keys(cfg)   # the stages resolve some values (a warm start's directory must exist)
        except (ValueError, PacktrainError):   # pydantic's ValidationError is a ValueError
            continue
        if cfg.to_dict() != BASE_DICT:
            yield cfg, keys


def _keys(cfg: RunConfig) -> dict[str, str]:
    """Each stage's cache key for fixed (empty) inputs and code: only the config part varies."""
    return {s: stage_cache_key(s, {}, config_parts(s, cfg), "code")[0] for s in STAGE_NAMES}


def _declaring(changed: set[str]) -> set[str]:
    """Stages whose table entry declares a section (or field) covering one of the changed leaves."""
    return {s.name for s in STAGES
            if any(leaf == p or leaf.startswith(p + ".") for leaf in changed for p in s.config)}


def _check(cfg: RunConfig, keys: dict[str, str], base_keys: dict[str, str]) -> None:
    changed = {k for k, v in flatten(cfg.to_dict()).items() if flatten(BASE_DICT).get(k) != v}
    moved = {s for s, k in keys.items() if k != base_keys[s]}
    assert moved == _declaring(changed), f"changed {sorted(changed)}"


@pytest.fixture(scope="module")
def base_keys():
    # the resolved tracking URI is a key part of register: keep the environment's out of it
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield _keys(BASE)


@pytest.fixture(scope="module")
def valid_changes(places):
    """`_valid_changes(leaf, places)` as a list, each field's computed once in this module (both walks below use it)
    and only as far as asked: `first=True` stops at the first valid change, all the walk over every field takes
    (each change costs seven stages' keys; the whole lists were ~590 changes, most of that walk's 11.7 CPU-s), and
    the property test takes a drawn field's whole list."""
    memo: dict[str, tuple[list, Iterator]] = {}

    def changes(leaf: str, first: bool = False) -> list:
        found, rest = memo.setdefault(leaf, ([], _valid_changes(leaf, places)))
        if not (first and found):
            for change in rest:
                found.append(change)
                if first:
                    break
        return found[:1] if first else found
    return changes


def test_every_recipe_field_moves_exactly_its_stages(valid_changes, base_keys):
    """Walk every leaf of tiny-cpu's RunConfig.to_dict(); the first valid other value of each must change the
    keys of the stages that declare it and of no other."""
    untested = []
    for leaf in LEAVES:
        changes = valid_changes(leaf, first=True)
        if not changes:
            untested.append(leaf)
            continue
        _check(*changes[0], base_keys)
    assert not untested, f"no valid other value found for {untested}"


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_valid_change_moves_exactly_its_stages(valid_changes, base_keys, data):
    leaf = data.draw(st.sampled_from(LEAVES), label="field")
    changes = valid_changes(leaf)
    change = data.draw(st.sampled_from(changes), label="value")
    _check(*change, base_keys)


def test_the_step0_evaluation_counts_only_for_a_warm_start(places):
    """train reads the evaluate section only to measure the initial weights (model.init_from not scratch)."""
    scratch = load_run_config("tiny-cpu", ["evaluate.max_batches=3"])
    assert config_parts("train", scratch) == config_parts("train", BASE)
    warm = load_run_config("tiny-cpu", [f"model.init_from={places['init']}"])
    warm2 = load_run_config("tiny-cpu", [f"model.init_from={places['init']}", "evaluate.max_batches=3"])
    assert config_parts("train", warm)["evaluate"]["max_batches"] == BASE.evaluate.max_batches
    assert config_parts("train", warm) != config_parts("train", warm2)
    assert config_parts("tokenize", warm) == config_parts("tokenize", warm2)
