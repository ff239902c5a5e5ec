"""The stage cache of `packtrain run`: keys follow inputs/config/code, entries restore exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtrain.config import load_run_config
from packtrain.pipeline.cache import StageCache, dir_md5, stage_cache_key
from packtrain.pipeline.runtime import config_parts, metadata_of, read_inputs, runner_args


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_dir_md5_depends_on_names_and_contents_only(tmp_path):
    a = _tree(tmp_path / "a", {"x.bin": b"1", "sub/y.txt": b"22"})
    b = _tree(tmp_path / "b", {"sub/y.txt": b"22", "x.bin": b"1"})
    assert dir_md5(a) == dir_md5(b)
    (b / "x.bin").write_bytes(b"2")
    assert dir_md5(a) != dir_md5(b)
    c = _tree(tmp_path / "c", {"x.bin": b"1", "sub/z.txt": b"22"})  # renamed file
    assert dir_md5(a) != dir_md5(c)
    before = dir_md5(a)
    _tree(a, {".x.tmp": b"junk"})  # dotfiles (temp files) are never outputs
    assert dir_md5(a) == before
    assert dir_md5(tmp_path / "missing") == "missing"


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.text("abcxyz", min_size=1, max_size=4), st.binary(max_size=64), min_size=1, max_size=5))
def test_dir_md5_is_a_function_of_the_tree(tmp_path_factory, files):
    a = _tree(tmp_path_factory.mktemp("a"), files)
    b = _tree(tmp_path_factory.mktemp("b"), dict(reversed(list(files.items()))))
    assert dir_md5(a) == dir_md5(b)


def test_key_changes_with_inputs_config_and_code(tmp_path):
    cfg = load_run_config("tiny-cpu")
    tokens = _tree(tmp_path / "tokens", {"tokens.bin": b"\x01\x02"})
    base, parts = stage_cache_key("pack", {"tokens": tokens}, config_parts("pack", cfg), "v1")
    assert parts["inputs"]["tokens"] == dir_md5(tokens)
    assert stage_cache_key("pack", {"tokens": tokens}, config_parts("pack", cfg), "v1")[0] == base
    # another pack budget, other code, other input bytes → other keys
    cfg2 = load_run_config("tiny-cpu", ["pack.budget=1024"])
    assert stage_cache_key("pack", {"tokens": tokens}, config_parts("pack", cfg2), "v1")[0] != base
    assert stage_cache_key("pack", {"tokens": tokens}, config_parts("pack", cfg), "v2")[0] != base
    (tokens / "tokens.bin").write_bytes(b"\x01\x03")
    assert stage_cache_key("pack", {"tokens": tokens}, config_parts("pack", cfg), "v1")[0] != base


def test_config_parts_hold_only_what_the_stage_reads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # register's parts resolve the store: the recipe's workdir `data` is made in the cwd
    cfg = load_run_config("tiny-cpu")
    other = load_run_config("tiny-cpu", ["train.lr=0.1", "evaluate.max_batches=3"])
    for stage in ("ingest", "validate", "tokenize", "pack"):  # upstream of train: a new lr changes nothing
        assert config_parts(stage, cfg) == config_parts(stage, other)
    assert config_parts("train", cfg) != config_parts("train", other)
    assert config_parts("evaluate", cfg) != config_parts("evaluate", other)
    assert config_parts("train", cfg)["pack.budget"] == cfg.pack.budget


def test_an_eval_file_edited_in_place_moves_the_keys_of_the_stages_that_read_it(tmp_path):
    """validate and tokenize (the contamination check) read the suites' files and `against`; evaluate the
    suites. An item appended to a task's data file (its YAML unchanged) or an `against` file rewritten is a miss
    for exactly those stages, not a restored verdict about the old items (a training document holding the new
    item was trained on: the check was never run against it)."""
    import json
    import shutil

    from packtrain.config import recipe_dir

    task = tmp_path / "task"
    shutil.copytree(recipe_dir() / "tasks" / "wordorder", task)
    against = tmp_path / "evals.jsonl"
    against.write_text('{"text": "one held back eval record of this project"}\n', encoding="utf-8")
    cfg = load_run_config("tiny-cpu", [f"workdir={tmp_path / 'work'}", f"validate.contamination.against=[{against}]",
                                       f"evaluate.suites=[{{name: wordorder, role: task, path: {task / 'wordorder.yaml'}}}]"])
    stages = ("validate", "tokenize", "evaluate")

    def keys():
        return {s: config_parts(s, cfg) for s in stages}

    before = keys()
    assert keys() == before   # nothing edited: the same keys (a hit)
    item = {"context": "    # a new item", "choices": ["return self.value_", "self.value_ return"], "label": 0}
    with open(task / "wordorder.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(item) + "\n")
    edited = keys()
    assert [s for s in stages if edited[s] != before[s]] == ["validate", "tokenize", "evaluate"]
    against.write_text('{"text": "another held back eval record"}\n', encoding="utf-8")
    assert [s for s, parts in keys().items() if parts != edited[s]] == ["validate", "tokenize"]


def test_train_key_follows_the_planner_section(tmp_path, monkeypatch):
    """The planner picks the train shape (budget auto): a new plan.target_fraction must rerun train, not
    reuse a train stage planned for another memory target (before the stage table, `plan` was left out)."""
    monkeypatch.chdir(tmp_path)   # register's parts resolve the store: the recipe's workdir `data` is made in the cwd
    cfg = load_run_config("tiny-cpu")
    other = load_run_config("tiny-cpu", ["plan.target_fraction=0.5"])
    assert config_parts("train", cfg) != config_parts("train", other)
    assert config_parts("train", other)["plan"]["target_fraction"] == 0.5
    for stage in ("ingest", "validate", "tokenize", "pack", "evaluate", "register"):
        assert config_parts(stage, cfg) == config_parts(stage, other)


def test_store_then_restore_gives_the_same_tree_and_stats(tmp_path):
    out = _tree(tmp_path / "out", {"model/w.bin": b"w" * 100, "train_result.json": b"{}"})
    cache = StageCache(tmp_path / "cache")
    assert cache.lookup("train", "k1") is None
    cache.store("train", "k1", out, {"steps": 2}, {"parts": 1})
    hit = cache.lookup("train", "k1")
    assert hit is not None and hit.stats == {"steps": 2}
    dst = tmp_path / "run2" / "model"
    cache.restore(hit, dst)
    assert dir_md5(dst) == dir_md5(out)
    assert (out / "model" / "w.bin").read_bytes() == b"w" * 100  # the source is untouched



@pytest.mark.parametrize("stage, old", [("pack", "pack_stats.json"), ("tokenize", "stats.json"),
                                        ("evaluate", "eval_result.json"), ("ingest", "ingest_stats.json")])
def test_an_entry_with_the_old_record_name_is_a_miss(tmp_path, stage, old):
    """An entry stored before the records were named <stage>_result.json (a pinned code version keeps its key)
    is a miss — the stage reruns and stores it again — not a restore the next stage cannot read."""
    cache = StageCache(tmp_path / "cache")
    cache.store(stage, "k1", _tree(tmp_path / "old", {old: b"{}"}), {"documents": 3}, {})
    assert cache.lookup(stage, "k1") is None
    cache.store(stage, "k1", _tree(tmp_path / "new", {f"{stage}_result.json": b"{}"}), {"documents": 3}, {})
    hit = cache.lookup(stage, "k1")
    assert hit is not None and hit.stats == {"documents": 3}

@pytest.mark.parametrize("stage, inputs, expected", [
    ("ingest", {}, []),
    ("validate", {"documents": "/a/docs"}, ["/a/docs"]),
    ("tokenize", {"documents": "/a/docs"}, ["/a/docs"]),
    ("pack", {"tokens": "/a/tok"}, ["/a/tok"]),
    ("train", {"packs": "/a/packs", "tokens": "/a/tok"}, ["/a/packs", "/a/tok"]),
    ("evaluate", {"model": "/a/train", "packs": "/a/packs"}, ["/a/train/model", "/a/packs"]),
    ("register", {"model": "/a/train", "evaluation": "/a/ev"}, ["/a/train/model", "/a/ev", "/a/train"]),
])
def test_runner_args_follow_the_stage_contract(stage, inputs, expected):
    from packtrain.stages.table import stage_spec

    assert set(inputs) == set(stage_spec(stage).inputs)
    assert runner_args(stage, inputs) == [Path(p) for p in expected]


def test_a_train_outputs_checkpoints_key_nothing_downstream(tmp_path, monkeypatch):
    """evaluate and register read the saved model (and register the train result), never checkpoints/: a
    checkpoint written or pruned leaves their cache keys as they were, and the keys do not hash its bytes."""
    monkeypatch.chdir(tmp_path)   # register's parts resolve the store: the recipe's workdir `data` is made in the cwd
    cfg = load_run_config("tiny-cpu")
    train = _tree(tmp_path / "train", {"model/w.bin": b"w", "train_result.json": b"{}",
                                       "checkpoints/step_000001/optimizer.pt": b"o"})
    ev, packs = _tree(tmp_path / "ev", {"evaluate_result.json": b"{}"}), _tree(tmp_path / "packs", {"p.bin": b"p"})
    assert set(read_inputs("register", {"model": str(train), "evaluation": str(ev)})) == {
        "model/model", "evaluation", "model/train_result.json"}
    keys = [stage_cache_key(stage, read_inputs(stage, inputs), config_parts(stage, cfg), "v1")[0]
            for stage, inputs in (("evaluate", {"model": str(train), "packs": str(packs)}),
                                  ("register", {"model": str(train), "evaluation": str(ev)}))]
    (train / "checkpoints" / "step_000001" / "optimizer.pt").write_bytes(b"another")
    assert keys == [stage_cache_key(stage, read_inputs(stage, inputs), config_parts(stage, cfg), "v1")[0]
                    for stage, inputs in (("evaluate", {"model": str(train), "packs": str(packs)}),
                                          ("register", {"model": str(train), "evaluation": str(ev)}))]
    (train / "train_result.json").write_bytes(b'{"steps": 2}')   # what register does read changes its key
    assert stage_cache_key("register", read_inputs("register", {"model": str(train), "evaluation": str(ev)}),
                           config_parts("register", cfg), "v1")[0] != keys[1]


def test_runner_args_name_a_missing_input():
    from packtrain.errors import MissingDataError

    with pytest.raises(MissingDataError, match=r"stage train: missing input\(s\) \['tokens'\]"):
        runner_args("train", {"packs": "/a"})
    with pytest.raises(MissingDataError, match=r"needs \['documents'\]; got unknown \['docs'\]"):
        runner_args("validate", {"docs": "/a"})   # the pre-table name is refused, not guessed


def test_metadata_is_flat_scalars():
    meta = metadata_of({"fill": 0.99, "train": {"n_packs": 3}, "curve": [1.0, 2.0], "nested": {"x": None},
                        "big": list(range(100))})
    assert meta == {"fill": 0.99, "train.n_packs": 3, "curve": [1.0, 2.0], "nested.x": None}


def test_no_cache_refreshes_the_entry_that_later_runs_restore(tmp_path, monkeypatch):
    """`packtrain run --no-cache` (REFRESH_ENV) reruns the stage and its fresh output replaces the cache entry:
    the next cached run restores the refreshed output and stats, not the first run's."""
    import json

    from pipeline_helpers import tiny_corpus, tiny_settings

    from packtrain.config import load_run_config
    from packtrain.pipeline.runtime import REFRESH_ENV, run_stage

    corpus = tiny_corpus(tmp_path / "corpus", n_docs=12)
    cfg = load_run_config("tiny-cpu", tiny_settings(tmp_path / "wd", corpus) + ["tracking.enabled=false"])
    cache = tmp_path / "cache"
    monkeypatch.setenv("PACKTRAIN_CODE_VERSION", "pinned")
    first = run_stage("ingest", cfg, {}, tmp_path / "r1" / "documents", cache_dir=cache)
    (entry,) = (cache / "ingest").iterdir()
    created = json.loads((entry / "entry.json").read_text())["stats"]
    monkeypatch.setenv(REFRESH_ENV, "1")
    refreshed = run_stage("ingest", cfg, {}, tmp_path / "r2" / "documents", cache_dir=cache)
    assert first["cache"] == refreshed["cache"] == "miss"   # the refresh ran the stage instead of restoring it
    stored = json.loads((entry / "entry.json").read_text())["stats"]
    assert created["output"].startswith(str(tmp_path / "r1"))
    assert stored["output"].startswith(str(tmp_path / "r2")), "the entry still holds the first run's stats"
    monkeypatch.delenv(REFRESH_ENV)
    again = run_stage("ingest", cfg, {}, tmp_path / "r3" / "documents", cache_dir=cache)
    assert again["cache"] == "hit"
    assert {k: v for k, v in again.items() if k not in ("cache", "cache_key", "cache_key_s")} == stored
