"""One thin KFP lightweight component per stage; each body only calls `packtrain.pipeline.runtime`.

    ingest → validate → tokenize → pack → train → evaluate → register

Every component takes the whole RunConfig as ONE string parameter (`config`, JSON of
`RunConfig.to_dict()`), passes KFP artifact paths as the stage's input/output directories, puts the stage
stats into its output artifact's metadata and a `Metrics` artifact, and returns the stats as JSON.
`install_kfp_package=False` and no `packages_to_install`: kfp and packtrain are already in the image, and
under `kfp.local.SubprocessRunner(use_venv=False)` the body runs in the current venv.
"""

from components.evaluate import evaluate
from components.ingest import ingest
from components.pack import pack
from components.register import register
from components.tokenize import tokenize
from components.train import train
from components.validate import validate

COMPONENTS = {
    "ingest": ingest,
    "validate": validate,
    "tokenize": tokenize,
    "pack": pack,
    "train": train,
    "evaluate": evaluate,
    "register": register,
}

__all__ = ["COMPONENTS", *COMPONENTS]
