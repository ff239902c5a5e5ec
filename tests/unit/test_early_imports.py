"""packtrain run's import thread (packtrain.pipeline.early_imports): modules imported ahead, a failing one skipped,
what the imports print kept for the run's log instead of the terminal."""

from __future__ import annotations

import io
import sys

from packtrain.pipeline import early_imports


def test_imports_ahead_keep_their_output_for_the_log(tmp_path, monkeypatch, capsys):
    (tmp_path / "pt_early_loud.py").write_text(
        "import logging, sys\nprint('loud at import', file=sys.stderr)\nlogging.getLogger('x').warning('w')\n")
    (tmp_path / "pt_early_broken.py").write_text("raise ImportError('no such kernel')\n")
    (tmp_path / "pt_early_quiet.py").write_text("VALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in ("pt_early_loud", "pt_early_broken", "pt_early_quiet"):
        monkeypatch.delitem(sys.modules, m, raising=False)

    def broken() -> None:
        import pt_early_broken  # noqa: F401

    def loud_and_quiet() -> None:
        import pt_early_loud  # noqa: F401
        import pt_early_quiet  # noqa: F401

    t = early_imports.start_early_imports((broken, loud_and_quiet))
    assert t is not None
    t.join(30)
    print("the main thread's own line", file=sys.stderr)
    assert "pt_early_loud" in sys.modules and sys.modules["pt_early_quiet"].VALUE == 3   # past the broken one
    assert "pt_early_broken" not in sys.modules
    err = capsys.readouterr().err
    assert "the main thread's own line" in err and "loud at import" not in err
    log = io.StringIO()
    early_imports.drain(log)
    assert "loud at import" in log.getvalue()
    early_imports.drain(log := io.StringIO())
    assert log.getvalue() == ""   # drained once
    assert early_imports.start_early_imports(()) is None   # nothing to import: no thread


def test_the_early_imports_follow_the_recipe():
    from packtrain.config import load_run_config

    cpu = early_imports.early_imports(load_run_config("tiny-cpu"))
    gpu = early_imports.early_imports(load_run_config("350m-h200"))
    assert early_imports.import_compiler not in cpu and early_imports.import_compiler in gpu
    assert cpu[0] is gpu[0] is early_imports.import_model_stack


def test_the_model_stack_imports():
    """Every module the thread imports exists (a renamed one would only be skipped, silently)."""
    early_imports.import_model_stack()
    assert "packtrain.train.session" in sys.modules and "transformers.models.llama.modeling_llama" in sys.modules
