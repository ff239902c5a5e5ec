"""The champion's own domain, always a regression suite: what the champion was evaluated on stays measured.

A registered version records where its held-out documents are — the eval packs its evaluation scored as suite
"recent" (packtrain.evaluate.suites.recent_suite) — as version tags, written by the register stage from the
evaluation's suites.json (`heldout_tags`):

    heldout.path   /abs/data/kfp/packtrain-2026-12-06-…/pack/packs/eval     the eval pack store
    heldout.md5    9a2b….dir                                                its DVC md5 (as suite recent's md5)
    heldout.n      37                                                       documents scored then

Whenever the challenger is compared with a registered version (the champion, or `--against models:/…`), the
evaluation looks those tags up (`champion_domain`) and, whatever the recipe's suites say:

    found, md5 matches, not this run's held-out split   → suite "champion_domain" (role regression, documents
                                                          decoded with the champion's own tokenizer, which
                                                          made those packs), scored for both models
    the same packs as this run's suite recent          → nothing added: suite recent already measures it
    no tags, the path gone, or its md5 changed          → one plain line, "nothing measures the champion's
                                                          domain: …", in suites.json, validation.json (verdict
                                                          field `champion_domain`), the summary and the version's
                                                          tag `champion_domain`; the promotion is refused unless
                                                          register.promotion.allow_unguarded is true

A challenger warm-started from the champion and trained only on a new, easier domain improves on its own
held-out split (suite recent) and loses on the champion's: suite champion_domain fails non-inferiority, and the
reason names it with its CI (docs/validation.md). The scheduled retrain's suite "replay"
(packtrain.pipeline.retrain) measures the previous data version the same way on that path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packtrain.config import RunConfig
    from packtrain.evaluate.suite_types import TextSuite

SUITE = "champion_domain"
"""Name of the suite of the champion's held-out documents (tags `suite.champion_domain.*`)."""
UNGUARDED = "nothing measures the champion's domain"
"""How the plain line starts when the champion's held-out documents cannot be found."""
PATH_TAG, MD5_TAG, N_TAG = "heldout.path", "heldout.md5", "heldout.n"
VERSION_TAG = "champion_domain"
"""Version tag of a registration whose champion's domain was not measured: the plain line."""


@dataclass
class ChampionDomain:
    """How the champion's domain is measured in one evaluation (suites.json key "champion_domain")."""

    status: str                     # scored | recent | unguarded
    line: str                       # one plain line: what measures it, or "nothing measures the champion's domain: …"
    path: str | None = None         # the champion's held-out packs
    md5: str | None = None
    suite: TextSuite | None = None  # status scored: the suite to score

    def describe(self) -> dict:
        return {"status": self.status, "line": self.line, "path": self.path, "md5": self.md5,
                "suite": SUITE if self.suite is not None else None}


def heldout_tags(manifest: dict) -> dict[str, str]:
    """The version tags recording where a model's held-out documents are, from its evaluation's suites.json
    (the suite "recent" entry); {} when it scored none.

    >>> heldout_tags({"suites": [{"name": "recent", "path": "/d/eval", "md5": "ab.dir", "n": 37}]})
    {'heldout.path': '/d/eval', 'heldout.md5': 'ab.dir', 'heldout.n': '37'}
    """
    for s in manifest.get("suites") or []:
        if s.get("name") == "recent" and s.get("path"):
            return {PATH_TAG: str(s["path"]), MD5_TAG: str(s.get("md5")), N_TAG: str(s.get("n"))}
    return {}


def champion_domain(label: str, tags: dict[str, str], champion_dir: Path, recent_md5: str | None,
                    max_documents: int | None = None) -> ChampionDomain:
    """How the domain of the registered version `label` ("v3", tags `tags`, downloaded to `champion_dir`) is
    measured (module doc). `recent_md5`: the DVC md5 of this run's eval packs when suite recent is scored."""
    from packtrain.versioning import data_md5

    path, md5 = tags.get(PATH_TAG), tags.get(MD5_TAG)
    if not path:
        return ChampionDomain("unguarded", f"{UNGUARDED}: {label} records no held-out documents (no version tag "
                              f"{PATH_TAG}; registered before packtrain recorded them, or without an evaluation)")
    where = Path(path)
    if not where.is_dir():
        return ChampionDomain("unguarded", f"{UNGUARDED}: {label}'s held-out documents {path} (version tag "
                              f"{PATH_TAG}) do not exist", path, md5)
    now = data_md5(where)
    if md5 and now != md5:
        return ChampionDomain("unguarded", f"{UNGUARDED}: {label}'s held-out documents {path} changed since it "
                              f"was evaluated (md5 {now}, version tag {MD5_TAG} {md5})", path, md5)
    if recent_md5 is not None and now == recent_md5:
        return ChampionDomain("recent", f"{label}'s domain is this run's held-out split: suite recent measures "
                              "it", path, now)
    from packtrain.data.tokenizer_setup import tokenizer_class
    from packtrain.errors import InputDataError
    from packtrain.evaluate.suites import recent_suite

    # the tokenizer that made the champion's packs (a trained BPE: loaded without AutoTokenizer's torch import)
    tok = tokenizer_class(champion_dir).from_pretrained(str(champion_dir))
    try:
        suite = recent_suite("regression", where, tok, max_documents, name=SUITE)
    except (InputDataError, OSError, ValueError) as e:
        return ChampionDomain("unguarded", f"{UNGUARDED}: {label}'s held-out documents {path} cannot be read "
                              f"({str(e)[:200]})", path, md5)
    return ChampionDomain("scored", f"{label}'s domain: its held-out documents {path} scored as suite {SUITE} "
                          f"(regression, {len(suite.docs)} documents)", path, now, suite)


def champion_version(cfg: RunConfig) -> tuple[str | None, str | None, dict[str, str]]:
    """What the stage cache keys hold of the champion (`register.model_name@champion`) without downloading it:
    ("models:/NAME/V", "V", its version tags); (None, None, {}) with none yet, `evaluate.against` none or tracking
    off; ("unresolved <ns>", None, {}) when the registry cannot be read: a key that never repeats (a miss, never a
    stale result)."""
    import time

    if cfg.evaluate.against != "champion" or not cfg.tracking.enabled:
        return None, None, {}
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from packtrain.tracking import resolve_tracking_uri
    from packtrain.tracking.transport import short_http

    uri = resolve_tracking_uri(cfg)
    try:
        with short_http(uri, 10):   # a store that is down answers at once: no MLflow retries (~2 min)
            mv = MlflowClient(tracking_uri=uri, registry_uri=uri).get_model_version_by_alias(
                cfg.register_.model_name, "champion")
    except MlflowException as e:
        missing = e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")
        return (None if missing else f"unresolved {time.time_ns()}"), None, {}
    except Exception:   # an unreachable store
        return f"unresolved {time.time_ns()}", None, {}
    return f"models:/{cfg.register_.model_name}/{mv.version}", str(mv.version), dict(mv.tags or {})


def same_split(tags: dict[str, str], cfg: RunConfig, data_version: str | None) -> bool:
    """Whether the champion's held-out documents are this run's own held-out split: it was trained on the same
    source data (version tag `dataset_md5` = this chain's lineage data_version) with the same split settings
    (`packtrain.split_hash` = seed_spread.split_hash of `cfg`: ingest, validate, tokenize; a version registered
    before that tag: `packtrain.config_hash` = recipe_hash, the whole recipe but the seed), so tokenize splits
    the same documents off — and the contamination check reads that split (validate.contamination.held_out,
    tokenize.eval_fraction > 0), so it checks them already. A rerun on unchanged data, or a model or train change
    on it, keeps its validate and tokenize cache keys. The one answer for the check
    (contamination_sources.champion_documents) and its cache key (champion_domain_identity)."""
    if not data_version or tags.get("dataset_md5") != data_version:
        return False
    if not (cfg.validate_.contamination.held_out and cfg.tokenize.eval_fraction > 0):
        return False
    from packtrain.evaluate.recipe_identity import CONFIG_TAG, SPLIT_TAG
    from packtrain.evaluate.seed_spread import recipe_hash, split_hash

    if tags.get(SPLIT_TAG):
        return tags[SPLIT_TAG] == split_hash(cfg)
    return tags.get(CONFIG_TAG) == recipe_hash(cfg)


def champion_domain_identity(cfg: RunConfig, documents: str | Path | None = None) -> dict | None:
    """What the contamination check reads of the champion (packtrain.data.contamination_sources.
    champion_documents) for the validate and tokenize stage cache keys, without downloading it: its version
    and the DVC md5 its recorded held-out documents (version tag heldout.path) have now ("missing" when gone);
    None without a champion, or when its held-out documents are the held-out split of `documents` (the stage's
    input, the ingest output: `same_split` with its lineage data_version)."""
    from packtrain.stages.lineage import documents_data_version
    from packtrain.versioning import data_md5

    champion, _, tags = champion_version(cfg)
    if champion is None or same_split(tags, cfg, documents_data_version(documents)):
        return None
    path = Path(tags[PATH_TAG]) if tags.get(PATH_TAG) else None
    return {"champion": champion, "heldout": (data_md5(path) if path.is_dir() else "missing") if path else None,
            "max_documents": cfg.evaluate.recent_max_documents}   # how many of them the check reads


def unguarded_line(manifest: dict) -> str | None:
    """The plain line of an evaluation (suites.json) that could not measure the champion's domain, else None."""
    cd = manifest.get("champion_domain") or {}
    return cd.get("line") if cd.get("status") == "unguarded" else None
