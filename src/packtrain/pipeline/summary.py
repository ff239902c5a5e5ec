"""The end-of-run summary of `packtrain run`: a few numbers from the stages' stats, and the MLflow UI command.

    packtrain run — tiny-cpu — 7 stages in 95.2 s (2 from cache)
      data       1,446 documents · 7,331,486 tokens · tokens/doc p50 1,790 p90 12,853 p99 48,283
      validate   passed (12/13 expectations; 1 non-blocking) · contamination: 17 of 1,409 training documents hold an eval document, dropped
      pack       fill 99.7% (padding 0.3%)
      train      12,340 tok/s · CPU util 87% · MFU 0.40% · peak RSS 1.21 GiB
      guard      1 event(s): throughput at step 40 (data_wait) → warned        (only when the guard saw any)
      evaluate   perplexity 58.1 (loss 4.06) on 88 of 88 held-out batches
      register   packtrain-lm v3 → champion
                 first champion: no version held the champion alias (the challenger was scored alone)
      outputs    /abs/data/kfp/packtrain-2026-12-02-10-00-00-000000/
                 model train/model/model · checkpoints train/model/checkpoints · train log … · samples …
      dvc        documents md5 3f1c… in DVC remote /abs/.packtrain/dvc-remote      (the repo's default remote)
      MLflow     .venv/bin/mlflow ui --backend-store-uri sqlite:////abs/data/mlflow.db

Each line reads declared keys of the stages' typed results (packtrain.stages.results: one key per number,
never a guess among aliases), and the lines come in the order of the stage table (packtrain.stages.table):
a stage without a line (tokenize: its numbers join the data line) prints nothing. An MFU whose peak estimate is
unreliable (packtrain.telemetry.mfu.peak_note) says why on the line after the train line:
`             MFU unreliable: peak measured under contention: load 5.0 on 2 cores while probing`; on the CPU, when
other processes used ≥ 25% of the machine's CPU while it trained (telemetry: system_cpu_mean − this process'),
`             machine busy: other processes used 48% of its CPU while this run trained: ...`.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packtrain.stages.table import STAGE_NAMES, stage_spec

# summary field → (stage, dotted key of its result)
FIELDS: dict[str, tuple[str, str]] = {
    "documents": ("ingest", "documents"),
    "validation_success": ("validate", "success"),
    "expectations": ("validate", "expectations"),
    "expectations_passed": ("validate", "passed"),
    "contaminated": ("validate", "contamination.contaminated"),   # training documents holding an eval document
    "contamination_checked": ("validate", "contamination.documents"),
    "contamination_policy": ("validate", "contamination.policy"),
    "contamination_by_suite": ("validate", "contamination.by_suite"),   # [[suite, documents]]: champion_domain 3
    "tokens": ("tokenize", "tokens"),
    "tok_p50": ("tokenize", "length_tokens.p50"),
    "tok_p90": ("tokenize", "length_tokens.p90"),
    "tok_p99": ("tokenize", "length_tokens.p99"),
    "long_records": ("tokenize", "long_records"),             # chat records longer than pack.budget: the policy,
    "records_over_budget": ("tokenize", "records_over_budget"),   # and how many it applied to
    "fill": ("pack", "fill"),
    "tokens_per_s": ("train", "throughput.real_tokens_per_s"),
    "utilization": ("train", "system.utilization_mean"),
    "utilization_kind": ("train", "system.kind"),
    "others_cpu": ("train", "system.others_cpu_mean"),   # CPU the machine's other processes used while training
    "mfu": ("train", "throughput.useful_mfu"),
    "mfu_note": ("train", "throughput.peak_note"),   # why the peak MFU is against is unreliable (None: it is not)
    "peak_gpu_gib": ("train", "memory.peak_alloc_gib"),
    "peak_cpu_gib": ("train", "memory.cpu_peak_rss_gib"),
    "init": ("train", "init"),                        # the resolved model.init_from (warm start)
    "init_eval_loss": ("train", "init_eval_loss"),    # held-out loss of the starting weights
    "guard_events": ("train", "guard.events"),        # the utilization guard's events (docs/guard.md)
    "perplexity": ("evaluate", "perplexity"),
    "eval_loss": ("evaluate", "eval_loss"),
    "eval_batches": ("evaluate", "n_batches"),
    "eval_batches_epoch": ("evaluate", "n_batches_epoch"),
    "model_name": ("register", "model_name"),
    "version": ("register", "version"),
    "alias": ("register", "decision"),
    "reason": ("register", "reason"),
    "existing": ("register", "existing"),   # an earlier version holds these weights: no new version
    "champion_domain": ("register", "version_tags.champion_domain"),   # what measured the champion's domain
    "margins": ("register", "version_tags.validation_margins"),   # the decision's margins: recorded, or assumed
}
for _stage, _key in FIELDS.values():
    stage_spec(_stage)   # a summary field names a stage of the table (KeyError at import otherwise)


def pick(stats: dict, key: str) -> Any:
    """The value at a dotted key, None when it is absent (a stage that did not run, a CPU-only number).

    >>> pick({"throughput": {"real_tokens_per_s": 5.0}}, "throughput.real_tokens_per_s")
    5.0
    """
    node: Any = stats
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def build_summary(stages: dict) -> dict:
    """{'fill': 0.997, 'tokens_per_s': ..., 'version': '3', 'alias': 'champion', 'cached': [...]} from each
    stage's result (a typed result or its dict)."""
    from packtrain.stages.results import as_dict

    stats = {name: as_dict(r) for name, r in stages.items()}
    out: dict[str, Any] = {field: pick(stats.get(stage) or {}, key) for field, (stage, key) in FIELDS.items()}
    out["cached"] = [s for s in STAGE_NAMES if (stats.get(s) or {}).get("cache") == "hit"]
    for stage in ("train", "evaluate"):   # this run's output directories: the runner's (run_dag), not a result's
        out[f"{stage}_dir"] = (stats.get(stage) or {}).get("output_dir")
    out["margins"] = out["margins"] or margins_line(out.get("evaluate_dir"), out.get("reason"))   # older versions
    return out


def margins_line(evaluate_dir: str | None, reason: str | None) -> str | None:
    """Where the promotion's margins came from (the seed-spread record, or the configured ones assumed), from the
    evaluate output's suites.json; None when there was no paired comparison (no champion) or no such file."""
    import json

    if not evaluate_dir or not reason or reason.startswith("first champion"):
        return None
    try:
        spread = json.loads((Path(evaluate_dir) / "suites.json").read_text(encoding="utf-8")).get("seed_spread")
    except (OSError, ValueError):
        return None
    return spread.get("note") if isinstance(spread, dict) else None


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


def _data(s: dict) -> list[str]:
    if s.get("documents") is None:
        return []
    line = f"  data       {_fmt(s['documents'])} documents"
    if s.get("tokens") is not None:
        line += f" · {_fmt(s['tokens'])} tokens"
    if s.get("tok_p50") is not None:
        line += f" · tokens/doc p50 {_fmt(s['tok_p50'])} p90 {_fmt(s['tok_p90'])} p99 {_fmt(s['tok_p99'])}"
    if s.get("records_over_budget"):
        line += f" · {_fmt(s['records_over_budget'])} long record(s): {s.get('long_records')}"
    return [line]


def _validate(s: dict) -> list[str]:
    if s.get("validation_success") is None:
        return []
    ok = "passed" if s["validation_success"] else "FAILED"
    passed, total = s.get("expectations_passed"), s.get("expectations")
    # passed with one not met: a non-blocking expectation (the contamination check under drop/warn) — say so
    soft = (f"; {total - passed} non-blocking" if s["validation_success"] and isinstance(passed, int)
            and isinstance(total, int) and passed < total else "")
    line = f"  validate   {ok} ({passed}/{total} expectations{soft})"
    if s.get("contaminated") is not None:   # the contamination check ran (docs/data.md#contamination)
        what = {"drop": "dropped", "warn": "kept (policy warn)", "fail": "refused"}.get(str(s.get("contamination_policy")), "")
        suites = ", ".join(f"{k} {_fmt(v)}" for k, v in s.get("contamination_by_suite") or [])
        line += (f" · contamination: {_fmt(s['contaminated'])} of {_fmt(s.get('contamination_checked'))} training "
                 f"documents hold an eval document" + (f" ({suites})" if suites else "")
                 + (f", {what}" if s["contaminated"] else ""))
    return [line]


def _pack(s: dict) -> list[str]:
    if s.get("fill") is None:
        return []
    f = float(s["fill"])
    return [f"  pack       fill {f:.2%} (padding {1 - f:.2%})"]


def _train(s: dict) -> list[str]:
    lines, parts = [], []
    init = s.get("init") or {}
    if init.get("kind") in ("dir", "registry") or init.get("reason"):
        start = init.get("uri") or init.get("path") or "scratch"
        line = f"  init       {init.get('value')} → {start}"
        if s.get("init_eval_loss") is not None:
            line += f" · step-0 held-out loss {_fmt(s['init_eval_loss'], '.4f')}"
        if init.get("reason"):
            line += f" (fallback: {init['reason'].split(';')[0]})"
        lines.append(line)
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
    if parts:
        lines.append("  train      " + " · ".join(parts))
    if s.get("mfu") is not None and s.get("mfu_note"):   # its own line: the numbers line reads the same either way
        lines.append(f"             MFU unreliable: {s['mfu_note']}")
    if (s.get("others_cpu") or 0.0) >= BUSY and s.get("utilization_kind") != "nvml":
        lines.append(f"             machine busy: other processes used {float(s['others_cpu']):.0%} of its CPU while "
                     "this run trained: tok/s and MFU are lower than on an idle machine")
    return lines + _guard(s)


BUSY = 0.25
"""Share of the machine's CPU other processes used during training above which the summary says so."""


def _guard(s: dict) -> list[str]:
    """`  guard      2 events: data_wait at step 14 → warned; recompile at step 22 → fallback compile_off` (the
    utilization guard's events, when there are any; the last 3, with how many came before)."""
    events = [e for e in s.get("guard_events") or [] if isinstance(e, dict)]
    if not events:
        return []
    shown = "; ".join(f"{e.get('signal')} at step {e.get('step')}"
                      + (f" ({e['cause']})" if e.get("cause") not in (None, e.get("signal")) else "")
                      + f" → {e.get('outcome') or e.get('action')}" for e in events[-3:])
    more = f" ({len(events) - 3} earlier)" if len(events) > 3 else ""
    return [f"  guard      {len(events)} event(s){more}: {shown}"]


def _evaluate(s: dict) -> list[str]:
    if s.get("perplexity") is None:
        return []
    line = (f"  evaluate   perplexity {_fmt(s['perplexity'], '.2f')}"
            + (f" (loss {_fmt(s['eval_loss'], '.3f')})" if s.get("eval_loss") is not None else ""))
    n, of = s.get("eval_batches"), s.get("eval_batches_epoch")
    if n is not None and of:   # how much of the held-out split the number is: all of it, or a capped part
        line += f" on {n:,} of {of:,} held-out batches"   # fewer than all: evaluate.max_batches capped it
    return [line]


def _outputs(s: dict) -> list[str]:
    """Where this run's model, checkpoints, train log and samples are (the in-process runner's run directory):
    `  outputs    /abs/data/kfp/packtrain-…/` then the files under it."""
    train, ev = s.get("train_dir"), s.get("evaluate_dir")
    if not train:
        return []
    root = Path(train).parent.parent
    found = [(what, Path(train) / rel) for what, rel in (("model", "model"), ("checkpoints", "checkpoints"),
                                                         ("train log", "train_log.jsonl"))]
    if ev:
        found.append(("samples", Path(ev) / "samples.json"))
    parts = [f"{what} {p.relative_to(root)}" for what, p in found if p.exists()]
    return [f"  outputs    {root}/", f"             {' · '.join(parts)}"] if parts else []


def _register(s: dict) -> list[str]:
    why = [f"             {line}" for line in _wrap(s["reason"])] if s.get("reason") else []
    if s.get("margins"):   # where the promotion's margins came from (docs/validation.md "Seed noise")
        why += [f"             {line}" for line in _wrap(f"margins: {s['margins']}")]
    line = str(s.get("champion_domain") or "")
    if line.startswith("nothing measures"):   # said in full: the champion's old domain was not guarded
        why.append(f"             {' '.join(line.split())}")   # one line, unwrapped: what users grep for
    if s.get("version") is not None and "registry_now" in s:   # restored from the cache: the registry as it is
        now = s["registry_now"]
        return [f"  register   {s.get('model_name') or 'model'} v{s['version']} (registered by an earlier run, "
                f"restored from cache) · registry now: {now}"]
    if s.get("version") is not None:
        again = " (already registered: same weights and lineage, no new version)" if s.get("existing") else ""
        return [f"  register   {s.get('model_name') or 'model'} v{s['version']}{again}"
                + (f" → {s['alias']}" if s.get("alias") else "")] + why
    if s.get("alias") == "deferred":
        return [f"  register   {s.get('model_name') or 'model'} deferred: the MLflow store was unreachable; "
                "the registration is buffered (`packtrain mlflow replay`, or automatic when it is back)"]
    return []


def _wrap(text: str, n: int = 100) -> list[str]:
    """`text` on lines of at most `n` characters, broken between words only: a reason is read whole, never cut
    (a number cut in the middle reads as another number).

    >>> _wrap("suite recent: bits/byte 2.3456 → 2.3012 (−0.0444, 95% CI [−0.0512, −0.0371])", 40)
    ['suite recent: bits/byte 2.3456 → 2.3012', '(−0.0444, 95% CI [−0.0512, −0.0371])']
    """
    import textwrap

    return textwrap.wrap(" ".join(str(text).split()), n, break_long_words=False, break_on_hyphens=False) or [""]


def registry_now(tracking_uri: str, name: str, version: str) -> str:
    """The aliases as the registry holds them now, for the summary of a run whose register stage was restored
    from the cache (its recorded decision may be stale: another run may have moved the alias since), e.g.
    "champion v6 (v1 holds no alias)". Never raises: an unreadable registry says so."""
    try:
        from mlflow import MlflowClient

        from packtrain.tracking.transport import short_http

        client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        with short_http(tracking_uri, 10):   # a store that is down answers at once, without MLflow's retries
            aliases = client.get_registered_model(name).aliases or {}
    except Exception as e:   # the summary must not fail the finished run
        return f"unreadable ({type(e).__name__})"
    if not aliases:
        return "no aliases"
    held = ", ".join(f"{a} v{v}" for a, v in sorted(aliases.items()))
    mine = [a for a, v in aliases.items() if str(v) == str(version)]
    return held + ("" if mine else f" (v{version} holds no alias)")


LINES: dict[str, Callable[[dict], list[str]]] = {
    "ingest": _data, "validate": _validate, "pack": _pack, "train": _train, "evaluate": _evaluate,
    "register": _register,
}
"""The summary lines of each stage (tokenize's numbers are on ingest's data line), printed in table order."""


def _dvc(ds: dict | None) -> list[str]:
    """Where the documents were versioned (packtrain.pipeline.local.snapshot_documents), and the repo of an
    older version that this run no longer uses, when one is still there."""
    if not ds:
        return []
    where = (f"in DVC remote {ds['remote']}" if ds.get("remote") else
             f"in the DVC cache of {ds['repo']} (no default remote: dvc remote add -d NAME URL)")
    lines = [f"  dvc        documents md5 {ds['md5']} {where}"]
    old = ds.get("legacy")
    if old:
        lines.append(f"             older runs' DVC repo {old['repo']} (remote {old['remote']}) is no longer "
                     f"used, left as it is: a remote set there goes to {ds['repo']} (dvc remote add -d), then "
                     "remove it (docs/data.md)")
    return lines


def format_summary(name: str, summary: dict, seconds: float, n_stages: int, tracking_uri: str | None) -> str:
    s = summary
    cached = s.get("cached") or []
    lines = [f"packtrain run — {name} — {n_stages} stages in {seconds:.1f} s"
             + (f" ({len(cached)} from cache: {', '.join(cached)})" if cached else "")]
    for stage in STAGE_NAMES:
        lines += LINES.get(stage, lambda _s: [])(s)
    lines += _outputs(s)
    lines += _dvc(s.get("dataset"))
    if tracking_uri:
        lines.append(f"  MLflow     {mlflow_ui_command(tracking_uri)}")
    return "\n".join(lines)
