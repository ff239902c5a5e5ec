"""packtrain: an LM training pipeline built for full GPU utilization.

ingest → validate → tokenize → pack → train → evaluate → register, each a pure library function with thin
adapters (CLI, KFP component, DVC stage, Airflow task) that share one stage name.
"""

__version__ = "0.1.0"

from packtrain.stages.table import STAGE_NAMES as STAGES  # noqa: E402  (the stage table: packtrain.stages.table)

__all__ = ["STAGES", "__version__"]
