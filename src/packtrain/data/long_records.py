"""Chat / prompt-completion records longer than the pack budget: `tokenize.long_records`, one explicit policy.

A record whose rendered ids (BOS, template, every turn, the EOS) exceed `pack.budget` B cannot be one pack
segment. Cut blindly into chunks (what `pack.overlong: split` does to plain text), its continuation chunks
would land in other packs with no question before them, positions from 0 and every token learned: the model
would learn answers to nothing (the harm the prompt_fits_budget rule exists to prevent). Instead tokenize
applies one of three policies, counts what it did (tokenize_result.json, the summary, MLflow metrics) and writes only
documents of ≤ B tokens for records:

    refuse              the record is an error naming it (tokenize exit 3; validate's record_fits_budget check
                        names it first, and `ingest.on_bad_record=skip` drops and counts it)
    truncate            the prompt + the head of the answer, up to B tokens; the dropped tail is counted
                        (`truncated_tokens`) — the end of the answer and its EOS are never learned
    split_with_prompt   (default) the first chunk as the record starts; every continuation chunk is a document
                        of its own that starts with the record's prompt (masked: not learned), then the turn's
                        question when the chunk starts in a later turn (that question alone when it and the
                        record's prompt leave no room for 2 tokens), then the last answer tokens before the
                        cut (masked, up to a quarter of the room: the learned tokens see the text they follow,
                        and "header → mid-sentence" is never learned), then the next slice of the record with its
                        own mask. Positions count on from the prompt through the slice (0..n-1, one document: no
                        restart, no jump, so every attention backend keeps it whole). No learned token is ever in
                        a pack without its prompt. Cuts are moved back to a turn boundary so no chunk starts in the
                        middle of a question.

Why split_with_prompt is the default: it loses no answer token and no EOS (truncate drops the end of every
long answer — the model never sees how long answers end; refuse drops the record), and every learned token
still sees its question; its cost is the repeated context, counted as `split_context_tokens`.

    prompt P = p0 p1 (mask 0), answer r0..r6 + EOS (mask 1), budget 6:

    chunk 0   p0 p1 r0 r1 r2 r3             mask 0 0 1 1 1 1      positions 0..5
    chunk 1   p0 p1 r3 r4 r5 r6             mask 0 0 0 1 1 1      r3 carried (masked), r4.. learned
    chunk 2   p0 p1 r6 EOS                  mask 0 0 0 1

>>> fit = fit_record(list(range(10)), [0, 0] + [1] * 8, 6, "split_with_prompt")
>>> [d[0] for d in fit.docs], [d[1] for d in fit.docs], fit.context_tokens
([[0, 1, 2, 3, 4, 5], [0, 1, 5, 6, 7, 8], [0, 1, 8, 9]], [[0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1], [0, 0, 0, 1]], 6)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

LongRecords = Literal["refuse", "truncate", "split_with_prompt"]
LONG_RECORDS: tuple[str, ...] = ("refuse", "truncate", "split_with_prompt")
OVERLAP_FRACTION = 4
"""A continuation chunk carries at most room // 4 answer tokens from before the cut (masked), room = the budget
left after the prompt and the turn's question: context for the learned tokens at ≤ 25% more chunks."""


@dataclass
class FittedRecord:
    """What a policy made of one record: the store documents (ids, mask), each ≤ budget, and its counts."""

    docs: list[tuple[list[int], list[int]]] = field(default_factory=list)
    truncated_tokens: int = 0      # tokens not written (truncate: the tail; split: a trailing unlearned tail)
    context_tokens: int = 0        # masked tokens repeated at the start of continuation chunks
    problem: str | None = None     # the record cannot be written under the policy (refuse, or no room)


def learned_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[(start, end)] of the maximal runs of 1 in `mask`.

    >>> learned_runs([0, 1, 1, 0, 0, 1])
    [(1, 3), (5, 6)]
    """
    runs, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(mask)))
    return runs


def fit_record(ids: list[int], mask: list[int], budget: int, policy: str) -> FittedRecord:
    """The record as documents of ≤ `budget` tokens under `policy` (module doc). A record that fits is returned
    as it is, whatever the policy."""
    n = len(ids)
    if n <= budget:
        return FittedRecord([(ids, mask)])
    if policy == "refuse":
        return FittedRecord(problem=f"record of {n:,} tokens is longer than the pack budget {budget:,} "
                                    "(tokenize.long_records=refuse; truncate or split_with_prompt keep it)")
    if policy == "truncate":
        return FittedRecord([(ids[:budget], mask[:budget])], truncated_tokens=n - budget)
    if policy != "split_with_prompt":
        raise ValueError(f"tokenize.long_records={policy!r}; allowed: {', '.join(LONG_RECORDS)}")
    return split_with_prompt(ids, mask, budget)


def split_with_prompt(ids: list[int], mask: list[int], budget: int) -> FittedRecord:
    """split_with_prompt (module doc). A problem when a continuation has no room: the prompt plus a later turn's
    question leave fewer than 2 tokens of the budget."""
    n = len(ids)
    runs = learned_runs(mask)
    out = FittedRecord()
    if not runs:
        return FittedRecord(problem="no token to learn")
    head = ids[: runs[0][0]]
    if len(head) + 2 > budget:   # tokenize refuses a prompt ≥ budget before (row_problem); a guard here
        return FittedRecord(problem=_no_room(len(head), 0, budget))
    last_learned = runs[-1][1]
    a = 0
    while a < last_learned:
        ctx: list[int] = []
        if a:
            i = next((k for k, (s, e) in enumerate(runs) if s <= a < e), None)
            nxt = i if i is not None else next(k for k, (s, _) in enumerate(runs) if s > a)
            question = runs[nxt][0] - a if i is None else 0   # a chunk that starts at a later turn's question
            if i is not None and i > 0:
                question = runs[i][0] - runs[i - 1][1]
            # the record's prompt, unless it and a later turn's question leave no room: then that question alone
            ctx = list(head) if len(head) + question + 2 <= budget or not question else []
            if question + 2 > budget:
                return FittedRecord(problem=_no_room(len(head), question, budget))
            if i is not None:   # inside answer i: its question (a later turn) + the answer tokens before the cut
                s = runs[i][0]
                if i > 0:
                    ctx += ids[runs[i - 1][1]: s]
                back = min(a - s, (budget - len(ctx)) // OVERLAP_FRACTION)
                ctx += ids[a - back: a]
        room = budget - len(ctx)
        if room < 1:
            return FittedRecord(problem=_no_room(len(head), len(ctx) - len(head), budget))
        b = min(n, a + room)
        if b < n:
            # b strictly inside the unlearned gap before run j (a question): cut at the gap's start instead
            j = next((k for k in range(1, len(runs)) if runs[k - 1][1] < b < runs[k][0]), None)
            if j is not None:
                gap_start = runs[j - 1][1]
                if gap_start <= a:
                    return FittedRecord(problem=_no_room(len(head), runs[j][0] - gap_start, budget))
                b = gap_start
        out.docs.append((ctx + ids[a:b], [0] * len(ctx) + mask[a:b]))
        out.context_tokens += len(ctx)
        a = b
    out.truncated_tokens = n - a   # an unlearned tail after the last learned token (none with a learned EOS)
    return out


def _no_room(prompt: int, question: int, budget: int) -> str:
    return (f"cannot be split with its prompt: a later turn's question ({question:,} tokens; the record's prompt "
            f"{prompt:,}) leaves no room for its answer in the pack budget {budget:,} (raise pack.budget, or set "
            "tokenize.long_records=truncate)")
