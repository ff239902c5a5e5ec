"""`Watchdog`: a daemon thread that flags a training step running longer than `hang_s`.

The loop marks where it is (`begin(step, "data")` before it fetches a step's micro-batches, `begin(step, "step")`
before forward/backward, `done(step)` when its numbers are recorded, `phase("sync")` while the guard waits for the
other ranks' numbers, `idle()` around checkpoints and evaluations, which are not steps); each mark is one or two
attribute writes. The thread wakes every min(hang_s / 4, 1 s) and, when the open step is older than `hang_s`,
records a `Hang` (once per step) and calls `on_hang`; with `exit_after_s` set, a step still open after that long
ends the process (`os._exit(exit_code)`: a stuck collective or kernel cannot be checkpointed; the last checkpoint is
the resume point).

Several ranks: each rank's thread writes its heartbeat, `<dir>/rank-<r>.json` = {"rank", "step", "phase",
"open_s", "done_step", "time"}, every poll and when it flags a hang, so the rank that reports a hang names
every rank's last step and phase (the stuck one: the rank with the fewest steps done, or still in "data" while the
others wait), even when no collective can run. On one node the ranks share the directory; on several, each node sees its own ranks.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Hang:
    """A step the watchdog saw open longer than hang_s."""

    step: int
    phase: str                      # "data" (waiting for its micro-batches) or "step" (compute / collectives)
    open_s: float                   # how long it had been open when flagged
    rank: int = 0
    ranks: list[dict] = field(default_factory=list)   # every rank's heartbeat (several ranks)

    def stuck(self) -> str:
        """Which rank holds the run, from the heartbeats: 'rank 1 in data at step 13 for 12.0 s, last step done 12
        (ranks 0 in sync 13)'; this rank's own phase when there is no other rank."""
        if len(self.ranks) < 2:
            return f"rank {self.rank} in {self.phase} at step {self.step} for {self.open_s:.1f} s"
        low = min(self.ranks, key=stuck_order)
        rest = [b for b in self.ranks if b is not low]
        return (f"rank {low['rank']} in {low.get('phase')} at step {low.get('step')} for {low.get('open_s', 0):.1f} s,"
                f" last step done {low.get('done_step')} (ranks {', '.join(str(b['rank']) for b in rest)} in "
                f"{', '.join(sorted({str(b.get('phase')) + ' ' + str(b.get('step')) for b in rest}))})")


def stuck_order(beat: dict) -> tuple:
    """Heartbeats sort stuck-first: the fewest steps done, then the lowest open step, then one still fetching its
    input, then one not waiting for the others ("sync"), then the longest open."""
    return (beat.get("done_step", 0), beat.get("step", 0), beat.get("phase") != "data", beat.get("phase") == "sync",
            -beat.get("open_s", 0))


class Watchdog:
    def __init__(self, hang_s: float, on_hang: Callable[[Hang], None] | None = None, rank: int = 0,
                 heartbeat_dir: Path | None = None, exit_after_s: float | None = None, exit_code: int = 6,
                 before_exit: Callable[[Hang], None] | None = None, exit: Callable[[int], Any] | None = None):
        self.hang_s, self.on_hang, self.rank = float(hang_s), on_hang, rank
        self.heartbeat_dir, self.exit_after_s, self.exit_code = heartbeat_dir, exit_after_s, exit_code
        self.before_exit, self._exit = before_exit, exit
        self.poll_s = min(self.hang_s / 4, 1.0)
        self.beat_s = self.poll_s   # a file of ~100 bytes a second per rank
        self.hangs: list[Hang] = []
        self._step, self._phase, self._t = 0, "idle", 0.0
        self._done = 0
        self._flagged = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the loop's marks (main thread) --------------------------------------------------------------------
    def begin(self, step: int, phase: str) -> None:
        if phase == "data":
            self._t = time.monotonic()
        self._step, self._phase = step, phase

    def idle(self) -> None:
        self._phase = "idle"

    def done(self, step: int) -> None:
        """Step `step`'s numbers are recorded (its heartbeat's `done_step`)."""
        self._done = step

    def phase(self, phase: str) -> str:
        """Mark the open step's phase ("sync": waiting for the other ranks' interval numbers); returns the last."""
        last, self._phase = self._phase, phase if self._phase != "idle" else "idle"
        return last

    def take(self) -> list[Hang]:
        """The hangs flagged since the last call (main thread)."""
        out, self.hangs = self.hangs, []
        return out

    # -- the thread ------------------------------------------------------------------------------------------
    def start(self) -> Watchdog:
        if self.hang_s > 0 and self._thread is None:
            if self.heartbeat_dir is not None:
                self.heartbeat_dir.mkdir(parents=True, exist_ok=True)
            self._thread = threading.Thread(target=self._run, name="packtrain-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.poll_s + 1)
            self._thread = None
        if self.heartbeat_dir is not None:
            with contextlib.suppress(OSError):
                (self.heartbeat_dir / f"rank-{self.rank}.json").unlink()
            with contextlib.suppress(OSError):
                self.heartbeat_dir.rmdir()   # the last rank out removes it (only if empty)

    def _run(self) -> None:
        last_beat = 0.0
        while not self._stop.wait(self.poll_s):
            now = time.monotonic()
            try:
                if self.heartbeat_dir is not None and now - last_beat >= self.beat_s:
                    self._beat(now)
                    last_beat = now
                self._look(now)
            except Exception as e:  # never take training down over the watchdog itself
                print(f"guard: watchdog: {type(e).__name__}: {e}", file=sys.stderr)

    def _look(self, now: float) -> None:
        step, phase, t0 = self._step, self._phase, self._t
        if phase == "idle" or t0 == 0.0:
            return
        open_s = now - t0
        if open_s > self.hang_s and self._flagged != step:
            self._flagged = step
            if self.heartbeat_dir is not None:
                self._beat(now)
            h = Hang(step, phase, open_s, self.rank, self._heartbeats())
            self.hangs.append(h)
            if self.on_hang is not None:
                self.on_hang(h)
        if self.exit_after_s is not None and open_s > self.exit_after_s:
            h = Hang(step, phase, open_s, self.rank, self._heartbeats())
            if self.before_exit is not None:
                self.before_exit(h)
            sys.stderr.flush()
            self._stop.set()
            (self._exit or os._exit)(self.exit_code)

    def _beat(self, now: float) -> None:
        assert self.heartbeat_dir is not None
        open_s = now - self._t if self._phase != "idle" and self._t else 0.0
        rec = {"rank": self.rank, "step": self._step, "phase": self._phase, "open_s": round(open_s, 3),
               "done_step": self._done, "time": time.time()}
        path = self.heartbeat_dir / f"rank-{self.rank}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        # another rank that finished first removed the folder when it held no heartbeat at that moment
        self.heartbeat_dir.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(rec))
        tmp.replace(path)

    def _heartbeats(self) -> list[dict]:
        if self.heartbeat_dir is None:
            return []
        out = []
        for p in sorted(self.heartbeat_dir.glob("rank-*.json")):
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(p.read_text()))
        return out
