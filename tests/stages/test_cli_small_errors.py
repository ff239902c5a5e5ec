"""Small command-line refusals: each a clear `error:` line naming what was looked at, a non-zero exit, and
nothing created or changed."""

from __future__ import annotations

from packtrain.cli import main


def test_train_resume_with_nothing_to_resume_is_an_error_naming_the_path(tmp_path, capsys):
    """A typo'd --out with --resume used to warn and start from step 0 (exit 0): now exit 5, naming the
    directory it looked in, and nothing is written there."""
    typo = tmp_path / "trian"
    code = main(["train", "--resume", "--out", str(typo), "--set", f"workdir={tmp_path / 'wd'}"])
    err = capsys.readouterr().err
    assert code == 5, err
    assert err.startswith(f"error: --resume: nothing to resume: {typo} does not exist"), err
    assert "run without --resume to start from step 0" in err
    assert not typo.exists()
    typo.mkdir()   # an empty output directory is nothing to resume either (an interrupted run leaves a trace)
    assert main(["train", "--resume", "--out", str(typo), "--set", f"workdir={tmp_path / 'wd'}"]) == 5
    assert f"{typo} is empty" in capsys.readouterr().err
    assert not any(typo.iterdir())


def test_run_refuses_a_lora_recipe_that_could_not_be_registered_before_any_stage(tmp_path, capsys):
    """`packtrain run` ends by registering, and the registry holds merged models: a LoRA run without
    train.adapter.save_merged used to train, evaluate, then fail at register. Now exit 2 before any stage, naming
    the setting; no stage writes anything. With save_merged the same settings pass this check (the run is
    tests/stages/test_sft_lora.py's)."""
    wd = tmp_path / "wd"
    code = main(["run", "--recipe", "tiny-cpu", "--set", f"workdir={wd}", "--set", "train.adapter.type=lora"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "train.adapter.save_merged=true" in err and "train.adapter.type=lora" in err, err
    # no stage ran: the workdir holds at most the CLI's lock file (packtrain.pipeline.lock), taken before any command
    assert {p.name for p in wd.rglob("*")} <= {".packtrain.lock"}, sorted(wd.rglob("*"))
    from packtrain.config import load_run_config
    from packtrain.registry.adapter import check_registrable

    check_registrable(load_run_config("tiny-cpu", [f"workdir={wd}", "train.adapter.type=lora",
                                                   "train.adapter.save_merged=true"]))
