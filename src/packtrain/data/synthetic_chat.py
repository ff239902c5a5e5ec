"""Tiny deterministic chat data for tests and the CPU SFT recipe (no download).

    python -m packtrain.data.synthetic_chat data/chat_tiny.jsonl --n 400 [--seed 0]

writes N conversations, one JSON object per line, e.g.

    {"messages": [{"role": "system", "content": "You are a careful calculator."},
                  {"role": "user", "content": "What is 17 plus 5?"},
                  {"role": "assistant", "content": "17 plus 5 is 22."}]}

Every 4th record has a second user/assistant exchange, every 5th has no system turn, so templates, multi-turn
masks and varying lengths are exercised. Same (n, seed) → byte-identical file. Answers are right, so a model
fine-tuned on them has something learnable (loss on the assistant tokens falls quickly).

It stays in the library, not packtrain.testing: it is a user command, the way to make the input of the shipped
recipes/sft-tiny-cpu.yaml (its header and docs/finetune.md run it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

SYSTEMS = ("You are a careful calculator.", "Answer in one short sentence.", "You are terse and exact.")
OPS = (("plus", lambda a, b: a + b), ("minus", lambda a, b: a - b), ("times", lambda a, b: a * b))


def synthetic_conversations(n: int, seed: int = 0) -> list[dict]:
    """N deterministic chat records {"messages": [...]}.

    >>> synthetic_conversations(1)[0]["messages"][-1]["role"]
    'assistant'
    """
    rng = np.random.default_rng([seed, 17])
    out = []
    for i in range(n):
        msgs = []
        if i % 5:
            msgs.append({"role": "system", "content": SYSTEMS[i % len(SYSTEMS)]})
        for _ in range(2 if i % 4 == 3 else 1):
            a, b = (int(x) for x in rng.integers(0, 100, 2))
            name, fn = OPS[int(rng.integers(0, len(OPS)))]
            msgs.append({"role": "user", "content": f"What is {a} {name} {b}?"})
            msgs.append({"role": "assistant", "content": f"{a} {name} {b} is {fn(a, b)}."})
        out.append({"messages": msgs})
    return out


def write_synthetic_chat(path: str | Path, n: int = 400, seed: int = 0) -> Path:
    """Write `synthetic_conversations(n, seed)` as JSONL to `path` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r, ensure_ascii=False) for r in synthetic_conversations(n, seed)]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m packtrain.data.synthetic_chat", description=__doc__.split("\n")[0])
    ap.add_argument("path")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(write_synthetic_chat(a.path, a.n, a.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
