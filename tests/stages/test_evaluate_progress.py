"""`packtrain evaluate` shows its progress on the terminal: a bar per (model, suite) in documents — a text
suite's documents, a task suite's items (lm-eval's requests counted as they return) — with its rate and ETA,
and `packtrain run` turns the same bar into its progress lines (packtrain.pipeline.progress; the pipeline's own
line is checked in tests/pipelines/test_local_pipeline.py)."""

from __future__ import annotations

import re

import numpy as np

from packtrain.cli import main
from packtrain.pipeline.progress import Progress, format_bar, parse_bar
from packtrain.testing.tiny_model import build_tiny_model_dir, write_tiny_packs

TEXTS = ["def f(x):\n    return x\n", "import os\n", "The cat sat on the mat."] * 6


def test_standalone_evaluate_draws_a_bar_per_suite_in_documents(tmp_path, capfd, monkeypatch):
    """... and says nothing else: run outside a git checkout, no "fatal: not a git repository" (lm-eval's `git
    describe`), no torchao CPU-build or torch _pytree messages (packtrain.log_noise)."""
    monkeypatch.chdir(tmp_path)   # not a git checkout
    model = build_tiny_model_dir(tmp_path / "model", TEXTS)
    rng = np.random.default_rng(0)
    write_tiny_packs(tmp_path / "packs" / "eval", [rng.integers(0, 250, size=20) for _ in range(7)], budget=32)
    from torch.utils import collect_env

    collect_env_calls: list[int] = []
    monkeypatch.setattr(collect_env, "get_pretty_env_info", lambda: collect_env_calls.append(1) or "")
    capfd.readouterr()   # the set-up's own output (building the model imported torchao before any filter)
    code = main(["evaluate", "--model", str(model), "--packs", str(tmp_path / "packs"), "--out", str(tmp_path / "ev"),
                 "--set", f"workdir={tmp_path / 'work'}", "--set", "tracking.enabled=false",
                 "--set", "evaluate.against=none", "--set", "evaluate.sample_tokens=2",
                 "--set", "evaluate.suites=[{name: wordorder, role: task, "
                          "path: '@recipes/tasks/wordorder/wordorder.yaml', max_documents: 16}]"])
    err = capfd.readouterr().err   # the process's fd 2 too: git's stderr reaches it directly
    assert code == 0, err[-3000:]
    for noise in ("fatal: not a git repository", "Failed to load", "_pytree", "Enum subclass",
                  "Overwriting default num_fewshot", "Passed an already-initialized model"):
        assert noise not in err, (noise, err[-3000:])
    # lm-eval's environment report (torch.utils.collect_env: `pip list` and a dozen probes, ~1.9 s a suite) not run
    assert collect_env_calls == []
    # tqdm's frames ("\r"-separated): the last frame of each suite's bar, as a terminal shows it once it ends
    frames = [parse_bar(f) for f in re.split(r"[\r\n]", err)]
    bars = [b for b in frames if b and b["desc"] == "evaluate" and b["unit"] == "doc"]
    bars = [b for b in bars if "suite" in b["postfix"]]   # (its first frame is drawn before the postfix is set)
    final = {b["postfix"]["suite"]: b for b in bars}   # the last frame of each suite wins
    assert set(final) == {"recent (challenger) 1/2", "wordorder (challenger) 2/2"}, sorted(final)
    assert (final["recent (challenger) 1/2"]["n"], final["recent (challenger) 1/2"]["total"]) == (7, 7)
    assert (final["wordorder (challenger) 2/2"]["n"], final["wordorder (challenger) 2/2"]["total"]) == (16, 16)
    task = [b["n"] for b in bars if b["postfix"]["suite"].startswith("wordorder")]
    # items counted as lm-eval's requests return: never backwards, ending at the suite's size (how many
    # frames a fast machine draws in between depends on its speed: lm-eval may answer a batch at once)
    assert task == sorted(task) and task[-1] == 16, task
    assert "Running loglikelihood requests" not in err   # lm-eval's own request bar is off: the stage's says it
    # what `packtrain run` prints for a frame of that bar. How many unfinished frames a machine draws depends on
    # its speed (lm-eval may answer all 16 items in one batch: only the first and the last frame): each unfinished
    # frame drawn becomes a line; the finished one becomes none (the stage's end line says it), and its text is
    # still read into the same line shape, ending at 16/16.
    drawn = [f for f in re.split(r"[\r\n]", err) if (b := parse_bar(f)) and b["unit"] == "doc"
             and b["postfix"].get("suite", "").startswith("wordorder") and b["n"] > 0]
    shape = (r"docs (\d+)/16 \(\d+%\) · suite wordorder \(challenger\) 2/2 · [\d.,]+ docs/s · "
             r"\d+:\d\d elapsed · ETA \d+:\d\d")
    for frame in drawn:
        line = Progress(0).line(frame, "evaluate")
        if parse_bar(frame)["n"] < 16:
            assert line is not None and re.fullmatch(shape, line), (frame, line)
        else:
            assert line is None, (frame, line)
    last = format_bar(parse_bar(drawn[-1]), "evaluate")
    assert (m := re.fullmatch(shape, last)) and m[1] == "16", last


def test_progress_line_of_a_slow_bar_in_seconds_per_unit():
    bar = parse_bar("evaluate:   1%|          | 2/200 [00:07<11:33,  3.50s/doc, suite=wordorder (champion) 4/4]")
    assert format_bar(bar, "evaluate") == \
        "docs 2/200 (1%) · suite wordorder (champion) 4/4 · 0.29 docs/s · 0:07 elapsed · ETA 11:33"
    train = parse_bar("    train:  33%|███▎      | 2/6 [00:12<00:24,  0.17step/s, loss=5.3648, tok_s=10,233]")
    assert format_bar(train, "train") == "step 2/6 (33%) · loss 5.3648 · 10,233 tok/s · 0:12 elapsed · ETA 0:24"


def test_known_library_noise_is_dropped_at_its_logger_and_nothing_else(caplog):
    import logging

    from packtrain.log_noise import silence_known_noise

    silence_known_noise()
    so = "Failed to load /venv/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: Could not load"
    with caplog.at_level(logging.WARNING):
        logging.getLogger("torchao").warning(so)
        logging.getLogger("torch.utils._pytree").warning("<enum 'KernelPreference'> is an Enum subclass and is now "
                                                         "natively supported by torch.compile as an opaque value type")
        logging.getLogger("torchao").warning("Float8Linear: a real problem")
        logging.getLogger("lm_eval.evaluator").warning("Overwriting default num_fewshot of t from None to 0")
        logging.getLogger("lm_eval.evaluator").warning("task t: 3 documents dropped")
    assert [r.getMessage() for r in caplog.records] == ["Float8Linear: a real problem", "task t: 3 documents dropped"]


def test_packtrains_own_warnings_print_as_one_line_and_others_keep_pythons_format(monkeypatch):
    """A telemetry threshold crossed, seen by a user of `packtrain train`: `warning: <message>`, not the file, line
    and source line that raised it; a warning of another package keeps Python's format (it names its source)."""
    import warnings

    from packtrain import log_noise
    from packtrain.telemetry import thresholds

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)   # put back after the test
    log_noise.plain_own_warnings()
    log_noise.plain_own_warnings()   # installed once: a second call wraps nothing
    own = warnings.formatwarning(thresholds.TelemetryWarning("telemetry threshold violated: utilization: 0.4 < 0.9"),
                                 thresholds.TelemetryWarning, thresholds.__file__, 48)
    assert own == "warning: telemetry threshold violated: utilization: 0.4 < 0.9\n"
    other = warnings.formatwarning(UserWarning("x is deprecated"), UserWarning, warnings.__file__, 1, "line one")
    assert other == f"{warnings.__file__}:1: UserWarning: x is deprecated\n  line one\n"
    sibling = str(log_noise._PACKAGE) + "_plugins/x.py"   # a package beside packtrain's whose name starts with it
    assert warnings.formatwarning(UserWarning("y"), UserWarning, sibling, 2, "") == f"{sibling}:2: UserWarning: y\n"
