"""The shipped local lm-eval task `packtrain_wordorder`: which of two lines is real Python, the line or the
same words in another order? Generated here, never downloaded:

    python -m packtrain.evaluate.local_task recipes/tasks/wordorder     → wordorder.yaml, wordorder.jsonl

    {"context": "    # normalise first so the lookup always works",
     "choices": ["if line is None:", "if is None: line"], "label": 0}
    scored as  "    # normalise first so the lookup always works\n    if line is None:"  (target_delimiter "\n    ")

A multiple-choice log-likelihood task (metric acc): a comment line, then the code line. Both choices split into
the same pre-tokens (byte-level BPE merges never cross them): the same tokens in another order. One trained on
the default corpus (Python standard library source) prefers the real order (tests/stages/test_local_task.py);
a random-init model scores chance, by construction:

- **No token is shared** between the context (a comment from COMMENTS) and the line, and no pre-token repeats
  inside a line (checked with the byte-level pre-tokenizer while generating). Then the wrong choice is the
  real one with its tokens relabelled: swapping those token ids in the embedding (and LM head) maps one
  sequence onto the other and leaves the context alone, and a random init draws every token's row i.i.d., so
  P(real line scores higher) = 1/2 exactly, item by item, over initialisations.
- **One model's items must not lean alike**: the first word stays in place and the others take a random
  permutation (not the reversal), so the keyword that opens most lines ("if", "return", "for") is no
  item's tell, and items of one template differ in how they are wrong.

Measured (bench/results/wordorder_chance.json, `python -m bench wordorder-chance`): random-init tiny-cpu
models over 40 seeds average ≈ 0.5 with a spread near the binomial one of 200 independent items (docs/
validation.md has the numbers, and those of the first generator — context from the line's own identifiers,
wrong = reversal — whose random models ranged 0.275–0.66). The correct choice's position alternates, so always
picking one position scores 0.5. 200 items from 28 line templates × identifiers × 12 comments.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

TASK = "packtrain_wordorder"
NAMES = ["name", "value", "path", "data", "key", "result", "items", "line", "node", "text", "size", "args"]
LINES = [
    "if {a} is None:", "return self.{a}", "self.{a} = {b}", "for {a} in {b}:", "raise ValueError({a})",
    "elif {a} is not None:", "while {a} is not None:", "from {m} import {a}", "with open({a}) as f:",
    "except KeyError as {a}:", "def {a}(self):", "def __init__(self, {a}):", "for {a} in range({b}):",
    "if {a} in {b}:", "return len({a})", "{a} = {b}.get({c})", "assert {a} is not None", "{a}.append({b})",
    "if isinstance({a}, str):", "return {a} + {b}", "yield from {a}", "del self.{a}", "return not {a}",
    "if {a} == {b}:", "{a} = self.{b}", "return {a}[0]", "class {k}(object):", "import {m} as {a}",
]
MODULES = ["os", "sys", "re", "json", "time", "types", "string", "math"]
CLASSES = ["Parser", "Reader", "Handler", "Loader", "Writer"]
COMMENTS = [   # no word (nor punctuation) of any line: the context shares no token with the choices
    "keep the previous state around until later", "use the builtin default when missing",
    "normalise first so the lookup always works", "cache the parsed header between calls",
    "skip empty entries and blank lines", "the caller owns the buffer here",
    "checked once at startup and then trusted", "see the module docstring about this",
    "may be slow on very large inputs", "retry after a short delay on failure",
    "order matters because callers rely on this", "must stay compatible with older releases",
]


def pretokens(text: str) -> list[str]:
    """The byte-level pre-tokens of `text` without their space marker, blanks dropped:
    `pretokens(" for a in b:")` → ['for', 'a', 'in', 'b', ':']."""
    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return [w.lstrip("Ġ") for w, _ in pre.pre_tokenize_str(text) if w.strip("Ġ")]


def make_items(n: int = 200, seed: int = 0) -> list[dict]:
    """The task's documents (module doc); the same n and seed give the same items."""
    rng = np.random.default_rng(seed)
    items: list[dict] = []
    seen: set[str] = set()
    while len(items) < n:
        a, b, c = (str(x) for x in rng.choice(NAMES, 3, replace=False))
        fill = {"a": a, "b": b, "c": c, "m": str(rng.choice(MODULES)), "k": str(rng.choice(CLASSES))}
        line = str(rng.choice(LINES)).format(**fill)
        words = line.split(" ")
        if len(words) < 3 or line in seen:
            continue
        ctx = "    # " + str(rng.choice(COMMENTS))
        pieces = pretokens(" " + line)
        if len(set(pieces)) != len(pieces) or set(pieces) & set(pretokens(ctx)):
            continue   # a repeated or shared token would break the symmetry (module doc)
        seen.add(line)
        order = list(range(len(words)))
        while order == sorted(order):   # the first word stays: both choices start alike (module doc)
            order = [0] + [1 + int(i) for i in rng.permutation(len(words) - 1)]
        wrong = " ".join(words[i] for i in order)
        label = len(items) % 2   # alternate: 0, 1, 0, 1, ...
        choices = [line, wrong] if label == 0 else [wrong, line]
        items.append({"context": ctx, "choices": choices, "label": label})
    return items


TASK_YAML = f"""# Generated by `python -m packtrain.evaluate.local_task` (packtrain.evaluate.local_task); do not edit.
task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: wordorder.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
target_delimiter: "\\n    "
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def write_local_task(out_dir: str | Path, n: int = 200, seed: int = 0) -> Path:
    """Write wordorder.yaml + wordorder.jsonl into `out_dir`; returns the YAML's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "wordorder.jsonl").write_text("".join(json.dumps(x) + "\n" for x in make_items(n, seed)), encoding="utf-8")
    (out / "wordorder.yaml").write_text(TASK_YAML, encoding="utf-8")
    return out / "wordorder.yaml"


if __name__ == "__main__":
    print(write_local_task(sys.argv[1] if len(sys.argv) > 1 else "recipes/tasks/wordorder"))
