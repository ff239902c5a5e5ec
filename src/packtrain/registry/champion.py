"""Who holds the champion alias: the paired verdict, the gate against the champion, the compare-and-set.

    decide_from_verdict(verdict, ...)       the evaluate stage's paired comparison with champion v3 says promote
                                            (packtrain.evaluate.promotion) and v3 still holds the alias → champion
    gate_against_champion(...)              champion by the verdict, and `register.gate` on (scheduled runs): the new
                                            version's training run must pass `packtrain gate` against the
                                            champion's (packtrain.gate, default noise-aware rules), else it
                                            stays challenger and the reason names the regressed metrics
    move_champion(...)                      compare-and-set: the alias moves only from the version the
                                            candidate was judged against

Compare-and-set: right before `set_registered_model_alias` the alias is read again; if another registration
moved it meanwhile (v3 → v5), v4 does not take it: v4 becomes challenger, reason "champion moved from v3 to
v5 while v4 was being registered (gated against v3) …". MLflow has no atomic compare-and-set, so the re-read
and the write are two requests; for a sqlite store they run under an flock on `<db>.alias.lock` (atomic
between processes of one machine); against a server the window is those two requests (~ms).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHAMPION, CHALLENGER, DEFERRED = "champion", "challenger", "deferred"


def decide_from_verdict(promotion: dict | None, has_champion: bool, champion_version: str | None
                        ) -> tuple[str, str]:
    """(decision, reason) from the paired evaluation's verdict (packtrain.evaluate.promotion.PromotionVerdict as a
    dict) and who holds the champion alias now. The verdict only counts against the version it was made
    against; there is no other rule.

    >>> decide_from_verdict(None, False, None)[0], decide_from_verdict(None, True, "3")[0]
    ('champion', 'challenger')
    >>> decide_from_verdict({"promote": True, "against": "v3", "reason": "r"}, True, "5")[1][:36]
    'evaluated against v3, but v5 holds t'
    """
    now = f"v{champion_version}" if champion_version else None
    if promotion is None:
        if not has_champion:
            return CHAMPION, f"first champion: no version held the {CHAMPION} alias"
        return CHALLENGER, (f"no paired evaluation against the champion {now}: kept as challenger (`packtrain "
                            "evaluate` scores both models on the suites; docs/validation.md)")
    against, reason = promotion.get("against"), str(promotion.get("reason", ""))
    if against is None:
        if not has_champion:
            return CHAMPION, f"first champion: no version held the {CHAMPION} alias (the challenger was scored alone)"
        return CHALLENGER, (f"evaluated with no champion, but {now} holds the {CHAMPION} alias now: kept as "
                            f"challenger (re-run evaluate to compare with {now})")
    if against != now:
        return CHALLENGER, (f"evaluated against {against}, but {now or 'no version'} holds the {CHAMPION} alias "
                            f"now: kept as challenger (re-run evaluate to compare with the champion)")
    return (CHAMPION if promotion.get("promote") else CHALLENGER), reason


def as_float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def current_champion(client, name: str, metric: str) -> tuple[bool, str | None, float | None]:
    """(has_champion, version, metric value) of `name@champion`; the value from the version's tag, else
    from its run's metrics (`eval_loss`/`perplexity` or `candidate_<metric>`)."""
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return False, None, None
    value = as_float(mv.tags.get(metric))
    if value is None and mv.run_id:
        try:
            m = client.get_run(mv.run_id).data.metrics
            value = as_float(m.get(metric, m.get(f"candidate_{metric}")))
        except MlflowException:
            value = None
    return True, str(mv.version), value


@dataclass
class ChampionGate:
    """The outcome of gating a registration against the champion (version tags `gate*`)."""

    verdict: str                    # PASS | REGRESSION | MISSING DATA
    exit_code: int                  # 0 | 1 | 2, as `packtrain gate`
    summary: str                    # "pack.fill dropped 2.73% > 0.5%; ..." (empty on a pass)
    baseline: str                   # "v3 (run efa50e85 (train of pipeline 69930646))"
    files: list[Path] = field(default_factory=list)   # gate.json, gate.md (logged under gate/)

    def tags(self) -> dict[str, str]:
        return {"gate": self.verdict, "gate_exit_code": str(self.exit_code), "gate_baseline": self.baseline[:4000],
                **({"gate_failed": self.summary[:4000]} if self.summary else {})}


def gate_against_champion(client, run_id: str, name: str, champion_version: str, rules_path: str | None,
                          out_dir: Path) -> ChampionGate:
    """`packtrain gate --candidate <run_id's train run> --baseline models:/<name>/<champion_version>
    [--rules rules_path]`, evaluated here; gate.json/gate.md written to `out_dir`. A run or metric that
    cannot be found is "MISSING DATA" (exit 2), which does not pass."""
    from packtrain.errors import MissingDataError, PacktrainError
    from packtrain.gate import evaluate_gate, load_rules, write_gate_outputs
    from packtrain.gate.metric_sources import load_run, resolve_ref

    base_label = f"v{champion_version}"
    try:
        rules = load_rules(rules_path)
        cand = load_run(client, run_id, "this registration's pipeline", require_train=True)
        ref = f"models:/{name}/{champion_version}"
        base_run, how, base_train = resolve_ref(client, ref)
        base = load_run(client, base_train or base_run, how, model_ref=ref)
        base_label = f"v{champion_version} ({base.label})"
        result = evaluate_gate(cand, base, rules)
    except (MissingDataError, PacktrainError) as e:   # a bad rules file is a PacktrainError (exit 2) too
        return ChampionGate("MISSING DATA", 2, str(e)[:1000], base_label)
    files = list(write_gate_outputs(result, out_dir))
    failed = result.missing + result.regressions
    summary = "; ".join(f"{r.metric} {r.reason}" for r in failed)
    return ChampionGate(result.verdict, result.exit_code, summary, base_label, files)


@contextlib.contextmanager
def alias_lock(tracking_uri: str) -> Iterator[None]:
    """An flock next to a sqlite store's file (no-op for other stores): makes the compare-and-set atomic
    between processes on this machine."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    db = Path(tracking_uri[len("sqlite:///"):])
    with open(db.with_name(db.name + ".alias.lock"), "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        yield


def alias_version(client, name: str, alias: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def move_champion(client, tracking_uri: str, name: str, version: str, prev_version: str | None
                  ) -> tuple[str | None, str | None]:
    """Compare-and-set `name@champion` from `prev_version` to `version`. Returns (who holds it now, None)
    when it moved (or already was `version`), else (the version another registration moved it to, the
    reason this one stays challenger)."""
    with alias_lock(tracking_uri):
        now = alias_version(client, name, CHAMPION)   # compare ...
        if now == prev_version:
            client.set_registered_model_alias(name, CHAMPION, version)   # ... and set
            return version, None
    if now == version:
        return now, None
    return now, (f"champion moved from {_v(prev_version)} to {_v(now)} while v{version} was being registered "
                 f"(gated against {_v(prev_version)}); v{version} kept as challenger")


def _v(version: str | None) -> str:
    return f"v{version}" if version else "no champion"
