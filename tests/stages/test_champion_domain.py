"""The champion's own domain is always a regression suite (packtrain.evaluate.champion_domain), on every path.

    v1  champion: trained on domain A (prose), evaluated on A's held-out packs → tags heldout.path/.md5
    a plain `packtrain run` warm-started from v1 (model.init_from=champion) on a new, much easier domain B
    (counting), with no replay suite in the recipe → its own held-out split improves, v1's domain regresses:
    NOT promoted, and the reason names suite champion_domain with its CI
    a champion whose recorded held-out packs are gone → the plain line "nothing measures the champion's domain:
    …" in suites.json, validation.json, the version's tags; no promotion without
    register.promotion.allow_unguarded, promotion with it
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from promotion_models import domain_a, train_tiny, write_eval_packs, write_train_result

from packtrain.config import load_run_config
from packtrain.testing.tiny_model import build_tiny_model_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
from pipeline_helpers import as_args, run_main  # noqa: E402

NAME = "domain-lm"


def counting(n: int, seed: int) -> list[str]:
    """A new, much easier domain: runs of 40 consecutive numbers from random starts (all distinct)."""
    rng = np.random.default_rng(seed)
    return [" ".join(str(k) for k in range(s, s + 40)) for s in rng.choice(5000, n, replace=False).tolist()]


@pytest.fixture(scope="module")
def world(tmp_path_factory, seed_mlflow_store):
    root = tmp_path_factory.mktemp("domain")
    seed_mlflow_store(root / "mlflow.db")   # the registry's store, empty (its creation: not the subject)
    a_train, a_held = domain_a(120, 0), domain_a(40, 1)
    base = build_tiny_model_dir(root / "init", a_train + counting(120, 2), vocab_size=300, hidden_size=32)
    m = {"v1": train_tiny(base, root / "m1", a_train, steps=50, lr=3e-3, seed=0)}
    m["longer"] = train_tiny(m["v1"], root / "m3", a_train, steps=60, lr=3e-3, seed=2)
    packs = {"a": root / "packs_a", "gone": root / "packs_gone"}
    write_eval_packs(packs["a"] / "eval", base, a_held)
    shutil.copytree(packs["a"], packs["gone"])
    return {"root": root, "models": m, "packs": packs, "uri": f"sqlite:///{root / 'mlflow.db'}"}


def _cfg(world, name, *extra):
    return load_run_config("tiny-cpu", [
        f"workdir={world['root'] / 'work'}", f"tracking.tracking_uri={world['uri']}", f"register.model_name={name}",
        "tracking.system_metrics=false", "evaluate.sample_tokens=2", "evaluate.prompts=['The ']",
        "evaluate.suite_budget=128", "register.promotion.resamples=500", "evaluate.suites=[]", *extra])


def _evaluate(world, name, key, packs, tag, *extra):
    from packtrain.stages.evaluate import run_evaluate

    ev_dir = world["root"] / f"ev_{tag}"
    run_evaluate(_cfg(world, name, *extra), world["models"][key], world["packs"][packs], ev_dir)
    return ev_dir


def _register(world, name, key, ev_dir, tag, *extra, train=None):
    from packtrain.stages.register import run_register

    return run_register(_cfg(world, name, *extra), world["models"][key], ev_dir, train or world["root"] / "no-train",
                        world["root"] / f"reg_{tag}")


@pytest.fixture(scope="module")
def registry(world):
    """v1 champion of NAME (held-out packs A, kept) and of NAME-gone / NAME-override (held-out packs deleted
    after registration)."""
    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(world["root"])
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        set_fluent_tracking_uri(world["uri"])
        ev = _evaluate(world, NAME, "v1", "a", "v1")
        out = {"v1": _register(world, NAME, "v1", ev, "v1")}
        ev_gone = _evaluate(world, f"{NAME}-gone", "v1", "gone", "v1_gone")
        for name in (f"{NAME}-gone", f"{NAME}-override"):
            out[name] = _register(world, name, "v1", ev_gone, name)
        shutil.rmtree(world["packs"]["gone"])   # the lineage now points at missing data
    return out


def test_champion_records_where_its_held_out_documents_are(world, registry):
    from packtrain.versioning import data_md5

    t = registry["v1"].version_tags
    assert registry["v1"].decision == "champion"
    assert t["heldout.path"] == str((world["packs"]["a"] / "eval").resolve())
    assert t["heldout.md5"] == data_md5(world["packs"]["a"] / "eval") and t["heldout.n"] == "40"


def test_plain_run_on_an_easier_domain_does_not_take_the_alias(world, registry, tmp_path):
    """`packtrain run`, warm start from the champion, new easy domain only, no replay suite: not promoted."""
    import mlflow

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, text in enumerate(counting(80, 7)):
        (corpus / f"doc{i:03d}.txt").write_text(text + "\n", encoding="utf-8")
    settings = [
        f"workdir={tmp_path / 'wd'}", f"ingest.source={corpus}", "validate.min_rows=10", "tokenize.eval_fraction=0.2",
        "tokenize.workers=1", "pack.budget=64", "train.rows=8", "train.max_steps=40", "train.lr=3e-3",
        "train.warmup_steps=1", "evaluate.rows=2", "evaluate.sample_tokens=2", "evaluate.suite_budget=128",
        "evaluate.suites=[]", "tracking.system_metrics=false", f"tracking.tracking_uri={world['uri']}",
        f"register.model_name={NAME}", "register.promotion.resamples=500", "model.init_from=champion"]
    res = run_main(["run", *as_args(settings)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    client = mlflow.MlflowClient(tracking_uri=world["uri"], registry_uri=world["uri"])
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "1"
    v2 = client.get_model_version(NAME, "2")
    t = v2.tags
    assert t["decision"] == "challenger" and t["packtrain.parent_model_version"] == "1"
    assert t["validation_failed"] == "champion_domain"
    # better on its own (easy) held-out split, worse on the champion's: the reason names that suite and its CI
    path = client.download_artifacts(t["packtrain.register_run_id"], "validation/validation.json", str(tmp_path / "dl"))
    suites = {x["suite"]: x for x in json.loads(Path(path).read_text())["suites"]}
    assert suites["recent"]["passed"] is True and suites["recent"]["delta"] < 0
    assert suites["champion_domain"]["passed"] is False and suites["champion_domain"]["delta"] > 0.05
    reason = t["decision_reason"]
    assert "champion_domain (regression) not non-inferior" in reason and "CI [" in reason, reason
    assert t["champion_domain"].startswith("v1's domain: its held-out documents")
    assert "v2 → challenger" in res.stdout and "champion_domain" in res.stdout, res.stdout


@pytest.fixture(scope="module")
def longer_vs_gone(world, registry):
    """`longer` (v1 trained further on domain A: the suites alone would promote it) evaluated against v1, whose
    recorded held-out packs are gone (the same weights are v1 of both NAME-gone and NAME-override)."""
    return _evaluate(world, f"{NAME}-gone", "longer", "a", "longer_gone")


def test_missing_lineage_refuses_promotion_with_one_plain_line(world, registry, longer_vs_gone):
    import mlflow

    name, ev = f"{NAME}-gone", longer_vs_gone
    manifest = json.loads((ev / "suites.json").read_text())
    line = manifest["champion_domain"]["line"]
    assert manifest["champion_domain"]["status"] == "unguarded"
    assert line == (f"nothing measures the champion's domain: v1's held-out documents "
                    f"{(world['packs']['gone'] / 'eval').resolve()} (version tag heldout.path) do not exist")
    assert [s["name"] for s in manifest["suites"]] == ["recent"]
    reg = _register(world, name, "longer", ev, "longer_gone")
    assert (reg.version, reg.decision) == ("2", "challenger")
    assert reg.reason.startswith(f"not promoted over v1: {line} (register.promotion.allow_unguarded=true")
    assert "recent (primary" in reg.reason   # the suites alone would have promoted it
    assert reg.version_tags["champion_domain"] == line and reg.version_tags["validation"] == "keep"
    client = mlflow.MlflowClient(tracking_uri=world["uri"], registry_uri=world["uri"])
    assert str(client.get_model_version_by_alias(name, "champion").version) == "1"
    path = client.download_artifacts(reg.run_id, "validation/validation.json", str(world["root"] / "dl"))
    assert json.loads(Path(path).read_text())["champion_domain"] == line

    from packtrain.pipeline.summary import format_summary

    summary = format_summary("t", {"model_name": name, "version": "2", "alias": "challenger", "reason": reg.reason,
                                   "champion_domain": line}, 1.0, 7, None)
    assert f"\n             {line}" in summary


def test_missing_lineage_promotes_with_the_override(world, registry, longer_vs_gone):
    import mlflow

    name = f"{NAME}-override"   # its v1 is NAME-gone's v1 (the same weights and evaluation)
    reg = _register(world, name, "longer", longer_vs_gone, "longer_override", "register.promotion.allow_unguarded=true")
    assert (reg.version, reg.decision) == ("2", "champion")
    assert reg.reason.endswith("do not exist: promoted anyway (register.promotion.allow_unguarded=true)")
    assert reg.version_tags["champion_domain"].startswith("nothing measures the champion's domain: v1's held-out")
    client = mlflow.MlflowClient(tracking_uri=world["uri"], registry_uri=world["uri"])
    assert str(client.get_model_version_by_alias(name, "champion").version) == "2"


def test_override_on_a_rerun_moves_the_registered_version_with_this_verdict(world, registry, longer_vs_gone,
                                                                              tmp_path):
    """The same challenger registered again with the override (weights and lineage registered already, kept): that
    version takes the alias, and its tags and its register run are this verdict's (validation promote, the line),
    not the earlier keep's."""
    import mlflow

    name = f"{NAME}-rerun"
    _register(world, name, "v1", world["root"] / "ev_v1_gone", name)   # v1: its held-out packs are gone
    kept = _register(world, name, "longer", longer_vs_gone, "rerun_keep")
    assert (kept.version, kept.decision) == ("2", "challenger")
    again = _register(world, name, "longer", longer_vs_gone, "rerun_override",
                      "register.promotion.allow_unguarded=true")
    assert (again.version, again.decision, again.existing) == ("2", "champion", True), again.reason
    client = mlflow.MlflowClient(tracking_uri=world["uri"], registry_uri=world["uri"])
    assert str(client.get_model_version_by_alias(name, "champion").version) == "2"
    t = client.get_model_version(name, "2").tags
    assert (t["decision"], t["validation"], t["packtrain.register_run_id"]) == ("champion", "promote", again.run_id)
    assert t["validation_reason"].endswith("promoted anyway (register.promotion.allow_unguarded=true)")
    assert t["champion_domain"].startswith("nothing measures the champion's domain: v1's held-out documents")
    path = client.download_artifacts(t["packtrain.register_run_id"], "validation/validation.json", str(tmp_path))
    verdict = json.loads(Path(path).read_text())
    assert verdict["promote"] is True and verdict["champion_domain"] == t["champion_domain"]


def test_a_version_without_recorded_held_out_documents_is_unguarded(world):
    from packtrain.evaluate.champion_domain import champion_domain

    cd = champion_domain("v3", {}, world["models"]["v1"], None)
    assert (cd.status, cd.suite) == ("unguarded", None)
    assert cd.line.startswith("nothing measures the champion's domain: v3 records no held-out documents")
    same = champion_domain("v3", {"heldout.path": str(world["packs"]["a"] / "eval")}, world["models"]["v1"],
                           __import__("packtrain.versioning").versioning.data_md5(world["packs"]["a"] / "eval"))
    assert same.status == "recent" and same.suite is None   # this run's own held-out split measures it


def test_registering_the_same_weights_again_is_no_new_version(world, registry, capsys):
    """A rerun (`--no-cache`, a new op) of a registration whose weights and lineage are registered already points at
    that version and says so (its decision: v1 holds the champion alias)."""
    import mlflow

    from packtrain.pipeline.summary import build_summary, format_summary

    client = mlflow.MlflowClient(tracking_uri=world["uri"], registry_uri=world["uri"])
    before = len(client.search_model_versions(f"name = '{NAME}'"))
    again = _register(world, NAME, "v1", world["root"] / "ev_v1", "v1_again")
    assert (again.version, again.decision, again.existing) == ("1", "champion", True)
    assert again.reason.startswith(f"already registered: {NAME} v1 holds these weights (model md5 "
                                   f"{registry['v1'].version_tags['model_md5'][:12]}, same data and tokenizer): no "
                                   "new version; v1 holds the champion alias")
    assert again.op_id != registry["v1"].op_id and again.version_tags["model_md5"] == registry["v1"].version_tags["model_md5"]
    assert len(client.search_model_versions(f"name = '{NAME}'")) == before
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "1"
    text = format_summary("t", build_summary({"register": again}), 1.0, 7, None)
    assert f"register   {NAME} v1 (already registered: same weights and lineage, no new version) → champion" in text
    # the same weights registered again with their train output (its token store md5, unknown to v1): v1 again
    train = write_train_result(world["root"] / "train_v1", registry["v1"].version_tags["dataset_md5"], "70ec")
    with_train = _register(world, NAME, "v1", world["root"] / "ev_v1", "v1_with_train", train=train)
    assert (with_train.version, with_train.existing) == ("1", True), with_train.reason
    assert len(client.search_model_versions(f"name = '{NAME}'")) == before


def test_rerun_after_kill_during_register_finishes_the_same_version(world, registry, tmp_path, capsys):
    """kill -9 of `packtrain register` between the version and its alias, then a rerun: one version, its alias set."""
    import os

    import mlflow

    from packtrain.cli import main

    name = f"{NAME}-kill"
    args = ["register", "--model", str(world["models"]["v1"]), "--eval", str(world["root"] / "ev_v1"),
            "--train", str(tmp_path / "no-train"), "--out", str(tmp_path / "r"),
            "--set", f"tracking.tracking_uri={world['uri']}", "--set", f"register.model_name={name}",
            "--set", f"workdir={tmp_path / 'wd'}"]
    pid = os.fork()   # the killed process: a fork of this one (imports done: ~0.3 s instead of ~8 s for a new one)
    if pid == 0:
        try:
            import signal

            signal.alarm(120)   # a child stuck on a lock inherited through fork dies (SIGALRM), never hangs
            os.environ["PACKTRAIN_FAULT"] = "register.version_registered"
            main(args)
        finally:
            os._exit(3)   # reached only if the fault point did not fire
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9, f"wait status {status}"
    client = mlflow.MlflowClient(tracking_uri=world["uri"], registry_uri=world["uri"])
    (v,) = client.search_model_versions(f"name = '{name}'")
    assert not client.get_registered_model(name).aliases   # killed before its alias
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"{name} v1 → champion (already registered: {name} v1 holds these weights" in out, out
    assert [str(x.version) for x in client.search_model_versions(f"name = '{name}'")] == ["1"]
    assert str(client.get_model_version_by_alias(name, "champion").version) == "1"


def test_champion_held_out_documents_planted_in_a_new_corpus_are_dropped(world, registry, tmp_path, capsys):
    """A champion exists (v1, trained on domain A): three of its held-out documents copied verbatim into a new
    corpus B are found by the default contamination check as suite champion_domain and dropped (policy drop), so
    they are neither trained on nor scored as that suite afterwards. The stage cache keys of validate and
    tokenize hold the champion; a champion whose held-out documents are gone does not fail the check."""
    from packtrain.cli import main
    from packtrain.data.tokenize import split_eval
    from packtrain.pipeline.runtime import config_parts
    from packtrain.pipeline.summary import build_summary, format_summary

    held = set(np.flatnonzero(split_eval(np.arange(63), 0.1)).tolist())
    planted = [i for i in range(5, 63, 11) if i not in held][:3]   # training-split positions of corpus B
    a_held = domain_a(40, 1)   # v1's held-out documents (its eval packs A)
    docs = [" ".join(str(k) for k in range(s, s + 40)) for s in range(0, 3000, 50)]   # 60, no 13-gram shared
    for k, i in enumerate(planted):
        docs.insert(i, a_held[3 + 10 * k])
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))

    def sets(name):
        return ["--set", f"workdir={tmp_path / name}", "--set", "validate.min_rows=10", "--set",
                "tokenize.eval_fraction=0.1", "--set", "tokenize.vocab_size=300", "--set", "pack.budget=128",
                "--set", f"tracking.tracking_uri={world['uri']}", "--set", f"register.model_name={name}",
                "--set", "tracking.system_metrics=false"]

    for name in (NAME, f"{NAME}-gone"):
        assert main(["ingest", "--source", str(tmp_path / "b.jsonl"), *sets(name)]) == 0
        assert main(["validate", *sets(name)]) == 0 and main(["tokenize", *sets(name)]) == 0
    err = capsys.readouterr().err
    found = json.loads((tmp_path / NAME / "validate" / "validate_result.json").read_text())["contamination"]
    assert found["policy"] == "drop" and found["dropped"] == planted
    assert found["suites"] == ["wordorder", "champion_domain"] and found["by_suite"] == [["champion_domain", 3]]
    assert [o["eval_file"] for o in found["overlaps"]] == [str((world["packs"]["a"] / "eval").resolve())] * 3
    assert found["champion_domain"].startswith("v1's domain: its held-out documents")
    assert f"3 of {63 - len(held)} training document(s) overlap the eval data" in err
    assert "of suite champion_domain" in err and "dropped from training" in err
    tok = json.loads((tmp_path / NAME / "tokenize" / "tokenize_result.json").read_text())
    assert tok["contamination_dropped"] == planted and tok["documents"] == 60
    result = json.loads((tmp_path / NAME / "validate" / "validate_result.json").read_text())
    summary = format_summary("t", build_summary({"validate": result}), 1.0, 7, None)
    assert (f"contamination: 3 of {63 - len(held)} training documents hold an eval document (champion_domain 3), "
            "dropped") in summary

    # the champion's held-out packs are gone: nothing to read them from, the check still runs and says so
    gone = json.loads((tmp_path / f"{NAME}-gone" / "validate" / "validate_result.json").read_text())["contamination"]
    assert gone["dropped"] == [] and gone["suites"] == ["wordorder"]
    assert gone["champion_domain"].startswith("nothing measures the champion's domain: v1's held-out documents")
    assert "(not checked against)" in err

    # the cache keys: the champion's version, its held-out documents' md5 and how many are read (none before a
    # champion exists)
    cfg = load_run_config("tiny-cpu", [f"tracking.tracking_uri={world['uri']}", f"register.model_name={NAME}"])
    for stage in ("validate", "tokenize"):
        assert config_parts(stage, cfg)["champion_domain"] == {
            "champion": f"models:/{NAME}/1", "heldout": registry["v1"].version_tags["heldout.md5"],
            "max_documents": cfg.evaluate.recent_max_documents}   # how many of them the check reads
        assert "champion_domain" not in config_parts(stage, cfg.model_copy(update={"register_": cfg.register_.model_copy(
            update={"model_name": f"{NAME}-none"})}))


def test_only_a_champion_of_this_data_and_recipe_is_taken_for_this_runs_held_out_split():
    """Its held-out documents are then this run's held-out split, which the check reads already: nothing is added
    (and the stage cache keys of a rerun on unchanged data stay the first run's); any other champion is read."""
    from packtrain.evaluate.champion_domain import same_split
    from packtrain.evaluate.recipe_identity import CONFIG_TAG, SPLIT_TAG
    from packtrain.evaluate.seed_spread import recipe_hash, split_hash

    cfg = load_run_config("tiny-cpu")
    tags = {"dataset_md5": "aa.dir", CONFIG_TAG: recipe_hash(cfg)}
    assert same_split(tags, cfg, "aa.dir")
    assert same_split(tags, load_run_config("tiny-cpu", ["train.seed=3"]), "aa.dir")   # the seed splits nothing
    assert not same_split(tags, cfg, "bb.dir") and not same_split(tags, cfg, None)     # other data / unknown
    assert not same_split(tags, load_run_config("tiny-cpu", ["tokenize.eval_fraction=0.2"]), "aa.dir")
    assert not same_split({"dataset_md5": "aa.dir"}, cfg, "aa.dir")                    # registered without a recipe
    # a version carrying its split settings: a model or train change keeps the split (no retokenizing for it)
    split = {"dataset_md5": "aa.dir", SPLIT_TAG: split_hash(cfg), CONFIG_TAG: "another recipe"}
    assert same_split(split, load_run_config("tiny-cpu", ["train.max_steps=99", "model.hidden_size=48"]), "aa.dir")
    assert not same_split(split, load_run_config("tiny-cpu", ["tokenize.eval_fraction=0.2"]), "aa.dir")
    # ingest's per-document rules read these (with on_bad_record=skip they decide which records get a doc_id)
    assert not same_split(split, load_run_config("tiny-cpu", ["pack.budget=64"]), "aa.dir")
    # a check that does not read the held-out split has not checked them: the champion's documents are read
    assert not same_split(split, load_run_config("tiny-cpu", ["validate.contamination.held_out=false"]), "aa.dir")
