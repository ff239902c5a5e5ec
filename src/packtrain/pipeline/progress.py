"""What `packtrain run` prints while the stages run: one line per stage and progress lines of a long one.

Both runners describe a run as `StageEvent`s (start, progress, end) and `StageLines` renders them:

    [4/7] pack      success in 1.2 s
    [5/7] train     step 2/6 (33%) · loss 5.3648 · 10,233 tok/s · 0:12 elapsed · ETA 0:24
    [5/7] train     success in 16.8 s (cached)

Progress comes from the stage's own tqdm bar (the train loop's bar carries loss and tok/s in its postfix):
in process (packtrain.pipeline.dag) `bar_state` reads the live bar object each time it draws; under `--runner
kfp` the bar only exists as text in the component log (kfp.local's reader turns each `\\r` update into a
line) and `parse_bar` reads it back. Either way at most one line every `every_s` seconds (default 10;
`--progress 0`: every update), so the 1-minute train step of tiny-cpu is not silent:

    tqdm:  "    train:  33%|███▎      | 2/6 [00:12<00:24,  0.17step/s, loss=5.3648, tok_s=10,233]"
    line:  "step 2/6 (33%) · loss 5.3648 · 10,233 tok/s · 0:12 elapsed · ETA 0:24"

A bar counting something else than steps says what it counts and how fast (evaluate's bar over a suite: its
documents, or a task suite's items):

    tqdm:  "    evaluate:  30%|███       | 60/200 [00:05<00:12,  11.20doc/s, suite=wordorder (challenger) 2/4]"
    line:  "docs 60/200 (30%) · suite wordorder (challenger) 2/4 · 11.2 docs/s · 0:05 elapsed · ETA 0:12"

Only the stage's own bar counts (the train loop's "train", evaluate's "evaluate"): the short bars of
libraries ("Loading weights", "Writing model shards") are not progress of the stage. A finished bar (n = total)
is not shown either: the stage's status line follows it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TextIO

_BAR = re.compile(r"(?P<desc>[^\s|:][^|:]*?):\s+(?P<pct>\d+)%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s+"
                  r"\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:?]+)(?P<rest>[^\]]*)\]")
_POSTFIX = re.compile(r"(\w+)=(.*?)(?=,\s*\w+=|$)")
# tqdm's rate: "0.17step/s", "?doc/s" (no rate yet) or, under one per second, "3.45s/doc"
_RATE = re.compile(r"^,\s*(?:(?P<per_s>[\d.]+|\?)(?P<unit>[A-Za-z]+)/s|(?P<s_per>[\d.]+)s/(?P<unit2>[A-Za-z]+))")


def parse_bar(line: str) -> dict | None:
    """A tqdm line → {"desc", "n", "total", "pct", "elapsed", "remaining", "postfix": {k: v}, "unit", "rate"},
    else None (`rate`: units per second, None before tqdm has one).

    >>> parse_bar("    train:  33%|███▎      | 2/6 [00:12<00:24,  0.17step/s, loss=5.3648, tok_s=10,233]")["postfix"]
    {'loss': '5.3648', 'tok_s': '10,233'}
    >>> b = parse_bar("evaluate:  1%|          | 2/200 [00:07<11:33,  3.50s/doc, suite=wordorder (champion) 4/4]")
    >>> b["unit"], round(b["rate"], 3), b["postfix"]
    ('doc', 0.286, {'suite': 'wordorder (champion) 4/4'})
    """
    m = _BAR.search(line)
    if not m:
        return None
    rest = m["rest"]
    # the rate comes first ("0.17step/s", "?step/s" or "3.45s/step"); key=value pairs after it are the postfix
    post = {k: v.strip() for k, v in _POSTFIX.findall(rest)}
    r = _RATE.match(rest)
    unit, rate = None, None
    if r and r["unit"]:
        unit, rate = r["unit"], (None if r["per_s"] == "?" else float(r["per_s"]))
    elif r:
        unit, rate = r["unit2"], (1 / float(r["s_per"]) if float(r["s_per"]) else None)
    return {"desc": m["desc"].strip(), "n": int(m["n"]), "total": int(m["total"]), "pct": int(m["pct"]),
            "elapsed": _clock(m["elapsed"]), "remaining": _clock(m["remaining"]), "postfix": post,
            "unit": unit, "rate": rate}


def format_bar(bar: dict, stage: str) -> str:
    """One progress line (no stage label).

    >>> format_bar({"desc": "train", "n": 2, "total": 6, "pct": 33, "elapsed": "0:12", "remaining": "0:24",
    ...             "postfix": {"loss": "5.3648", "tok_s": "10,233"}}, "train")
    'step 2/6 (33%) · loss 5.3648 · 10,233 tok/s · 0:12 elapsed · ETA 0:24'

    A bar in other units than steps (tqdm's `unit`) is counted in them, with its rate:

    >>> format_bar({"desc": "evaluate", "n": 60, "total": 200, "pct": 30, "elapsed": "0:05", "remaining": "0:12",
    ...             "postfix": {"suite": "wordorder (challenger) 2/4"}, "unit": "doc", "rate": 11.2}, "evaluate")
    'docs 60/200 (30%) · suite wordorder (challenger) 2/4 · 11.2 docs/s · 0:05 elapsed · ETA 0:12'
    """
    unit = bar.get("unit") or "step"
    counted = unit not in ("step", "it")
    head = bar["desc"] if bar["desc"] != stage else f"{unit}s" if counted else "step"
    parts = [f"{head} {bar['n']}/{bar['total']} ({bar['pct']}%)"]
    for k, v in bar["postfix"].items():
        parts.append(f"{v} tok/s" if k == "tok_s" else f"{k} {v}")
    if counted and bar.get("rate"):
        rate = bar["rate"]
        parts.append(f"{rate:,.0f} {unit}s/s" if rate >= 100 else f"{rate:.1f} {unit}s/s" if rate >= 1
                     else f"{rate:.2f} {unit}s/s")
    parts.append(f"{bar['elapsed']} elapsed")
    if bar["remaining"] != "?":
        parts.append(f"ETA {bar['remaining']}")
    return " · ".join(parts)


def _clock(text: str) -> str:
    """tqdm's '00:12' / '1:02:03' → '0:12' / '1:02:03' ('?' stays)."""
    if text == "?":
        return text
    parts = [int(p) for p in text.split(":")]
    secs = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    h, rem = divmod(secs, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


class Progress:
    """Decides when a bar becomes a progress line: at most one per `every_s` per stage, and only a new state."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self.last = time.monotonic()
        self.shown: tuple | None = None

    def start(self) -> None:
        self.last = time.monotonic()
        self.shown = None

    def due(self, bar: dict | None, stage: str) -> dict | None:
        """`bar` when it is the stage's own unfinished bar, a line is due and it moved since the last one."""
        if bar is None or bar["desc"] != stage or bar["n"] >= bar["total"]:
            return None
        now = time.monotonic()
        if now - self.last < self.every_s or (bar["n"], bar["postfix"]) == self.shown:
            return None
        self.last, self.shown = now, (bar["n"], bar["postfix"])
        return bar

    def line(self, text: str, stage: str) -> str | None:
        """The progress line for `text` (a raw log line) when one is due, else None."""
        bar = self.due(parse_bar(text), stage)
        return format_bar(bar, stage) if bar is not None else None


def bar_state(bar: Any) -> dict:
    """A live tqdm bar → the dict `parse_bar` reads from its text (same numbers, same rounding as the bar shows).

    >>> from tqdm import tqdm
    >>> b = tqdm(total=6, desc="train", disable=False, file=open("/dev/null", "w")); _ = b.update(2)
    >>> b.set_postfix(loss="5.3648", tok_s="10,233"); bar_state(b)["postfix"], bar_state(b)["pct"]
    ({'loss': '5.3648', 'tok_s': '10,233'}, 33)
    """
    from tqdm import tqdm

    d = bar.format_dict
    n, total, elapsed = d["n"], d["total"], d["elapsed"] or 0
    rate = d["rate"]
    if rate is None and elapsed:
        rate = (n - (d.get("initial") or 0)) / elapsed
    remaining = tqdm.format_interval((total - n) / rate) if rate and total else "?"
    return {"desc": (d["prefix"] or "").strip(), "n": int(n), "total": int(total or 0),
            "pct": int(f"{100 * n / total:.0f}") if total else 0, "elapsed": _clock(tqdm.format_interval(elapsed)),
            "remaining": _clock(remaining), "postfix": dict(_POSTFIX.findall(d["postfix"] or "")),
            "unit": d.get("unit") or None, "rate": rate or None}


def live_bar(stage: str) -> dict | None:
    """The state of the stage's own running bar in this process (desc == stage, not finished), else None."""
    import sys

    if "tqdm" not in sys.modules:
        return None
    from tqdm import tqdm

    for bar in list(tqdm._instances):   # the bars alive in this process (tqdm's own registry, a WeakSet)
        if getattr(bar, "desc", None) == stage and not bar.disable and bar.total and bar.n < bar.total:
            return bar_state(bar)
    return None


@dataclass(frozen=True)
class StageEvent:
    """One thing that happened to a stage of a run: it started, it made progress, it ended."""

    kind: Literal["start", "progress", "end"]
    stage: str
    index: int
    """1-based position in the stage table."""
    total: int
    """Stages in the run."""
    status: Literal["success", "failure"] | None = None
    """How it ended (kind "end")."""
    seconds: float = 0.0
    """Wall time from its start (kind "end")."""
    cached: bool = False
    """Its output came from the stage cache (kind "end")."""
    bar: dict | None = None
    """Its progress bar (kind "progress"): `parse_bar`'s dict."""


class StageLines:
    """Renders StageEvents as the terminal's lines (module doc); `write` None: print nothing (--verbose streams
    the whole log instead)."""

    def __init__(self, out: TextIO | None):
        self.out = out
        self.open_line = False   # the label is written, its status not yet

    def __call__(self, ev: StageEvent) -> None:
        label = f"[{ev.index}/{ev.total}] {ev.stage:<9} "
        if ev.kind == "start":
            self._say(label, end="")
            self.open_line = True
        elif ev.kind == "progress" and ev.bar is not None:
            self._say(("" if self.open_line else label) + format_bar(ev.bar, ev.stage))
            self.open_line = False
        elif ev.kind == "end":
            note = " (cached)" if ev.cached else ""
            self._say(("" if self.open_line else label) + f"{ev.status} in {ev.seconds:.1f} s{note}")
            self.open_line = False

    def _say(self, text: str, end: str = "\n") -> None:
        if self.out is not None:
            self.out.write(text + end)
            self.out.flush()


EventSink = Callable[[StageEvent], None]
