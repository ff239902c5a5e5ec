"""The workload of the packtrain-vs-baseline suites (long-context, fp8, fsdp2): documents, inputs, comparisons.

    load_recipe(name, overrides)      recipes/<name>.yaml by path (a GPU host runs from src/, no install)
    markov_docs(lengths, vocab, seed) documents whose loss falls (packtrain.testing.synthetic_inputs's Markov chain)
    lengths_for_tokens(draw, tokens)  lengths drawn until they hold `tokens` tokens
    length_summary(lengths)           quantiles, the long tail, Σs²/Σs
    write_inputs(tmp, docs, ...)      token store + tokenizer + packs through the pack stage's library
    compare_curves(base, other)       tok/s ratio, loss curves' max |Δ|, last-10 means and their relative difference
    print_rows(record, ...)           the console table of a record's variants

Nothing here imports mlflow or kfp (the GPU machine does not have them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

TINY_MODEL = ["model.hidden_size=64", "model.intermediate_size=176", "model.num_layers=2", "model.num_heads=4",
              "model.num_kv_heads=2"]
"""--smoke: the same structure (GQA) small enough for 2 CPU cores in seconds."""

TINY_TRAIN = ["train.device=cpu", "train.attention=sdpa", "train.loss=chunked", "train.compile=false"]


def load_recipe(name: str, overrides: list[str]):
    """recipes/<name>.yaml by path (PYTHONPATH=src on the GPU machine: no installed recipes package)."""
    from packtrain.config import load_run_config

    return load_run_config(ROOT / "recipes" / f"{name}.yaml", overrides)


def markov_docs(lengths: np.ndarray, vocab: int, seed: int) -> list[np.ndarray]:
    """Documents of `lengths` tokens from packtrain.testing.synthetic_inputs's sparse Markov chain (EOS = 1 at the end),
    so the loss falls from ln V toward ≈ ln 4 and two runs' loss curves can be compared."""
    from packtrain.testing.synthetic_inputs import markov_documents

    return markov_documents(np.asarray(lengths, np.int64), vocab, np.random.default_rng(seed), eos_id=1)


def lengths_for_tokens(draw, tokens: int) -> np.ndarray:
    """Concatenate batches of `draw(n)` until they hold ≥ `tokens` tokens; int64 lengths."""
    out, total = [], 0
    while total < tokens:
        d = draw(4096)
        out.append(d)
        total += int(d.sum())
    lens = np.concatenate(out)
    return lens[: int(np.searchsorted(np.cumsum(lens), tokens)) + 1]


def length_summary(lengths: np.ndarray) -> dict:
    """Quantiles, the long tail (share of tokens in documents ≥ 8k / ≥ 16k) and Σs²/Σs (the mean attention span
    a token pays for: attention FLOPs per token ∝ it)."""
    s = np.asarray(lengths, np.float64)
    q = np.percentile(s, [50, 90, 99]).tolist()
    return {"n_docs": int(len(s)), "tokens": int(s.sum()), "p50": q[0], "p90": q[1], "p99": q[2],
            "max": int(s.max()), "mean": float(s.mean()),
            "token_share_ge_8k": float(s[s >= 8192].sum() / s.sum()),
            "token_share_ge_16k": float(s[s >= 16384].sum() / s.sum()),
            "sum_sq_over_sum": float((s * s).sum() / s.sum())}


def write_inputs(root: Path, docs: list[np.ndarray], vocab: int, pack_cfg) -> tuple[Path, Path, dict]:
    """root/tokenize (token store + word-level tokenizer, all documents train) and root/pack (the pack stage's
    library with `pack_cfg`); returns (tokens_dir, packs_dir, pack stats dict)."""
    from packtrain.data.token_store import write_token_store
    from packtrain.packing.dataset import pack_dataset
    from packtrain.testing.synthetic_inputs import write_tokenizer

    write_tokenizer(root / "tok", vocab)
    n = len(docs)
    write_token_store(root / "tokenize", docs, np.arange(n), np.zeros(n, np.uint8),
                      {"vocab_size": vocab, "eos_id": 1, "pad_id": 0}, tokenizer_dir=root / "tok")
    stats = pack_dataset(root / "tokenize", root / "pack", pack_cfg)
    return root / "tokenize", root / "pack", stats.to_dict()


def loss_tail_mean(curve: list[float], n: int = 10) -> float | None:
    """Mean of the last `n` losses (one step's loss is noisy; the issue's 'loss after ≥ 200 steps')."""
    tail = [x for x in curve[-n:] if x is not None]
    return sum(tail) / len(tail) if tail else None


def compare_curves(base: dict, other: dict, tail: int = 10) -> dict:
    """Two runs on the same data and seed: tok/s ratio (other / base), the loss curves' max |difference| (and its
    step; relative to base's loss: loss_step_rel_diff_max), the mean of the last `tail` losses of each and their relative difference |other − base| / base."""
    out: dict = {}
    if base.get("real_tokens_per_s") and other.get("real_tokens_per_s"):
        out["tok_s_ratio"] = other["real_tokens_per_s"] / base["real_tokens_per_s"]
    a, b = base.get("loss_curve") or [], other.get("loss_curve") or []
    n = min(len(a), len(b))
    if n:
        diffs = [abs(x - y) for x, y in zip(a[:n], b[:n], strict=True)]
        i = max(range(n), key=diffs.__getitem__)
        ta, tb = loss_tail_mean(a[:n], tail), loss_tail_mean(b[:n], tail)
        out.update({"steps_compared": n, "loss_max_abs_diff": diffs[i], "loss_max_abs_diff_step": i + 1,
                    "loss_first_abs_diff": diffs[0],
                    "loss_step_rel_diff_max": max(d / abs(x) for d, x in zip(diffs, a[:n], strict=True) if x), f"loss_tail{tail}_base": ta, f"loss_tail{tail}_other": tb,
                    "loss_tail_rel_diff": abs(tb - ta) / abs(ta) if ta else None})
    for k in ("steady_peak_alloc_gib", "step_peak_alloc_gib", "peak_alloc_gib"):
        if base.get(k) and other.get(k):
            out[f"{k}_ratio"] = other[k] / base[k]
    return out


def failure_tag(r: dict, show_refused: bool = False) -> str:
    """A failed row's tag: "OOM" or "ERROR"; "REFUSED" for a ConfigError when `show_refused` (fp8's rows)."""
    if show_refused and r.get("refused"):
        return "REFUSED"
    return "OOM" if r.get("oom") else "ERROR"


def print_rows(rows: dict[str, dict] | list[dict], names: Iterable[str] | None, header: str, width: int,
               cells: Callable[[str, dict], str], show_refused: bool = False) -> None:
    """A blank line and `header`, then per name of `names` that `rows` holds: `name` left-aligned in `width`
    characters, then its failure (tag and the error's first 110 characters) or cells(name, row). `rows` may be a
    list of rows with a "variant" each; `names` None: all of them, in order."""
    if isinstance(rows, list):
        rows = {r["variant"]: r for r in rows}
    names = list(rows) if names is None else names
    print(f"\n{header}")
    for name in names:
        r = rows.get(name)
        if r is None:
            continue
        if "error" in r and not r.get("cut"):
            print(f"{name:<{width}} {failure_tag(r, show_refused)}: {r['error'][:110]}")
            continue
        print(f"{name:<{width}} {cells(name, r)}")


def dash(x: float | None, spec: str = ".1f") -> str:
    """dash(12.34) → "12.3", dash(None) → "-", dash(0.0123, ".2e") → "1.23e-02"."""
    return "-" if x is None else format(x, spec)
