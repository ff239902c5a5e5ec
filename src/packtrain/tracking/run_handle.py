"""StageRun: the handle a stage logs through, one MLflow run behind it (`with stage_run(...) as run:`).

    run.log_params / log_metrics / set_tags     now, one log_batch each (keys cleaned, long values cut)
    run.log_step(metrics, step)                 per-step series, batched every flush_interval_s or 1000 values
    run.log_series(rows)                        points with their own timestamps (the system/... series)
    run.log_finals({...})                       final numbers: the pipeline run's `<stage>.<key>` + summary.json
    run.log_artifact / log_json / log_stats / log_dataset / log_report, run.submit(op)

Every call goes through the run's `BufferedClient` (packtrain.tracking.buffer); a handle with no client (tracking
off, rank ≠ 0) does nothing. Opening and closing runs (stage_run, the pipeline run) is packtrain.tracking.run_lifecycle.
"""

from __future__ import annotations

import json
import numbers
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packtrain.config import flatten
from packtrain.tracking.buffer import BufferedClient

_KEY_BAD = re.compile(r"[^A-Za-z0-9_\-. :/]")


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, numbers.Real):
        return float(v)
    item = getattr(v, "item", None)  # numpy / torch scalars
    if callable(item) and getattr(v, "ndim", 1) == 0:
        try:
            return float(item())
        except (TypeError, ValueError):
            return None
    return None


class StageRun:
    """Handle to one MLflow run. Every method is a no-op when tracking is disabled (or rank ≠ 0).

    Per-step metrics from `log_step` are batched for `flush_interval_s` (one log_batch call instead of
    one per step: ~5 ms per call on sqlite) and flushed when the run ends.
    """

    def __init__(self, client: BufferedClient | None = None, run_id: str | None = None, stage: str = "",
                 flush_interval_s: float = 2.0, parent: str | None = None):
        self._client = client
        self._run_id = run_id
        self.stage = stage
        self.parent = parent   # the pipeline run this stage run is nested under (None: a run of its own)
        self.flush_interval_s = flush_interval_s
        self._steps: list[list] = []
        self._last_flush = time.monotonic()

    @property
    def enabled(self) -> bool:
        return self._client is not None and self._run_id is not None

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (a `pending-...` id until a run created while the store was down is replayed)."""
        return self._client.resolve(self._run_id) if self._client is not None else self._run_id

    @property
    def client(self) -> BufferedClient | None:
        return self._client

    @property
    def _live(self) -> tuple[BufferedClient, str]:
        """(client, run id) of an enabled run: for methods that checked `enabled` first."""
        assert self._client is not None and self._run_id is not None
        return self._client, self._run_id

    # -- params, metrics, tags -----------------------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        if self.enabled and params:
            clean = {_KEY_BAD.sub("_", k): ("" if v is None else str(v))[:6000] for k, v in params.items()}
            self._live[0].log_batch(self._live[1], params=clean)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Numeric values (int, float, numpy/torch scalars) now, in one call; others are ignored."""
        if not self.enabled:
            return
        rows = self._rows(metrics, step)
        if rows:
            self._live[0].log_batch(self._live[1], metrics=rows)

    def log_step(self, metrics: Mapping[str, Any], step: int) -> None:
        """Per-step metrics (loss, lr, tokens/s, MFU, memory); sent every `flush_interval_s` or 1000 values."""
        if not self.enabled:
            return
        self._steps.extend(self._rows(metrics, step))
        if len(self._steps) >= 1000 or time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()

    def flush(self) -> None:
        if self.enabled and self._steps:
            rows, self._steps = self._steps, []
            self._live[0].log_batch(self._live[1], metrics=rows)
        self._last_flush = time.monotonic()

    def log_series(self, rows: Sequence[tuple[str, Any, int, int]]) -> None:
        """Points with their own timestamps: (key, value, timestamp in ms since the epoch, step). The system
        series sampled during training (`system/...`) go this way, so MLflow draws them against the time
        each sample was taken."""
        if not self.enabled:
            return
        clean = [[_KEY_BAD.sub("_", str(k)), x, int(ts), int(step)] for k, v, ts, step in rows
                 if (x := _num(v)) is not None]
        for i in range(0, len(clean), 1000):   # MLflow takes at most 1000 metrics per log_batch
            self._live[0].log_batch(self._live[1], metrics=clean[i:i + 1000])

    def log_finals(self, metrics: Mapping[str, Any], name: str = "summary.json") -> None:
        """The stage's final numbers (one value each), once: a single value is no chart to look at.

        Nested under a pipeline run: that run's metrics `<stage>.<key>` (the gate's canonical names,
        packtrain.gate.metrics) and this run's artifact `summary.json`. A stage run of its own (no pipeline
        run, e.g. `packtrain train`) logs them as its own metrics under `<key>`, plus `summary.json`.

        >>> # run.log_finals({"throughput.real_tokens_per_s": 3846.2, "final_loss": 6.56})
        >>> # pipeline run: train.throughput.real_tokens_per_s, train.final_loss; train run: summary.json
        """
        if not self.enabled:
            return
        numbers = {k: v for k, v in metrics.items() if _num(v) is not None}
        if self.parent:
            rows = self._rows({f"{self.stage}.{k}": v for k, v in numbers.items()}, None)
            if rows:
                self._live[0].log_batch(self.parent, metrics=rows)
        else:
            self.log_metrics(numbers)
        self.log_json({k: _num(v) for k, v in sorted(numbers.items())}, name)

    @staticmethod
    def _rows(metrics: Mapping[str, Any], step: int | None) -> list[list]:
        ts = int(time.time() * 1000)
        out = []
        for k, v in metrics.items():
            x = _num(v)
            if x is not None:
                out.append([_KEY_BAD.sub("_", str(k)), x, ts, int(step or 0)])
        return out

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if self.enabled and tags:
            clean = {_KEY_BAD.sub("_", k): str(v)[:8000] for k, v in tags.items() if v is not None}
            if clean:
                self._live[0].log_batch(self._live[1], tags=clean)

    def submit(self, op: dict) -> Any:
        """Send a custom op for this run (e.g. register_model, packtrain.tracking.store_ops.HANDLERS) through the
        buffered client, after the pending per-step metrics. The op's result when the store applied it
        live; None when it was buffered (or tracking is off)."""
        if not self.enabled:
            return None
        self.flush()
        return self._live[0].submit({**op, "run_id": self._live[1]})

    def tag_violations(self, violations: list[str]) -> None:
        """Threshold violations (packtrain.telemetry.thresholds) as tags packtrain.violation.<name>."""
        from packtrain.telemetry.thresholds import violation_tags

        self.set_tags(violation_tags(violations))

    # -- artifacts and datasets ----------------------------------------------------------------------------
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """A file or a directory (its contents) under `artifact_path`."""
        if self.enabled and Path(path).exists():
            self._live[0].log_artifact(self._live[1], path, artifact_path)

    def log_json(self, obj: Any, name: str, artifact_path: str | None = None) -> None:
        """`obj` as pretty JSON artifact `<artifact_path>/<name>` (e.g. name="pack_result.json")."""
        if not self.enabled:
            return
        tmp = Path(tempfile.mkdtemp(prefix="packtrain-json-"))
        try:
            (tmp / name).write_text(json.dumps(obj, indent=2, default=str) + "\n", encoding="utf-8")
            self.log_artifact(tmp / name, artifact_path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def log_stats(self, stats: Mapping[str, Any], prefix: str = "", artifacts: Sequence[Path] = ()) -> None:
        """Numeric leaves of a stats dict become metrics (dotted names); files become artifacts."""
        flat = flatten(dict(stats)) if stats else {}
        self.log_metrics({f"{prefix}{k}": v for k, v in flat.items()})
        for a in artifacts:
            self.log_artifact(a)

    def log_dataset(self, path: str | Path, name: str, digest: str | None, context: str = "input") -> None:
        """A dataset this stage read: mlflow.log_input with the DVC md5 as digest + tag
        `packtrain.dataset.<name>.md5`. Call once per dataset read."""
        if not self.enabled:
            return
        digest = (digest or "unknown")[:36]
        self._live[0].log_input(self._live[1], name, digest, str(Path(path).resolve()), context)
        self.set_tags({f"packtrain.dataset.{name}.md5": digest, f"packtrain.dataset.{name}.path": str(path)})

    def log_report(self, report: Any) -> None:
        """A `packtrain.telemetry.report.TelemetryReport`: violation tags, telemetry/telemetry.json (the
        summary, every step's throughput, every sample) and plots/*.png. Its summary numbers are the stage's
        final numbers (`log_finals`); they are not logged a second time here."""
        if not self.enabled:
            return
        self.flush()
        self.tag_violations(report.violations)
        for f in report.files:
            self.log_artifact(f, "plots" if Path(f).suffix == ".png" else "telemetry")
