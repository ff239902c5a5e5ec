"""The KFP components as kfp runs them: a component's command removes the folder it writes the program into,
whatever the program's exit status (kfp's command alone leaves one `tmp.*` folder per task in $TMPDIR).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from pipeline_helpers import REPO


@pytest.mark.parametrize("code", [0, 3])
def test_component_command_removes_its_program_folder(tmp_path, code):
    """The pack component's real command, with a program that exits `code`: the shell exits `code` too, and the
    folder it wrote the program into is gone (kfp's command alone leaves it in $TMPDIR)."""
    from packtrain.components import COMPONENTS

    sh, flag, script, _source = COMPONENTS["pack"].component_spec.implementation.container.command
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = subprocess.run([sh, flag, script.replace("python3", sys.executable), f"import sys; sys.exit({code})",
                        "--executor_input", "{}", "--function_to_execute", "pack"], env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True, text=True, timeout=120)
    assert r.returncode == code, r.stdout + r.stderr
    assert list(tmp.iterdir()) == []


def test_every_compiled_component_removes_its_program_folder():
    """The committed IR (what a cluster runs) has the removal in every executor's command."""
    spec = next(yaml.safe_load_all((REPO / "pipelines" / "packtrain_pipeline.yaml").read_text(encoding="utf-8")))
    executors = spec["deploymentSpec"]["executors"]
    assert len(executors) == 7
    for name, ex in executors.items():
        script = ex["container"]["command"][2]
        assert script.startswith("program_path=$(mktemp -d)\ntrap 'rm -rf \"$program_path\"' EXIT\n"), (name, script)
