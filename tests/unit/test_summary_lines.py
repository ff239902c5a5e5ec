"""The run summary says how much of the held-out split the perplexity is, where the run's files are, and that the
machine was busy when other processes took its CPU while training."""

from __future__ import annotations

from packtrain.pipeline.summary import format_summary
from packtrain.telemetry.sampler import SystemSampler


def _summary(**s) -> str:
    return format_summary("tiny-cpu", {"cached": [], **s}, 1.0, 7, None)


def test_evaluate_line_says_how_many_held_out_batches():
    capped = _summary(perplexity=10.0, eval_loss=2.3, eval_batches=1, eval_batches_epoch=24)
    assert "perplexity 10.00 (loss 2.300) on 1 of 24 held-out batches" in capped
    whole = _summary(perplexity=10.0, eval_loss=2.3, eval_batches=24, eval_batches_epoch=24)
    assert "on 24 of 24 held-out batches" in whole


def test_outputs_line_names_model_checkpoints_log_and_samples(tmp_path):
    train = tmp_path / "run" / "train" / "model"
    ev = tmp_path / "run" / "evaluate" / "evaluation"
    for p in (train / "model", train / "checkpoints", ev):
        p.mkdir(parents=True)
    (train / "train_log.jsonl").write_text("{}\n")
    (ev / "samples.json").write_text("[]")
    text = _summary(train_dir=str(train), evaluate_dir=str(ev))
    assert f"  outputs    {tmp_path / 'run'}/" in text
    assert ("model train/model/model · checkpoints train/model/checkpoints · train log train/model/train_log.jsonl · "
            "samples evaluate/evaluation/samples.json") in text


def test_busy_machine_is_said_from_the_samplers_numbers():
    s = SystemSampler(1.0, backend="cpu")
    s.samples = [{"t": float(t), "util": 50.0, "sys_util": 99.0, "mem_used_gib": 1.0} for t in range(4)]
    sys_ = s.summary()
    assert abs(sys_["system_cpu_mean"] - 0.99) < 1e-9 and abs(sys_["others_cpu_mean"] - 0.49) < 1e-9
    busy = _summary(tokens_per_s=2000.0, utilization=0.5, utilization_kind="cpu", others_cpu=sys_["others_cpu_mean"])
    assert "machine busy: other processes used 49% of its CPU while this run trained" in busy
    idle = _summary(tokens_per_s=2000.0, utilization=0.95, utilization_kind="cpu", others_cpu=0.03)
    assert "machine busy" not in idle


def test_dvc_line_names_the_remote_or_how_to_set_one():
    md5 = "9c8dd45e9c598fb8645bcdef6aca14bd"
    pushed = _summary(dataset={"md5": md5, "repo": "/c", "remote": "s3://bucket/packtrain", "legacy": None})
    assert pushed.splitlines()[1:] == [f"  dvc        documents md5 {md5} in DVC remote s3://bucket/packtrain"]
    cached = _summary(dataset={"md5": md5, "repo": "/c", "remote": None, "legacy": None})
    assert cached.splitlines()[1:] == [
        f"  dvc        documents md5 {md5} in the DVC cache of /c (no default remote: dvc remote add -d NAME URL)"]


def test_promotion_reason_is_wrapped_between_words_never_cut():
    reason = ("not promoted: suite recent (primary) bits/byte 2.345678 → 2.351234, Δ +0.005556 (95% CI "
              "[+0.001234, +0.009876]) is worse than the allowed 0.000000; suite wordorder (task) acc 0.5150 → "
              "0.5200, Δ +0.0050 within ε 0.0200; 2 suites scored against packtrain-lm v3 (champion)")
    text = _summary(version="4", model_name="packtrain-lm", alias=None, reason=reason)
    lines = text.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("  register   packtrain-lm v4"))
    shown = []
    for ln in lines[first + 1:]:
        if not ln.startswith("             ") or not ln.strip():
            break
        shown.append(ln.strip())
    assert " ".join(shown) == reason, shown          # every word, every number, in order
    assert len(shown) > 1 and all(len(ln) <= 100 for ln in shown) and "…" not in text


def test_validate_line_counts_what_the_contamination_check_dropped():
    s = _summary(validation_success=True, expectations=13, expectations_passed=12, contaminated=17,
                 contamination_checked=1409, contamination_policy="drop")
    assert ("validate   passed (12/13 expectations; 1 non-blocking) · contamination: 17 of 1,409 training documents hold an eval "
            "document, dropped") in s
    clean = _summary(validation_success=True, expectations=12, expectations_passed=12, contaminated=0,
                     contamination_checked=1409, contamination_policy="drop")
    assert "contamination: 0 of 1,409 training documents hold an eval document\n" in clean + "\n"
    assert "contamination" not in _summary(validation_success=True, expectations=11, expectations_passed=11)
