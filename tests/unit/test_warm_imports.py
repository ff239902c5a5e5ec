"""packtrain run's import thread (packtrain.pipeline.warm): modules imported ahead, a failing one skipped, what the
imports print kept for the run's log instead of the terminal."""

from __future__ import annotations

import io
import sys

from packtrain.pipeline import warm


def test_imports_ahead_keep_their_output_for_the_log(tmp_path, monkeypatch, capsys):
    (tmp_path / "pt_warm_loud.py").write_text(
        "import logging, sys\nprint('loud at import', file=sys.stderr)\nlogging.getLogger('x').warning('w')\n")
    (tmp_path / "pt_warm_broken.py").write_text("raise ImportError('no such kernel')\n")
    (tmp_path / "pt_warm_quiet.py").write_text("VALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in ("pt_warm_loud", "pt_warm_broken", "pt_warm_quiet"):
        monkeypatch.delitem(sys.modules, m, raising=False)
    t = warm.start_warm_imports(("pt_warm_broken", "pt_warm_loud", "pt_warm_quiet"))
    assert t is not None
    t.join(30)
    print("the main thread's own line", file=sys.stderr)
    assert "pt_warm_loud" in sys.modules and sys.modules["pt_warm_quiet"].VALUE == 3   # past the broken one
    assert "pt_warm_broken" not in sys.modules
    err = capsys.readouterr().err
    assert "the main thread's own line" in err and "loud at import" not in err
    log = io.StringIO()
    warm.drain(log)
    assert "loud at import" in log.getvalue()
    warm.drain(log := io.StringIO())
    assert log.getvalue() == ""   # drained once
    assert warm.start_warm_imports(("pt_warm_quiet",)) is None   # nothing left to import: no thread


def test_the_warm_list_follows_the_recipe():
    from packtrain.config import load_run_config

    cpu, gpu = warm.warm_modules(load_run_config("tiny-cpu")), warm.warm_modules(load_run_config("350m-h200"))
    assert "torch._inductor.compile_fx" not in cpu and "torch._inductor.compile_fx" in gpu
    assert set(warm.MODULES) <= set(cpu)
