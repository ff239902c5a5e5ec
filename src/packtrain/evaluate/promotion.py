"""The promotion decision: paired per-document differences, a paired bootstrap per suite, Holm across suites.

    decide_promotion(scores, manifest, cfg: PromotionConfig) -> PromotionVerdict

For every suite both models were scored on the same documents (packtrain.evaluate.paired_scores). Per document d:

    text suites   Δ = Σ_d (nll_chal,d − nll_champ,d) / (ln 2 · Σ_d bytes_d)     bits per UTF-8 byte
                  (= challenger's bits/byte − champion's; bytes are the same for both, whatever the tokenizers)
    task suites   Δ = mean_d (acc_champ,d − acc_chal,d)                         accuracy drop (lower is better)

Δ < 0 means the challenger is better. Resampling documents with replacement (`resamples` times, seeded) gives
the bootstrap distribution of Δ; each suite's one-sided test is

    primary     superiority       H0: Δ ≥ −delta         pass when the upper bound < −delta
    regression  non-inferiority   H0: Δ ≥ +epsilon       pass when the upper bound < +epsilon
    task        non-inferiority   H0: Δ ≥ +epsilon_task  pass when the upper bound < +epsilon_task

where each margin (delta, epsilon, epsilon_task) is raised to the suite's seed margin t(confidence, k − 1)·sd·√2
when a seed-spread record covers the suite (suite_margin; packtrain.evaluate.seed_spread): a retrain that differs
only in train.seed is then promoted in neither role. Per suite the verdict also shows its MDE (holm).

p = (1 + #{Δ* ≥ threshold}) / (1 + resamples). Holm step-down over the m suites at α = 1 − confidence: the
k-th smallest p (k = 0..m−1) must be < α / (m − k), and that suite's upper bound is read at level
1 − α / (m − k). Promote only when every suite passes. An identical rerun has Δ = 0 on every document: its upper
bound is 0, never < −delta, so it is not promoted. Worked example: docs/validation.md.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from packtrain.config.evaluate import PromotionConfig

LN2 = math.log(2.0)


@dataclass(kw_only=True)
class SuiteMargin:
    """A suite, the margin it must resolve, and whether its minimum detectable effect (MDE) does: what the paired
    comparison (SuiteDelta) and the preflight (packtrain.evaluate.power.SuitePower) both say of it."""

    suite: str
    role: str                      # primary | regression | task
    kind: str                      # text | task
    n: int | None                  # documents (paired); None: not known before evaluate
    margin: float | None = None    # |threshold|: max(configured, seed margin); None in verdicts before margins
    margin_source: str = "configured"   # configured | seed spread (k N, sd S): which one set the margin
    mde: float | None = None       # minimum detectable effect at the Holm level and register.promotion.power
    decides: bool | None = None    # mde ≤ the margin it must resolve (module doc); None: unknown / no champion


@dataclass(kw_only=True)
class SuiteDelta(SuiteMargin):
    """One suite's paired comparison."""

    unit: str                      # "bits/byte" | "accuracy drop"
    md5: str
    challenger: float              # challenger's bits/byte or accuracy
    champion: float | None         # the champion's, on the same documents (None: no champion)
    delta: float | None            # Δ (module doc); None without a champion
    ci_low: float | None           # two-sided bootstrap interval at `confidence` (unadjusted), for reading
    ci_high: float | None
    upper: float | None            # one-sided upper bound at the Holm-adjusted level (what is compared)
    level: float | None            # that level, e.g. 0.975 for the first of two suites at 95%
    threshold: float               # −delta | +epsilon | +epsilon_task
    test: str                      # superiority | non-inferiority
    p_value: float | None
    passed: bool | None            # None: no champion to compare against
    loss_per_token: dict[str, float] = field(default_factory=dict)   # text suites, same tokenizer only

    def line(self) -> str:
        if self.delta is None:
            return f"{self.suite} ({self.role}): challenger {self.challenger:.4f} {self._val_unit()}, n {self.n}"
        seed = " (seed-spread margin)" if self.margin_source.startswith("seed") else ""
        mde = f", MDE {self.mde:.4f}" if self.mde is not None else ""
        return (f"{self.suite} ({self.role}, {self.test}): Δ {self.delta:+.4f} {self.unit}, {100 * (self.level or 0):.2f}% "
                f"upper bound {self.upper:+.4f} {'<' if self.passed else '≥'} {self.threshold:+.4f}{seed} "
                f"(CI [{self.ci_low:+.4f}, {self.ci_high:+.4f}], n {self.n}, p {self.p_value:.4f}{mde})")

    def _val_unit(self) -> str:
        return "bits/byte" if self.kind == "text" else "accuracy"


@dataclass
class PromotionVerdict:
    """Whether the challenger takes the champion alias, and why (validation.json)."""

    promote: bool
    reason: str
    against: str | None            # "v3" (the champion scored), a model ref, or None (no champion)
    tokenizers_match: bool | None
    suites: list[SuiteDelta]
    config: dict
    note: str = ""                 # e.g. "tokenizers differ: compared in bits per byte"
    champion_domain: str = ""      # what measures the champion's domain (packtrain.evaluate.champion_domain)
    margins: str = ""              # where the margins came from, the assumed values named (margins_note)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PromotionVerdict:
        return cls(**{**d, "suites": [SuiteDelta(**s) for s in d["suites"]]})

    def tags(self) -> dict[str, str]:
        """Model-version tags, the ones a registry user filters on: the verdict, what it was against, why, and the
        suites that failed (`validation_failed`: "replay,wordorder", or "none"). Each suite's role, n, md5, Δ, CI
        and bound are in the register run's validation/validation.json (this verdict's to_dict; the version's
        tag packtrain.register_run_id names the run): as tags, 4 to 8 a suite made a version ~45 tags, its row
        in the registry page ~1,500 px tall."""
        failed = [s.suite for s in self.suites if s.passed is False]
        t = {"validation": "promote" if self.promote else "keep", "validation_reason": self.reason[:4000],
             "validation_against": self.against or "none", "validation_failed": ",".join(failed) or "none"}
        if self.champion_domain:   # what measured the champion's own domain (packtrain.evaluate.champion_domain)
            t["champion_domain"] = self.champion_domain[:4000]
        if self.margins and self.against:   # the margins of a paired decision: recorded, or which were assumed
            t["validation_margins"] = self.margins[:4000]
        return t


def _seed(seed: int, suite: str) -> list[int]:
    return [int(seed), zlib.crc32(suite.encode("utf-8"))]


def bootstrap(num: np.ndarray, den: np.ndarray | None, resamples: int, seed: list[int],
              block: int = 256) -> np.ndarray:
    """[resamples] replicates of Σ num / Σ den (den None: mean of num) over documents drawn with replacement.

    >>> r = bootstrap(np.zeros(5), None, 100, [0, 1]); float(r.min()), float(r.max())
    (0.0, 0.0)
    """
    n = len(num)
    rng = np.random.default_rng(seed)
    out = np.empty(resamples, np.float64)
    p = np.full(n, 1.0 / n)
    for i in range(0, resamples, block):
        k = min(block, resamples - i)
        counts = rng.multinomial(n, p, size=k).astype(np.float64)   # (k, n): how often each document is drawn
        out[i: i + k] = counts @ num / (counts @ den if den is not None else n)
    return out


def _point(num: np.ndarray, den: np.ndarray | None) -> float:
    return float(num.sum() / den.sum()) if den is not None else float(num.mean())


def suite_margin(role: str, kind: str, cfg: PromotionConfig, seed: dict | None, k: int = 0) -> tuple[float, str]:
    """(margin, its source) of one suite: the configured one (primary delta, regression epsilon, task
    epsilon_task) or, when larger, the seed margin t(confidence, k − 1)·sd·√2 of its seed-spread record entry
    (packtrain.evaluate.seed_spread), e.g. (0.0337, "seed spread (k 3, sd 0.008157)")."""
    from packtrain.evaluate.seed_spread import UNITS, seed_margin

    configured = cfg.delta if role == "primary" else (cfg.epsilon if role == "regression" else cfg.epsilon_task)
    if seed is None or seed.get("unit") != UNITS.get(kind) or k < 3:
        return float(configured), "configured"
    sm = seed_margin(float(seed["sd"]), k, cfg.confidence)
    if sm <= configured:
        return float(configured), f"configured (≥ seed margin {sm:.4f})"
    return sm, f"seed spread (k {k}, sd {float(seed['sd']):.4g})"


def suite_delta(s: dict, cfg: PromotionConfig, seed: dict | None = None, k: int = 0
                ) -> tuple[SuiteDelta, np.ndarray | None]:
    """The point estimate and bootstrap replicates of one suite. `s`: {"suite", "role", "kind", "md5",
    "challenger": {"nll", "tokens", "bytes"} or {"acc"}, "champion": same or None, "same_tokenizer"}; `seed`:
    the suite's entry of a seed-spread record of `k` seeds (sets the margin, suite_margin)."""
    ch, cp, kind = s["challenger"], s.get("champion"), s["kind"]
    margin, source = suite_margin(s["role"], kind, cfg, seed, k)
    threshold = (-margin if margin else 0.0) if s["role"] == "primary" else margin
    if kind == "text":
        den = np.asarray(ch["bytes"], np.float64) * LN2
        value = _point(np.asarray(ch["nll"]), den)
        champ = _point(np.asarray(cp["nll"]), den) if cp is not None else None
        num = np.asarray(ch["nll"], np.float64) - np.asarray(cp["nll"], np.float64) if cp is not None else None
        unit = "bits/byte"
    else:
        acc_ch = np.asarray(ch["acc"], np.float64)
        value, den = float(acc_ch.mean()), None
        champ = float(np.asarray(cp["acc"]).mean()) if cp is not None else None
        num = np.asarray(cp["acc"], np.float64) - acc_ch if cp is not None else None
        unit = "accuracy drop"
    lpt = {}
    if kind == "text" and s.get("same_tokenizer") and cp is not None:
        tok = float(np.sum(ch["tokens"]))
        lpt = {"challenger": float(np.sum(ch["nll"])) / tok, "champion": float(np.sum(cp["nll"])) / tok}
    d = SuiteDelta(suite=s["suite"], role=s["role"], kind=kind, n=len(ch["nll"] if kind == "text" else ch["acc"]),
                   margin=margin, margin_source=source, unit=unit, md5=s["md5"], challenger=value, champion=champ,
                   delta=None, ci_low=None, ci_high=None, upper=None, level=None, threshold=threshold,
                   test="superiority" if s["role"] == "primary" else "non-inferiority", p_value=None, passed=None,
                   loss_per_token=lpt)
    if num is None:
        return d, None
    reps = bootstrap(num, den, cfg.resamples, _seed(cfg.seed, s["suite"]))
    alpha = 1.0 - cfg.confidence
    d.delta = _point(num, den)
    d.ci_low, d.ci_high = (float(x) for x in np.quantile(reps, [alpha / 2, 1 - alpha / 2], method="higher"))
    d.p_value = float((1 + np.count_nonzero(reps >= threshold)) / (1 + len(reps)))
    return d, reps


def holm(deltas: list[SuiteDelta], reps: list[np.ndarray], confidence: float, power: float = 0.8,
         resolve: dict[str, float] | None = None) -> None:
    """Holm step-down in place (module doc): sets level, upper and passed of every suite; and its MDE at that
    level and `power` from the bootstrap's sd, `decides` = MDE ≤ max(margin, resolve[kind]) for a primary suite
    (a superiority margin of 0 can never be resolved: it must see an effect of the regression margin's size),
    MDE ≤ margin for the others."""
    from packtrain.evaluate.seed_spread import mde

    alpha, m = 1.0 - confidence, len(deltas)
    order = sorted(range(m), key=lambda i: (deltas[i].p_value, deltas[i].suite))
    failed = False
    for k, i in enumerate(order):
        d, a_k = deltas[i], alpha / (m - k)
        d.level = 1.0 - a_k
        d.upper = float(np.quantile(reps[i], 1.0 - a_k, method="higher"))
        failed = failed or not (d.p_value is not None and d.p_value < a_k and d.upper < d.threshold)
        d.passed = not failed
        d.mde = mde(float(np.std(reps[i], ddof=1)), a_k, power)
        need = abs(d.threshold)
        if d.role == "primary" and resolve:
            need = max(need, resolve.get(d.kind, 0.0))
        d.decides = d.mde <= need


def margins_note(spread: dict | None, deltas: list[SuiteDelta], cfg: PromotionConfig) -> str:
    """One line: where the margins came from, e.g. "margins from the seed-spread record seed_spread_tiny-cpu.json
    (recipe tiny-cpu, k 3 seeds): recent 0.0337 bits/byte, wordorder 0.1732 accuracy", or "no seed-spread record
    for recipe r (…): the configured margins are assumed — delta 0, epsilon 0.01, epsilon_task 0.02"."""
    configured = f"delta {cfg.delta:g}, epsilon {cfg.epsilon:g}, epsilon_task {cfg.epsilon_task:g}"
    if not spread or not spread.get("suites"):
        why = (spread or {}).get("note") or "no seed-spread record: the configured margins are assumed"
        return f"{why} — {configured} (a rerun differing only in train.seed is not accounted for)"
    per = ", ".join(f"{d.suite} {d.margin:.4f} {'bits/byte' if d.kind == 'text' else 'accuracy'}"
                    + ("" if d.margin_source.startswith("seed") else " (configured)") for d in deltas)
    return f"{spread['note']}: {per}"


def decide_promotion(suites: list[dict], cfg: PromotionConfig, against: str | None,
                     tokenizers_match: bool | None, spread: dict | None = None) -> PromotionVerdict:
    """The verdict over all suites (module doc). `against` None: no champion, the challenger is promoted as
    the first champion. `spread`: the seed-spread entry of suites.json (packtrain.evaluate.seed_spread
    .resolve_seed_spread): each suite's margin is at least its recorded seed margin."""
    conf = cfg.model_dump()
    if not suites:
        return PromotionVerdict(False, "no suite was scored: nothing to decide on", against, tokenizers_match, [], conf)
    recorded, k = (spread or {}).get("suites") or {}, int((spread or {}).get("k") or 0)
    pairs = [suite_delta(s, cfg, recorded.get(s["suite"]), k) for s in suites]
    deltas = [d for d, _ in pairs]
    margins = margins_note(spread, deltas, cfg)
    notes = ["tokenizers differ: every text suite compared in bits per byte (per-token losses are not comparable)"
             if tokenizers_match is False else "", margins]
    note = "; ".join(n for n in notes if n)
    if against is None:
        return PromotionVerdict(True, "first champion: no version held the champion alias (the challenger was "
                                "scored alone)", None, None, deltas, conf, note, margins=margins)
    resolve = {"text": max([d.margin or 0.0 for d in deltas if d.kind == "text" and d.role != "primary"]
                           + [cfg.epsilon]),
               "task": max([d.margin or 0.0 for d in deltas if d.kind == "task"] + [cfg.epsilon_task])}
    holm(deltas, [r for _, r in pairs], cfg.confidence, cfg.power, resolve)   # type: ignore[misc]
    bad = [d for d in deltas if not d.passed]
    primary = [d for d in deltas if d.role == "primary"]
    if not primary:
        return PromotionVerdict(False, "no primary suite: nothing must improve, so nothing is promoted",
                                against, tokenizers_match, deltas, conf, note, margins=margins)
    if bad:
        reason = f"not promoted over {against}: " + "; ".join(
            (f"{d.suite} ({d.role}) not {'improved' if d.role == 'primary' else 'non-inferior'}: " + d.line())
            for d in bad)
    else:
        reason = f"promoted over {against}: " + "; ".join(d.line() for d in deltas)
    return PromotionVerdict(not bad, reason, against, tokenizers_match, deltas, conf, note, margins=margins)


def verdict_markdown(v: PromotionVerdict) -> str:
    """validation.md: the verdict, one table row per suite (with its n, margin, MDE and whether it can decide)."""
    c = v.config
    lines = [f"# Validation: {'PROMOTE' if v.promote else 'KEEP CHAMPION'}", "", v.reason, ""]
    if v.note:
        lines += [f"> {v.note}", ""]
    lines += [f"Against: {v.against or 'no champion'}. Paired bootstrap over documents, {c['resamples']} resamples "
              f"(seed {c['seed']}), Holm across {len(v.suites)} suite(s) at {100 * c['confidence']:.1f}%; "
              f"delta {c['delta']:g}, epsilon {c['epsilon']:g} bits/byte, epsilon_task {c['epsilon_task']:g}; "
              f"MDE at power {c.get('power', 0.8):g}.", "",
              "| suite | role | n | challenger | champion | Δ | CI | level | upper | threshold | margin from | MDE "
              "| decides | pass | md5 |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(x: float | None, sign: bool = False) -> str:
        return "–" if x is None else (f"{x:+.4f}" if sign else f"{x:.4f}")

    def yes(b: bool | None) -> str:
        return "–" if b is None else ("yes" if b else "NO")

    for s in v.suites:
        ci = "–" if s.ci_low is None else f"[{s.ci_low:+.4f}, {s.ci_high:+.4f}]"
        lines.append(f"| {s.suite} | {s.role} | {s.n} | {f(s.challenger)} | {f(s.champion)} | {f(s.delta, True)} "
                     f"{s.unit} | {ci} | {f(s.level)} | {f(s.upper, True)} | {s.threshold:+.4f} | {s.margin_source} "
                     f"| {f(s.mde)} | {yes(s.decides)} | {yes(s.passed)} | `{s.md5}` |")
    return "\n".join(lines) + "\n"
