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
    publish@N            SIGKILL at the N-th point of a stage's publish (packtrain.publish.publish_dir: staged,
                         synced, moved-old, swapped, removing-old); publish.raise@N raises there instead;
                         publish.no_exchange forces the two-rename fallback
    replay.before_record@N / replay.after_record@N   SIGKILL around recording the N-th applied op id
                         (packtrain.tracking.replay)
    register.model_logged  SIGKILL after a buffered registration logged its model, before the version exists
    register.version_registered  SIGKILL after the version exists, before its alias is set

Points that take steps and a value, `name@STEPS=VALUE` with STEPS `N`, `N-M` or `N-` (N on), read by
`fault_arg(name, step)` (the utilization guard's tests, docs/guard.md):

    train.slow_data@N-=SEC   the loop waits SEC more for each micro-batch, as if the loader were throttled
                             (train.slow_data_rankR: on rank R only, a straggler)
    train.slow_step@N=SEC    the step takes SEC longer (a stall inside the step: the hang watchdog;
                             train.slow_step_rankR: on rank R only)
    train.recompile@N        the step runs one extra forward without gradients first: a real dynamo guard
                             failure (grad mode) that recompiles the compiled layers (train.compile)
    train.alloc_retry@N      the guard reads one more CUDA allocator retry than torch counts at that step (a
                             CPU run has no caching allocator to make retry)
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



def fault_arg(name: str, step: int | None = None) -> str | None:
    """The value of the entry `name[@STEPS][=VALUE]` that applies at `step`: the text after `=` ("" without one),
    None when no entry does. STEPS: `N` (step N), `N-M` (N to M), `N-` (N on); no STEPS: every step.

    >>> os.environ[FAULT_ENV] = "train.slow_data@10-12=0.5,train.recompile@7,train.alloc_retry@3-"
    >>> fault_arg("train.slow_data", 11), fault_arg("train.slow_data", 13), fault_arg("train.recompile", 7)
    ('0.5', None, '')
    >>> fault_arg("train.alloc_retry", 2), fault_arg("train.alloc_retry", 300)
    (None, '')
    >>> del os.environ[FAULT_ENV]
    """
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    for entry in spec.split(","):
        point, _, value = entry.partition("=")
        key, at, steps = point.partition("@")
        if key != name:
            continue
        if not at:
            return value
        lo, dash, hi = steps.partition("-")
        first = int(lo)
        last = (int(hi) if hi else None) if dash else first
        if step is not None and first <= step and (last is None or step <= last):
            return value
    return None
