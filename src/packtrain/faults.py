"""Fault injection for the reliability tests: named points where a test can make packtrain die or misbehave.

    PACKTRAIN_FAULT=checkpoint.manifest packtrain train ...     # SIGKILL right after manifest.json is written
    PACKTRAIN_FAULT=train.nan_loss@12 packtrain train ...        # step 12's loss reads as NaN

`kill_point(name)` SIGKILLs this process when PACKTRAIN_FAULT names `name` (a comma-separated list may name
several); `active(name)` says whether it is named. Unset (always, outside tests) they cost one dict lookup.
The points in the code:

    checkpoint.payload   weights + optimizer written into .tmp-step_N/, before rng.pt/state.json
    checkpoint.manifest  manifest.json written, before the rename to step_N
    checkpoint.renamed   step_N in place, before the retention policy prunes older ones
    model.saved          model/ written into .model.tmp, before the rename to model/
    train.nan_loss@N     (not a kill) step N's loss is NaN, as if the run diverged there
    publish@N            SIGKILL at the N-th point of a stage's publish (packtrain.paths.publish_dir: staged,
                         synced, moved-old, swapped, removing-old); publish.raise@N raises there instead;
                         publish.no_exchange forces the two-rename fallback
    replay.before_record@N / replay.after_record@N   SIGKILL around recording the N-th applied op id
                         (packtrain.tracking.replay)
    register.model_logged  SIGKILL after a buffered registration logged its model, before the version exists
"""

from __future__ import annotations

import os
import signal

FAULT_ENV = "PACKTRAIN_FAULT"


def active(name: str) -> bool:
    spec = os.environ.get(FAULT_ENV)
    return bool(spec) and name in (spec or "").split(",")


def kill_point(name: str) -> None:
    """Die here, as `kill -9` would, when the test asked for this point."""
    if active(name):
        os.kill(os.getpid(), signal.SIGKILL)
