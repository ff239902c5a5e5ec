"""Typed stage results: a tiny real chain ingest → tokenize → pack → train → evaluate (tracking off, in-process)
writes JSON that round-trips through `from_dict`, carries one lineage chain (the source's md5 as data version,
one tokenizer hash, the md5 of what each stage read), and gives the registry every lineage tag it can have on
a CPU run. Before typed results, register read `dvc_md5`/`git_commit`/`summary.useful_mfu`, keys no stage
wrote, so lineage silently found nothing.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from packtrain.config import load_run_config
from packtrain.errors import InputDataError, MissingDataError
from packtrain.stages.lineage import Lineage, make_lineage, upstream_lineage
from packtrain.stages.results import (
    RESULTS,
    EvaluateResult,
    IngestResult,
    PackResult,
    TokenizeResult,
    TrainResult,
    as_dict,
)
from packtrain.versioning import data_md5, file_md5, git_sha

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
from pipeline_helpers import tiny_corpus, tiny_settings  # noqa: E402


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """The five stage results of one tiny chain (2 train steps, 1 eval batch), by stage."""
    from packtrain.stages.evaluate import run_evaluate
    from packtrain.stages.ingest import run_ingest
    from packtrain.stages.pack import run_pack
    from packtrain.stages.tokenize import run_tokenize
    from packtrain.stages.train import run_train

    root = tmp_path_factory.mktemp("chain")
    corpus = tiny_corpus(root / "corpus", n_docs=30)
    wd = root / "wd"
    cfg = load_run_config("tiny-cpu", [*tiny_settings(wd, corpus), "tracking.enabled=false"])
    out = {"ingest": run_ingest(cfg, wd / "ingest")}
    out["tokenize"] = run_tokenize(cfg, wd / "ingest", wd / "tokenize")
    out["pack"] = run_pack(cfg, wd / "tokenize", wd / "pack")
    out["train"] = run_train(cfg, wd / "pack", wd / "tokenize", wd / "train")
    out["evaluate"] = run_evaluate(cfg, wd / "train" / "model", wd / "pack", wd / "evaluate")
    return wd, corpus, out


def test_written_json_round_trips(chain):
    wd, _, results = chain
    for stage, r in results.items():
        cls = RESULTS[stage]
        assert isinstance(r, cls)
        on_disk = json.loads((wd / stage / cls.FILE).read_text())
        assert on_disk == r.to_dict() == as_dict(r)          # the file is exactly the returned result
        back = cls.from_dict(on_disk)
        assert back == r and back.to_dict() == on_disk       # and reads back as the same typed result


def test_one_lineage_chain(chain):
    wd, corpus, r = chain
    source_md5 = data_md5(corpus)
    assert r["ingest"].lineage.input_md5 == {"source": source_md5} and r["ingest"].input_md5_of == "source"
    tok_hash = r["tokenize"].tokenizer_hash
    assert tok_hash and tok_hash.startswith("sha256:")
    for stage, res in r.items():
        lin = res.lineage
        assert lin.data_version == source_md5, stage         # the source's DVC md5, carried down the chain
        assert lin.git_sha == git_sha() and lin.code_version, stage
        assert all(lin.input_md5.values()), stage
        if stage != "ingest":
            assert lin.tokenizer_hash == tok_hash, stage     # the store's tokenizer = the model's
    # what each stage read is what the stage before wrote
    assert r["tokenize"].lineage.input_md5["documents"] == r["ingest"].output_md5
    assert r["pack"].lineage.input_md5["tokens"] == r["tokenize"].tokens_md5 == r["train"].lineage.input_md5["tokens"]
    assert r["train"].lineage.input_md5["packs"] == data_md5(wd / "pack" / "train")
    assert r["evaluate"].lineage.input_md5 == {"model": data_md5(wd / "train" / "model"),
                                               "packs": data_md5(wd / "pack" / "eval")}
    assert r["train"].packing_fill == r["pack"].train.fill > 0.5


def test_registry_lineage_tags_from_typed_results(chain):
    from packtrain.registry.lineage_tags import LINEAGE_TAGS, collect_lineage

    wd, corpus, r = chain
    train_json = json.loads((wd / "train" / TrainResult.FILE).read_text())
    eval_json = json.loads((wd / "evaluate" / EvaluateResult.FILE).read_text())
    values, origin, missing = collect_lineage(train_json, eval_json, checkout_sha="not-used")
    assert values["dataset_md5"] == data_md5(corpus) and origin["dataset_md5"] == "train_result:lineage.data_version"
    assert values["git_sha"] == r["train"].lineage.git_sha and values["tokenizer_hash"].startswith("sha256:")
    assert values["packing_fill"] == r["pack"].train.fill
    assert values["peak_memory_gib"] > 0                      # CPU: the process' peak RSS
    assert set(missing) <= {"mfu", "git_sha"} and set(values) | set(missing) == set(LINEAGE_TAGS)
    # without a train result the evaluation's lineage still names the data and the tokenizer
    values, origin, missing = collect_lineage(None, eval_json, checkout_sha="abc")
    assert values["dataset_md5"] == data_md5(corpus) and values["tokenizer_hash"] == r["train"].lineage.tokenizer_hash
    assert set(missing) == {"packing_fill", "mfu", "peak_memory_gib"} | ({"git_sha"} if not git_sha() else set())
    no_sha = {**eval_json, "lineage": {**eval_json["lineage"], "git_sha": None}}
    assert collect_lineage(None, no_sha, checkout_sha="abc")[1]["git_sha"] == "checkout"


def test_unknown_and_missing_keys_are_refused(chain, tmp_path):
    wd, _, r = chain
    d = r["pack"].to_dict()
    with pytest.raises(InputDataError, match=r"pack_result\.json: unknown key 'fill_ratio'"):
        PackResult.from_dict({**d, "fill_ratio": 0.9})
    bad = tmp_path / TrainResult.FILE
    bad.write_text(json.dumps({k: v for k, v in r["train"].to_dict().items() if k != "final_loss"}))
    with pytest.raises(InputDataError, match=rf"{bad}: missing required key 'final_loss'"):
        TrainResult.from_file(bad)
    lin = {**d["lineage"], "dvc_md5": "x"}
    with pytest.raises(InputDataError, match=r"key 'lineage'.*unknown key 'dvc_md5'"):
        PackResult.from_dict({**d, "lineage": lin})
    with pytest.raises(MissingDataError, match="packtrain tokenize"):
        TokenizeResult.from_dir(tmp_path)
    from packtrain.registry.lineage_tags import collect_lineage

    with pytest.raises(InputDataError, match="train_result.json: unknown key 'summary'"):   # the old alias shape
        collect_lineage({"summary": {"useful_mfu": 0.4}, "git_commit": "abc"}, None)


def test_lineage_rules():
    up = Lineage(git_sha=None, code_version="0", input_md5={}, data_version="src", tokenizer_hash="sha256:t")
    assert make_lineage({"tokens": "aa", "x": None}, None, up).input_md5 == {"tokens": "aa"}
    assert (make_lineage({"tokens": "aa"}, None, up).data_version, make_lineage({"tokens": "aa"}).data_version) == \
        ("src", "aa")   # upstream's chain, else it starts at this stage's first input
    assert make_lineage({}, up, tokenizer_hash="sha256:own").tokenizer_hash == "sha256:own"
    assert [f.name for f in dataclasses.fields(Lineage)] == ["git_sha", "code_version", "input_md5",
                                                              "data_version", "tokenizer_hash"]


def test_upstream_lineage_of_library_files(tmp_path):
    """The library functions write the stats file names without a lineage: the chain starts downstream."""
    assert upstream_lineage(tmp_path / "pack_result.json") is None
    (tmp_path / "pack_result.json").write_text(json.dumps({"budget": 64}))
    assert upstream_lineage(tmp_path / "pack_result.json") is None
    (tmp_path / "pack_result.json").write_text(json.dumps({"lineage": {"git_sha": None}}))
    with pytest.raises(InputDataError, match="missing required key 'code_version'"):
        upstream_lineage(tmp_path / "pack_result.json")
    assert file_md5(tmp_path / "pack_result.json") == data_md5(tmp_path / "pack_result.json")
    assert IngestResult.read_optional(tmp_path) is None
