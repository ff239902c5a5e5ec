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
"""

from importlib import import_module

from packtrain.stages.table import STAGE_NAMES

COMPONENTS = {name: getattr(import_module(f"packtrain.components.{name}"), name) for name in STAGE_NAMES}
"""Stage name → its component, in DAG order."""

__all__ = ["COMPONENTS"]
