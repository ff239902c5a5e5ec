"""The end-of-run summary of `packtrain run`: a few numbers from the stages' stats, and the MLflow UI command.

    packtrain run — tiny-cpu — 7 stages in 95.2 s (2 from cache)
      pack       fill 99.7% (padding 0.3%)
      train      12,340 tok/s · CPU 187% · MFU 0.4% (useful) · peak mem 1.21 GiB
      evaluate   perplexity 58.1 (loss 4.06)
      register   packtrain-lm v3 → champion
      MLflow     .venv/bin/mlflow ui --backend-store-uri sqlite:////abs/data/mlflow.db

Each stage room names its stats; `pick` looks a value up by the first matching dotted key suffix, so the
summary keeps working when a stage nests its numbers (e.g. `summary.tokens_per_s`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from packtrain.config import flatten

# candidates per summary field, in order of preference (dotted-key suffixes)
FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "fill": ("pack", ("fill", "train.fill", "fill_ratio", "mean_fill")),
    "tokens_per_s": ("train", ("real_tokens_per_s", "tokens_per_s", "tokens_per_sec", "tok_per_s")),
    "gpu_util": ("train", ("gpu_util_mean", "gpu_utilization", "gpu_util", "utilization")),
    "cpu_percent": ("train", ("cpu_percent_mean", "cpu_percent", "cpu_util", "process_cpu_percent")),
    "mfu": ("train", ("useful_mfu", "mfu", "dense_mfu")),
    "peak_memory_gib": ("train", ("peak_alloc_gib", "peak_memory_gib", "peak_rss_gib", "peak_mem_gib",
                                  "max_rss_gib")),
    "perplexity": ("evaluate", ("perplexity", "eval_perplexity", "ppl")),
    "eval_loss": ("evaluate", ("eval_loss", "loss")),
    "model_name": ("register", ("model_name", "name", "registered_model")),
    "version": ("register", ("version", "model_version", "registered_version")),
    "alias": ("register", ("alias", "aliases", "alias_decision")),
}


def pick(stats: dict, candidates: tuple[str, ...]) -> Any:
    """First value whose dotted key equals or ends with a candidate.

    >>> pick({"summary": {"tokens_per_s": 5.0}}, ("tokens_per_s",))
    5.0
    """
    flat = flatten(stats) if stats else {}
    for cand in candidates:
        if cand in flat:
            return flat[cand]
        for k, v in flat.items():
            if k.endswith("." + cand):
                return v
    return None


def build_summary(stages: dict[str, dict]) -> dict:
    """{'fill': 0.997, 'tokens_per_s': ..., 'version': '3', 'alias': 'champion', 'cached': [...]}."""
    out: dict[str, Any] = {name: pick(stages.get(stage) or {}, cands) for name, (stage, cands) in FIELDS.items()}
    out["cached"] = [s for s, st in stages.items() if (st or {}).get("cache") == "hit"]
    return out


def mlflow_ui_command(tracking_uri: str) -> str:
    """The exact command that opens the MLflow UI on this run's store."""
    exe = shutil.which("mlflow") or str(Path(sys.executable).with_name("mlflow"))
    try:
        exe = str(Path(exe).relative_to(Path.cwd()))
    except ValueError:
        pass
    return f"{exe} ui --backend-store-uri {tracking_uri}"


def _fmt(v: Any, spec: str = ",.0f") -> str:
    try:
        return format(float(v), spec)
    except (TypeError, ValueError):
        return str(v)


def format_summary(name: str, summary: dict, seconds: float, n_stages: int, tracking_uri: str | None) -> str:
    s = summary
    cached = s.get("cached") or []
    lines = [f"packtrain run — {name} — {n_stages} stages in {seconds:.1f} s"
             + (f" ({len(cached)} from cache: {', '.join(cached)})" if cached else "")]
    if s.get("fill") is not None:
        f = float(s["fill"])
        lines.append(f"  pack       fill {f:.2%} (padding {1 - f:.2%})")
    parts = []
    if s.get("tokens_per_s") is not None:
        parts.append(f"{_fmt(s['tokens_per_s'])} tok/s")
    if s.get("gpu_util") is not None:
        parts.append(f"GPU util {_fmt(float(s['gpu_util']) * (100 if float(s['gpu_util']) <= 1 else 1), '.0f')}%")
    elif s.get("cpu_percent") is not None:
        parts.append(f"CPU {_fmt(s['cpu_percent'], '.0f')}%")
    if s.get("mfu") is not None:
        parts.append(f"MFU {_fmt(float(s['mfu']) * 100, '.2f')}%")
    if s.get("peak_memory_gib") is not None:
        parts.append(f"peak mem {_fmt(s['peak_memory_gib'], '.2f')} GiB")
    if parts:
        lines.append("  train      " + " · ".join(parts))
    if s.get("perplexity") is not None:
        lines.append(f"  evaluate   perplexity {_fmt(s['perplexity'], '.2f')}"
                     + (f" (loss {_fmt(s['eval_loss'], '.3f')})" if s.get("eval_loss") is not None else ""))
    if s.get("version") is not None:
        lines.append(f"  register   {s.get('model_name') or 'model'} v{s['version']}"
                     + (f" → {s['alias']}" if s.get("alias") else ""))
    if tracking_uri:
        lines.append(f"  MLflow     {mlflow_ui_command(tracking_uri)}")
    return "\n".join(lines)
