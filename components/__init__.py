"""One thin KFP lightweight component per stage of the stage table (packtrain.stages.table); each body only
calls `packtrain.pipeline.runtime`. Installed as `packtrain.components` (pyproject maps this directory there).

    ingest → validate → tokenize → pack → train → evaluate → register

Component `<stage>` lives in `<stage>.py`; its artifact parameters are the table's names: one `Input[...]` per
entry of `inputs` and one `Output[...]` named `output` (documents, validation, tokens, packs, model, evaluation,
registration), plus a `Metrics` artifact. Every component takes the whole RunConfig as ONE string parameter
(`config`, JSON of `RunConfig.to_dict()`), puts the stage stats into its output artifact's metadata and the
`Metrics` artifact, and returns the stats as JSON. `install_kfp_package=False` and no `packages_to_install`:
kfp and packtrain (the wheel) are already in the image, and under `kfp.local.SubprocessRunner(use_venv=False)`
the body runs in the current venv.

kfp's command for a lightweight component writes the component's source into a `mktemp -d` folder and never
removes it: one `tmp.*` folder per task in $TMPDIR (every `packtrain run --runner kfp` left seven). Each
component's command therefore removes it when its shell exits, whatever the exit status (`trap ... EXIT`).
"""

from importlib import import_module

from packtrain.stages.table import STAGE_NAMES

_MKTEMP = "program_path=$(mktemp -d)\n"
_CLEANUP = _MKTEMP + "trap 'rm -rf \"$program_path\"' EXIT\n"


def remove_program_dir_at_exit(component):
    """The component with its command's program folder removed at exit (module doc); idempotent."""
    container = component.component_spec.implementation.container
    script = container.command[2]
    if _CLEANUP not in script:
        if _MKTEMP not in script:   # kfp changed its command: the folder needs another way out
            raise RuntimeError(f"component {component.name}: no `{_MKTEMP.strip()}` in its command {script!r}")
        container.command[2] = script.replace(_MKTEMP, _CLEANUP, 1)
    return component


COMPONENTS = {name: remove_program_dir_at_exit(getattr(import_module(f"packtrain.components.{name}"), name))
              for name in STAGE_NAMES}
"""Stage name → its component, in DAG order."""

__all__ = ["COMPONENTS"]
