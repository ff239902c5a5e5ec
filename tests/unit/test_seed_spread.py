"""Seed noise in the promotion decision: the seed-spread record's margins, its recipe check, and the power check
(literal tables; the models-and-registry version is tests/stages/test_promotion.py)."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from packtrain.config import load_run_config
from packtrain.config.evaluate import PromotionConfig
from packtrain.errors import ConfigError, MissingDataError
from packtrain.evaluate.power import check_power, power_table
from packtrain.evaluate.promotion import decide_promotion, verdict_markdown
from packtrain.evaluate.seed_spread import mde, recipe_hash, resolve_seed_spread, seed_margin, t_quantile

CFG = PromotionConfig(resamples=500)
N = 40
BYTES = np.full(N, 1000.0)
BASE = 700 + 50 * np.random.default_rng(0).random(N)


def _text(name, role, shift_bits):
    """Challenger = champion shifted by `shift_bits` bits/byte on every document, plus a little noise."""
    noise = np.random.default_rng(1).normal(0, 0.5, N)
    ch = BASE + shift_bits * math.log(2) * BYTES + noise
    col = lambda nll: {"nll": np.asarray(nll, float), "tokens": np.full(N, 100), "bytes": BYTES,  # noqa: E731
                       "acc": np.full(N, np.nan)}
    return {"suite": name, "role": role, "kind": "text", "md5": "m", "challenger": col(ch), "champion": col(BASE),
            "same_tokenizer": True}


def _spread(**sd):
    return {"recipe": "tiny-cpu", "k": 4, "path": "/r.json", "note": "margins from the seed-spread record r.json",
            "suites": {n: {"sd": s, "doc_sd": 0.05, "n": N, "unit": "bits/byte"} for n, s in sd.items()}}


@pytest.mark.parametrize("p, df, want", [(0.95, 2, 2.919986), (0.95, 3, 2.353363), (0.975, 10, 2.228139),
                                         (0.99, 30, 2.457262), (0.95, 1, 6.313752), (0.05, 5, -2.015048)])
def test_t_quantile_matches_the_tables(p, df, want):
    assert t_quantile(p, df) == pytest.approx(want, abs=2e-6)


def test_seed_margin_and_mde_worked_numbers():
    # docs/validation.md: k 4 seeds, sd 0.0113 bits/byte, 95 % → 2.3534 · 0.0113 · √2
    assert seed_margin(0.0113, 4, 0.95) == pytest.approx(2.353363 * 0.0113 * math.sqrt(2))
    assert mde(0.25 / 8, 0.025, 0.8) == pytest.approx((1.959964 + 0.841621) * 0.25 / 8, rel=1e-6)


def test_seed_margin_blocks_an_improvement_within_seed_noise():
    """Δ −0.02 bits/byte with a tight CI: promoted on the configured delta 0; not once the record says a seed
    rerun alone moves the suite by sd 0.01 (margin 2.353·0.01·√2 = 0.0333)."""
    suites = [_text("recent", "primary", -0.02)]
    plain = decide_promotion(suites, CFG, "v3", True)
    assert plain.promote and "configured margins are assumed — delta 0, epsilon 0.01" in plain.note
    seeded = decide_promotion(suites, CFG, "v3", True, _spread(recent=0.01))
    d = seeded.suites[0]
    assert not seeded.promote and d.threshold == pytest.approx(-seed_margin(0.01, 4, 0.95))
    assert d.margin_source.startswith("seed spread (k 4") and "seed-spread margin" in seeded.reason
    assert "recent 0.0333 bits/byte" in seeded.note
    # a larger improvement still passes
    assert decide_promotion([_text("recent", "primary", -0.08)], CFG, "v3", True, _spread(recent=0.01)).promote


def test_non_inferiority_margin_is_at_least_the_seed_spread():
    suites = [_text("recent", "primary", -0.2), _text("replay", "regression", 0.015)]
    assert not decide_promotion(suites, CFG, "v3", True).promote          # +0.015 > epsilon 0.01
    v = decide_promotion(suites, CFG, "v3", True, _spread(replay=0.01))   # margin 0.0333: a seed's worth
    assert v.promote and v.suites[1].threshold == pytest.approx(seed_margin(0.01, 4, 0.95))
    assert "recent 0.0000 bits/byte (configured)" in v.note            # recent: not in the record
    md = verdict_markdown(v)
    assert "| margin from | MDE | decides |" in md and "seed spread (k 4" in md
    j = v.to_dict()["suites"][1]
    assert j["n"] == N and j["mde"] > 0 and j["margin"] == pytest.approx(seed_margin(0.01, 4, 0.95))


def test_a_smaller_seed_margin_keeps_the_configured_one():
    v = decide_promotion([_text("recent", "primary", -0.2), _text("replay", "regression", 0.0)],
                         CFG, "v3", True, _spread(replay=0.001))
    assert v.suites[1].threshold == 0.01 and v.suites[1].margin_source.startswith("configured (≥ seed margin")


def _record(path, cfg, **over):
    rec = {"recipe": cfg.name, "config_hash": recipe_hash(cfg), "k": 3, "seeds": [0, 1, 2],
           "suites": {"recent": {"kind": "text", "unit": "bits/byte", "n": 64, "sd": 0.01, "doc_sd": 0.2},
                      "wordorder": {"kind": "task", "unit": "accuracy", "n": 200, "sd": 0.02, "doc_sd": 0.4}}}
    rec.update(over)
    path.write_text(json.dumps(rec))
    return path


def test_record_for_another_recipe_is_refused_naming_both(tmp_path):
    cfg = load_run_config("tiny-cpu", [f"register.promotion.seed_spread={tmp_path / 'r.json'}"])
    _record(tmp_path / "r.json", cfg, recipe="retrain-cpu")
    with pytest.raises(ConfigError, match=r"recipe 'retrain-cpu', this run is recipe 'tiny-cpu'"):
        resolve_seed_spread(cfg)


def test_record_of_another_config_explicit_refused_auto_skipped(tmp_path):
    cfg = load_run_config("tiny-cpu", [f"register.promotion.seed_spread={tmp_path / 'r.json'}"])
    _record(tmp_path / "r.json", cfg)
    assert resolve_seed_spread(cfg)["k"] == 3
    # only the seed differs: the same record applies
    seeded = load_run_config("tiny-cpu", [f"register.promotion.seed_spread={tmp_path / 'r.json'}", "train.seed=7"])
    assert resolve_seed_spread(seeded)["suites"]["recent"]["sd"] == 0.01
    longer = load_run_config("tiny-cpu", [f"register.promotion.seed_spread={tmp_path / 'r.json'}",
                                          "train.max_steps=60"])
    with pytest.raises(ConfigError, match="measured for recipe tiny-cpu with config"):
        resolve_seed_spread(longer)
    missing = load_run_config("tiny-cpu", [f"register.promotion.seed_spread={tmp_path / 'nope.json'}"])
    with pytest.raises(MissingDataError, match="nope.json does not exist"):
        resolve_seed_spread(missing)
    none = resolve_seed_spread(load_run_config("tiny-cpu", ["register.promotion.seed_spread=null"]))
    assert none["suites"] == {} and "seed_spread is null" in none["note"]


def test_power_check_names_a_suite_that_cannot_decide(tmp_path):
    """recent: doc_sd 0.2 bits/byte, n 64, two suites at 95 % (α/m 0.025), power 0.8: MDE (1.960 + 0.842)·0.2/8
    = 0.070 > its margin 0.0200 (seed 2.92·0.01·√2 = 0.0413 ... ) → named; wordorder can decide at n 200."""
    sets = [f"register.promotion.seed_spread={tmp_path / 'r.json'}", "evaluate.recent_max_documents=64"]
    cfg = load_run_config("tiny-cpu", sets)
    _record(tmp_path / "r.json", cfg, suites={
        "recent": {"kind": "text", "unit": "bits/byte", "n": 64, "sd": 0.01, "doc_sd": 0.2},
        "wordorder": {"kind": "task", "unit": "accuracy", "n": 200, "sd": 0.04, "doc_sd": 0.3}})
    rows = {r.suite: r for r in power_table(cfg, resolve_seed_spread(cfg))}
    r = rows["recent"]
    assert r.n == 64 and r.mde == pytest.approx((1.959964 + 0.841621) * 0.2 / 8, rel=1e-5)
    assert r.margin == pytest.approx(seed_margin(0.01, 3, 0.95)) and r.decides is False
    assert r.n_needed == math.ceil(64 * (r.mde / r.need) ** 2)
    w = rows["wordorder"]
    assert w.n == 200 and w.decides is True and w.margin == pytest.approx(seed_margin(0.04, 3, 0.95))
    out = io.StringIO()
    check_power(cfg, out)
    assert "warning: suite recent (n 64) cannot decide" in out.getvalue()
    strict = load_run_config("tiny-cpu", [*sets, "register.promotion.power_check=strict"])
    with pytest.raises(ConfigError, match=r"power_check is strict .* recent \(MDE 0\.07"):
        check_power(strict, io.StringIO())
    assert check_power(load_run_config("tiny-cpu", [*sets, "register.promotion.power_check=off"])) == []
    # no record: recent's n before the data is read is only its cap, and the line says so
    out = io.StringIO()
    check_power(load_run_config("tiny-cpu", ["register.promotion.seed_spread=null"]), out)
    assert "  recent (primary, n ≤ 64): MDE unknown" in out.getvalue()
    assert "  wordorder (task, n 200): MDE unknown" in out.getvalue()


@pytest.mark.parametrize("power_check", ["warn", "off"])
def test_run_refuses_a_record_of_another_recipe_before_any_stage(tmp_path, capsys, power_check):
    """Also with the power check off, which reads no record: not after ingest … train (the evaluate stage)."""
    from packtrain.cli import main
    from packtrain.testing.tiny_corpus import tiny_corpus, tiny_settings

    rec = _record(tmp_path / "r.json", load_run_config("retrain-cpu"))
    work = tmp_path / "work"   # tiny sizes: a regression runs seconds of stages before failing, not minutes
    sets = [*tiny_settings(work, tiny_corpus(tmp_path / "corpus")), f"register.promotion.seed_spread={rec}",
            f"register.promotion.power_check={power_check}"]
    code = main(["run", *(a for s in sets for a in ("--set", s))])
    err = capsys.readouterr().err
    assert code == 2 and "measured for recipe 'retrain-cpu', this run is recipe 'tiny-cpu'" in err
    assert "Traceback" not in err and not list(work.glob("**/ingest"))   # no stage ran (kfp/<run>/ingest)


def test_evaluate_refuses_a_record_of_another_recipe_before_reading_the_model(tmp_path, capsys):
    """`packtrain evaluate` alone (dvc repro, a KFP pod): the record is refused before the model is looked at —
    here there is none (that would be exit 5), so no held-out loss is computed only to be thrown away."""
    from packtrain.cli import main

    rec = _record(tmp_path / "r.json", load_run_config("retrain-cpu"))
    code = main(["evaluate", "--set", f"workdir={tmp_path / 'work'}", "--set", f"register.promotion.seed_spread={rec}",
                 "--model", str(tmp_path / "no-model"), "--packs", str(tmp_path / "no-packs")])
    err = capsys.readouterr().err
    assert code == 2 and "measured for recipe 'retrain-cpu', this run is recipe 'tiny-cpu'" in err
    assert not (tmp_path / "work" / "evaluate").exists()


@pytest.mark.parametrize("action", ["compile", "submit"])
def test_a_cluster_pipeline_refuses_a_record_of_another_recipe_before_it_is_compiled_or_submitted(
        tmp_path, capsys, action):
    """Submitted, the pipeline would train on the cluster and fail at its evaluate step; refused here instead,
    before the host (an unreachable one: exit 1 were it contacted) or the output file. A record this machine
    lacks is the cluster's to read: compiling does not refuse it."""
    from packtrain.cli import main

    rec = _record(tmp_path / "r.json", load_run_config("retrain-cpu"))
    out = tmp_path / "p.yaml"
    where = ["--out", str(out)] if action == "compile" else ["--host", "http://127.0.0.1:1"]
    code = main(["pipeline", action, *where, "--set", f"register.promotion.seed_spread={rec}"])
    err = capsys.readouterr().err
    assert code == 2 and "measured for recipe 'retrain-cpu', this run is recipe 'tiny-cpu'" in err, err
    assert "Traceback" not in err and not out.exists()
    if action == "compile":
        code = main(["pipeline", "compile", "--out", str(out), "--set",
                     f"register.promotion.seed_spread={tmp_path / 'only-on-the-cluster.json'}"])
        assert code == 0 and out.is_file()


@pytest.mark.parametrize("mode", ["local", "cluster"])
def test_the_scheduled_retrain_refuses_a_record_of_another_recipe_in_its_first_task(tmp_path, mode):
    """The Airflow DAG's first task (detect_data_version), before the data is read, ingested or trained on: a
    source that does not exist shows that it was not."""
    from packtrain.pipeline.retrain import detect_data_version

    rec = _record(tmp_path / "r.json", load_run_config("retrain-cpu"))
    cfg = load_run_config("tiny-cpu", [f"workdir={tmp_path / 'work'}", f"pipeline.mode={mode}",
                                       f"ingest.source={tmp_path / 'no-corpus'}",
                                       f"register.promotion.seed_spread={rec}"])
    with pytest.raises(ConfigError, match="measured for recipe 'retrain-cpu', this run is recipe 'tiny-cpu'"):
        detect_data_version(cfg)
    assert not (tmp_path / "work").exists()


def test_run_summary_says_which_margins_were_assumed(tmp_path):
    from packtrain.pipeline.summary import _register, margins_line

    note = "no seed-spread record for recipe my-recipe (x does not exist): the configured margins are assumed"
    (tmp_path / "suites.json").write_text(json.dumps({"seed_spread": {"note": note, "suites": {}}}))
    assert margins_line(str(tmp_path), "not promoted over v1: recent ...") == note
    assert margins_line(str(tmp_path), "first champion: no version held the champion alias") is None
    lines = _register({"model_name": "lm", "version": "2", "alias": "challenger", "reason": "not promoted over v1",
                       "margins": note})
    shown = " ".join(ln.strip() for ln in lines)
    assert shown.endswith(f"not promoted over v1 margins: {note}") and all(len(ln) <= 113 for ln in lines)


def test_run_summary_names_the_margins_assumed_without_a_record(tmp_path):
    """No record for the recipe: the summary's margins line (from the version's tag validation_margins) names the
    values the decision assumed, not only that some were; the evaluate output's note alone does not have them."""
    from packtrain.pipeline.summary import build_summary

    note = "no seed-spread record for recipe my-recipe (x does not exist): the configured margins are assumed"
    (tmp_path / "suites.json").write_text(json.dumps({"seed_spread": {"note": note, "suites": {}}}))
    cfg = PromotionConfig(resamples=500, epsilon=0.03, epsilon_task=0.15)
    v = decide_promotion([_text("recent", "primary", -0.2)], cfg, "v1", True, {"note": note, "suites": {}})
    assert v.margins == f"{note} — delta 0, epsilon 0.03, epsilon_task 0.15 (a rerun differing only in " \
                        "train.seed is not accounted for)"
    register = {"model_name": "lm", "version": "2", "decision": "champion", "reason": v.reason,
                "version_tags": v.tags()}
    summary = build_summary({"register": register, "evaluate": {"output_dir": str(tmp_path)}})
    assert summary["margins"] == v.margins
    first = decide_promotion([_text("recent", "primary", -0.2)], cfg, None, None, {"note": note, "suites": {}})
    assert "validation_margins" not in first.tags()   # no champion compared: no margins decided anything


def test_auto_uses_the_record_of_the_champions_config():
    """A seed rerun trained one step longer: this run's config is not the record's, the champion's is (its version
    tag packtrain.config_hash) → auto uses the record, saying for whose config it was measured."""
    from packtrain.evaluate.seed_spread import default_record_path

    longer = load_run_config("tiny-cpu", ["train.seed=1", "train.max_steps=31"])
    rec = json.loads(default_record_path("tiny-cpu").read_text())
    assert "not used" in resolve_seed_spread(longer)["note"]
    got = resolve_seed_spread(longer, champion=("v1", rec["config_hash"]))
    assert got["k"] == rec["k"] and got["suites"]["recent"]["sd"] == rec["suites"]["recent"]["sd"]
    assert got["note"].endswith(f"measured for v1's config {rec['config_hash']}, this run's config "
                                f"{recipe_hash(longer)} differs)")
    assert "not used" in resolve_seed_spread(longer, champion=("v1", "0123456789abcdef"))["note"]


def test_settings_that_change_how_not_what_leave_the_recipe_hash():
    """A seed rerun with activation checkpointing, compile, another attention backend or fewer tokenizer workers is
    still a seed rerun (WEIGHT_NEUTRAL_FIELDS); what changes the data, the optimisation or the numerics is another
    recipe. Checkpointing keeps loss and gradients bitwise (tests/unit/test_train_techniques.py)."""
    base = recipe_hash(load_run_config("tiny-cpu"))
    neutral = ["train.seed=1", "train.activation_checkpointing=full", "train.compile=true", "train.attention=sdpa",
               "train.loss=chunked", "tokenize.workers=1", "validate.max_offending_ids=3", "train.log_every=5",
               "train.checkpoint.every_steps=10"]
    assert recipe_hash(load_run_config("tiny-cpu", neutral)) == base
    for change in ("train.lr=0.001", "train.precision=bf16", "train.fsdp.reduce_dtype=bf16", "train.rows=8",
                   "tokenize.vocab_size=2048", "validate.min_rows=50", "pack.strategy=sequential"):
        assert recipe_hash(load_run_config("tiny-cpu", [change])) != base, change


def test_the_shipped_record_is_for_the_shipped_recipe():
    """`seed_spread: auto` uses bench/results/seed_spread_tiny-cpu.json only while its config_hash is tiny-cpu's: a
    default or field that changes what the recipe trains leaves the record unused (the run says so) until it is
    measured again (`python -m bench seed-spread --recipe tiny-cpu --seeds 0 1 2`), so a stale one fails here."""
    from packtrain.evaluate.seed_spread import default_record_path

    rec = json.loads(default_record_path("tiny-cpu").read_text())
    got = resolve_seed_spread(load_run_config("tiny-cpu"))
    assert rec["config_hash"] == recipe_hash(load_run_config("tiny-cpu")), got["note"]
    assert got["path"] == str(default_record_path("tiny-cpu")) and got["k"] == rec["k"] >= 3
