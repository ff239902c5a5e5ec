"""The end-of-run summary of `packtrain run`: a few numbers from the stages' stats, and the MLflow UI command.

    packtrain run — tiny-cpu — 7 stages in 95.2 s (2 from cache)
      data       1,446 documents · 7,331,486 tokens · tokens/doc p50 1,790 p90 12,853 p99 48,283
      validate   passed (11/11 expectations)
      pack       fill 99.7% (padding 0.3%)
      train      12,340 tok/s · CPU util 87% · MFU 0.40% · peak RSS 1.21 GiB
      evaluate   perplexity 58.1 (loss 4.06)
      register   packtrain-lm v3 → champion
      dvc        documents md5 3f1c… in DVC remote /abs/data/dvc-remote
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
    "documents": ("ingest", ("documents",)),
    "validation_success": ("validate", ("success",)),
    "expectations": ("validate", ("expectations",)),
    "expectations_passed": ("validate", ("passed",)),
    "tokens": ("tokenize", ("tokens",)),
    "tok_p50": ("tokenize", ("length_tokens.p50",)),
    "tok_p90": ("tokenize", ("length_tokens.p90",)),
    "tok_p99": ("tokenize", ("length_tokens.p99",)),
    "fill": ("pack", ("fill", "train.fill", "fill_ratio")),
    "tokens_per_s": ("train", ("real_tokens_per_s", "tokens_per_s", "tokens_per_sec")),
    "utilization": ("train", ("system.utilization_mean", "utilization_mean", "gpu_util_mean", "utilization")),
    "utilization_kind": ("train", ("system.kind", "sampler_kind")),
    "mfu": ("train", ("useful_mfu", "mfu", "dense_mfu")),
    "peak_gpu_gib": ("train", ("peak_alloc_gib", "peak_memory_gib")),
    "peak_cpu_gib": ("train", ("cpu_peak_rss_gib", "peak_rss_gib", "mem_used_max_gib")),
    "perplexity": ("evaluate", ("perplexity", "eval_perplexity")),
    "eval_loss": ("evaluate", ("eval_loss",)),
    "model_name": ("register", ("model_name",)),
    "version": ("register", ("version", "model_version")),
    "alias": ("register", ("decision", "alias")),
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
    train = stages.get("train") or {}
    out["init"] = train.get("init")                       # the resolved model.init_from (warm start)
    out["init_eval_loss"] = train.get("init_eval_loss")   # held-out loss of the starting weights
    return out


def mlflow_ui_command(tracking_uri: str) -> str:
    """The exact command that opens the MLflow UI on this run's store; for a tracking server, its address
    (it serves the UI itself). Credentials in the URI are shown as `user:***@host`.

    >>> mlflow_ui_command("https://user:secret@mlflow.example:5000")
    'open https://user:***@mlflow.example:5000 (the tracking server serves the MLflow UI)'
    """
    from packtrain.secrets import redact_uri

    shown = redact_uri(tracking_uri)
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {shown} (the tracking server serves the MLflow UI)"
    exe = shutil.which("mlflow") or str(Path(sys.executable).with_name("mlflow"))
    try:
        exe = str(Path(exe).relative_to(Path.cwd()))
    except ValueError:
        pass
    return f"{exe} ui --backend-store-uri {shown}"


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
    if s.get("documents") is not None:
        line = f"  data       {_fmt(s['documents'])} documents"
        if s.get("tokens") is not None:
            line += f" · {_fmt(s['tokens'])} tokens"
        if s.get("tok_p50") is not None:
            line += (f" · tokens/doc p50 {_fmt(s['tok_p50'])} p90 {_fmt(s['tok_p90'])}"
                     f" p99 {_fmt(s['tok_p99'])}")
        lines.append(line)
    if s.get("validation_success") is not None:
        ok = "passed" if s["validation_success"] else "FAILED"
        lines.append(f"  validate   {ok} ({s.get('expectations_passed')}/{s.get('expectations')} expectations)")
    if s.get("fill") is not None:
        f = float(s["fill"])
        lines.append(f"  pack       fill {f:.2%} (padding {1 - f:.2%})")
    parts = []
    if s.get("tokens_per_s") is not None:
        parts.append(f"{_fmt(s['tokens_per_s'])} tok/s")
    if s.get("utilization") is not None:
        kind = "GPU" if s.get("utilization_kind") == "nvml" else "CPU"
        parts.append(f"{kind} util {float(s['utilization']):.0%}")
    if s.get("mfu") is not None:
        parts.append(f"MFU {float(s['mfu']):.2%}")
    gpu_mem = s.get("peak_gpu_gib")
    if gpu_mem:  # 0.0 on CPU
        parts.append(f"peak GPU mem {_fmt(gpu_mem, '.2f')} GiB")
    elif s.get("peak_cpu_gib") is not None:
        parts.append(f"peak RSS {_fmt(s['peak_cpu_gib'], '.2f')} GiB")
    init = s.get("init") or {}
    if init.get("kind") in ("dir", "registry") or init.get("reason"):
        start = init.get("uri") or init.get("path") or "scratch"
        line = f"  init       {init.get('value')} → {start}"
        if s.get("init_eval_loss") is not None:
            line += f" · step-0 held-out loss {_fmt(s['init_eval_loss'], '.4f')}"
        if init.get("reason"):
            line += f" (fallback: {init['reason'].split(';')[0]})"
        lines.append(line)
    if parts:
        lines.append("  train      " + " · ".join(parts))
    if s.get("perplexity") is not None:
        lines.append(f"  evaluate   perplexity {_fmt(s['perplexity'], '.2f')}"
                     + (f" (loss {_fmt(s['eval_loss'], '.3f')})" if s.get("eval_loss") is not None else ""))
    if s.get("version") is not None:
        lines.append(f"  register   {s.get('model_name') or 'model'} v{s['version']}"
                     + (f" → {s['alias']}" if s.get("alias") else ""))
    elif s.get("alias") == "deferred":
        lines.append(f"  register   {s.get('model_name') or 'model'} deferred: the MLflow store was unreachable; "
                     "the registration is buffered (`packtrain mlflow replay`, or automatic when it is back)")
    ds = s.get("dataset")
    if ds:
        lines.append(f"  dvc        documents md5 {ds['md5']} in DVC remote {ds['remote']}")
    if tracking_uri:
        lines.append(f"  MLflow     {mlflow_ui_command(tracking_uri)}")
    return "\n".join(lines)
