"""Who owns a stage run while it is RUNNING, and ending the runs whose owner is gone.

A stage run (packtrain.tracking.run_lifecycle.stage_run) is ended FINISHED/FAILED/KILLED by the process that opened it,
in a `finally`. A process killed with SIGKILL (a scheduler, the OOM killer, `kill -9`) never gets there, so its
run would stay RUNNING in MLflow forever. Every stage run therefore records its owner as tags:

    packtrain.owner.pid      4242
    packtrain.owner.host     node-3             socket.gethostname()
    packtrain.owner.started  81234567           the process's start, clock ticks since boot (/proc/<pid>/stat
                                                field 22): a later process that got the same pid differs here
    packtrain.owner.boot     6f1c…              /proc/sys/kernel/random/boot_id
    packtrain.owner.pidns    pid:[4026531836]   the pid namespace: containers can share a host name

and each new stage run, once created, ends the RUNNING stage runs of its experiment whose owner is provably gone
(`end_orphaned_runs`; after the create, so a store that is down costs no extra timeout: the client buffers and
the search is skipped): same host, boot and pid namespace as this process, and no process with that pid and
start time. Such a run becomes KILLED (end time: when it was noticed) with the tag

    packtrain.end_reason     "its process (pid 4242 on node-3) is gone: killed (SIGKILL, OOM) or crashed
                             before it could end the run; marked KILLED by pid 4300 opening stage train"
                             (or "... opening pipeline run" when a new `packtrain run` starts)

and a note on stderr. Whatever cannot be decided from here is left RUNNING: a run of another host, container
or boot (another machine may share the host name), a run without owner tags (made by an older packtrain), and,
while the buffer still holds ops, a run that was created from the buffer (its own replayed ops may still end it).
On a system without /proc (not Linux) nothing is ever marked. The pipeline's parent run opened by `packtrain run`
(packtrain.tracking.run_lifecycle.start_pipeline_run) carries the same owner tags — the process that opens it ends it — and
opening one sweeps too, so a killed `packtrain run` leaves neither its stage run nor its pipeline run RUNNING. The
parent run of a KFP run on a cluster has none: it is opened by one component and ended by another.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

PID, HOST, STARTED, BOOT, PIDNS = (f"packtrain.owner.{k}" for k in ("pid", "host", "started", "boot", "pidns"))
REASON = "packtrain.end_reason"
_SAME = (HOST, BOOT, PIDNS)   # an owner is judged only from the same host, boot and pid namespace


def process_start(pid: int) -> str | None:
    """Start time of process `pid` in clock ticks since boot (/proc/<pid>/stat field 22), None when there is
    no such process (or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()   # after "pid (comm) ": field 3 (state) is fields[0]
    return fields[19] if len(fields) > 19 else None


@functools.lru_cache(maxsize=1)
def _here() -> dict[str, str]:
    out = {HOST: socket.gethostname()}
    try:
        out[BOOT] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        out[PIDNS] = os.readlink("/proc/self/ns/pid")
    except OSError:
        pass
    return out


def owner_tags() -> dict[str, str]:
    """The owner tags of a run opened by this process (module doc); only the host where /proc is missing."""
    tags = {**_here(), PID: str(os.getpid())}
    started = process_start(os.getpid())
    if started is not None:
        tags[STARTED] = started
    return tags


def owner_gone(tags: Mapping[str, str], here: Mapping[str, str], start_of: Callable[[int], str | None]) -> bool:
    """True only when the run's owner (`tags`) was on this host, boot and pid namespace (`here`) and no process
    with its pid and start time lives now (`start_of(pid)`: the start time of the process that has that pid
    now, None when none has).

    >>> here = {HOST: "n1", BOOT: "b1", PIDNS: "pid:[1]"}
    >>> run = {**here, PID: "42", STARTED: "700"}
    >>> [owner_gone(run, here, lambda pid: s) for s in (None, "700", "900")]   # gone, alive, pid reused
    [True, False, True]
    >>> owner_gone({**run, HOST: "n2"}, here, lambda pid: None)   # another host: cannot tell
    False
    """
    pid = str(tags.get(PID, ""))
    if not pid.isdigit() or any(not tags.get(k) or tags.get(k) != here.get(k) for k in _SAME):
        return False
    now = start_of(int(pid))
    return now is None or (bool(tags.get(STARTED)) and now != tags.get(STARTED))


def end_orphaned_runs(client: Any, experiment: str, opening: str) -> list[str]:
    """Mark KILLED (with packtrain.end_reason) the RUNNING runs of `experiment` whose owner is gone (module doc);
    `client` is the stage's BufferedClient, `opening` what is about to open a run ("stage train", "pipeline run"). Returns their ids. Never
    fails a stage: a store that cannot be searched now is left as it is."""
    from packtrain.tracking.store_ops import PENDING_TAG
    from packtrain.tracking.transport import short_http

    here = _here()
    if client.down or BOOT not in here:
        return []
    host = here[HOST].replace("'", "\\'")
    try:
        with short_http(client.uri, 5):
            exp = client._client.get_experiment_by_name(experiment)
            runs = [] if exp is None else client._client.search_runs(
                [exp.experiment_id], f"attributes.status = 'RUNNING' and tags.`{HOST}` = '{host}'", max_results=200)
    except Exception:   # unreachable, locked, no such table yet: try again at the next stage
        return []
    buffering = any(client.buffer_dir.glob("[0-9]*-*.jsonl"))   # buffer files not replayed yet
    ended = []
    for run in runs:
        tags = run.data.tags
        if (buffering and PENDING_TAG in tags) or not owner_gone(tags, here, process_start):
            continue
        rid, name = run.info.run_id, run.info.run_name
        reason = (f"its process (pid {tags[PID]} on {tags[HOST]}) is gone: killed (SIGKILL, OOM) or crashed before "
                  f"it could end the run; marked KILLED by pid {os.getpid()} opening {opening} at "
                  f"{time.strftime('%Y-%m-%dT%H:%M:%S')}")
        client.log_batch(rid, tags={REASON: reason})
        client.set_terminated(rid, "KILLED")
        print(f"note: MLflow run {rid} ({name}) was still RUNNING but {reason}", file=sys.stderr)
        ended.append(rid)
    return ended
