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
