"""Progress lines of a long stage in `packtrain run`'s default (non-verbose) output.

The stage processes write tqdm bars into the component log (the train loop's bar carries loss and tok/s in
its postfix; kfp.local's reader turns each `\\r` update into a line). `packtrain run` reads that stream; every
`every_s` seconds (default 10; `--progress 0`: every update) it turns the newest bar of the running stage into
one line, so the 1-minute train step of tiny-cpu is not silent:

    tqdm:  "    train:  33%|███▎      | 2/6 [00:12<00:24,  0.17step/s, loss=5.3648, tok_s=10,233]"
    line:  "step 2/6 (33%) · loss 5.3648 · 10,233 tok/s · 0:12 elapsed · ETA 0:24"

Only the stage's own bar counts (the train loop's "train", evaluate's "evaluate"): the short bars of
libraries ("Loading weights", "Writing model shards") are not progress of the stage. A finished bar (n = total)
is not shown either: the stage's status line follows it.
"""

from __future__ import annotations

import re
import time

_BAR = re.compile(r"(?P<desc>[^\s|:][^|:]*?):\s+(?P<pct>\d+)%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s+"
                  r"\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:?]+)(?P<rest>[^\]]*)\]")
_POSTFIX = re.compile(r"(\w+)=(.*?)(?=,\s*\w+=|$)")


def parse_bar(line: str) -> dict | None:
    """A tqdm line → {"desc", "n", "total", "pct", "elapsed", "remaining", "postfix": {k: v}}, else None.

    >>> parse_bar("    train:  33%|███▎      | 2/6 [00:12<00:24,  0.17step/s, loss=5.3648, tok_s=10,233]")["postfix"]
    {'loss': '5.3648', 'tok_s': '10,233'}
    """
    m = _BAR.search(line)
    if not m:
        return None
    rest = m["rest"]
    # the rate comes first ("0.17step/s" or "?step/s"); key=value pairs after it are the postfix
    post = {k: v.strip() for k, v in _POSTFIX.findall(rest)}
    return {"desc": m["desc"].strip(), "n": int(m["n"]), "total": int(m["total"]), "pct": int(m["pct"]),
            "elapsed": _clock(m["elapsed"]), "remaining": _clock(m["remaining"]), "postfix": post}


def format_bar(bar: dict, stage: str) -> str:
    """One progress line (no stage label).

    >>> format_bar({"desc": "train", "n": 2, "total": 6, "pct": 33, "elapsed": "0:12", "remaining": "0:24",
    ...             "postfix": {"loss": "5.3648", "tok_s": "10,233"}}, "train")
    'step 2/6 (33%) · loss 5.3648 · 10,233 tok/s · 0:12 elapsed · ETA 0:24'
    """
    head = "step" if bar["desc"] == stage else bar["desc"]
    parts = [f"{head} {bar['n']}/{bar['total']} ({bar['pct']}%)"]
    for k, v in bar["postfix"].items():
        parts.append(f"{v} tok/s" if k == "tok_s" else f"{k} {v}")
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
    """Decides when a bar line becomes a progress line: at most one per `every_s` per stage."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self.last = time.monotonic()

    def start(self) -> None:
        self.last = time.monotonic()

    def line(self, text: str, stage: str) -> str | None:
        """The progress line for `text` (a raw log line) when one is due, else None."""
        bar = parse_bar(text)
        if bar is None or bar["desc"] != stage or bar["n"] >= bar["total"]:
            return None
        now = time.monotonic()
        if now - self.last < self.every_s:
            return None
        self.last = now
        return format_bar(bar, stage)
