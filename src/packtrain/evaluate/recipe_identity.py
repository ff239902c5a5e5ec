"""What recipe a model was trained with, recorded on its version, so that a retraining that differs from the champion
only in `train.seed` is never promoted, whatever seed-spread record there is.

The register stage tags every version trained in the run (train_result.json present) with

    packtrain.config_hash   recipe_hash of its config: ingest, validate, tokenize, pack, model, train minus
                            train.seed and WEIGHT_NEUTRAL_FIELDS (packtrain.evaluate.seed_spread), e.g. 376136144b0aa992
    packtrain.train_seed    its train.seed, e.g. 0

The train stage records its own in train_result.json (`recipe`); the evaluate stage writes the challenger's (that
record beside the model, else its own config's) in suites.json (`challenger.recipe`) and the champion's (its
version's tags, `against.recipe`). Then:

    same config hash, another seed, a start that   → a seed rerun: the recipe is the champion's, only the seed
    cannot move (scratch, a directory, models:/N/3), differs; NOT promoted, whatever the suites say (a seed margin
    and the same held-out split (champion_domain     bounds that to 1 − confidence; this makes it certain), the
    status recent: the same documents, split alike)  reason names both seeds and the config
    init_from champion / models:/N@alias             → not a rerun: it started from another model than the
                                                       champion did (warm start), the suites decide
    no tags (registered before, or by hand)          → the suites decide

The seed-spread record (`seed_spread: auto`) measured for the champion's config is used even when this run's config
differs from it (a seed rerun trained one step longer: resolve_seed_spread's `champion_hash`): the champion is one
draw of that recipe, and its seed spread is the noise the comparison must exceed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packtrain.config import RunConfig

CONFIG_TAG, SEED_TAG, SPLIT_TAG = "packtrain.config_hash", "packtrain.train_seed", "packtrain.split_hash"


def recipe_identity(cfg: RunConfig) -> dict:
    """{"config_hash", "split_hash", "train_seed", "init_from"} of the run config `cfg` (suites.json
    `challenger.recipe`); split_hash (seed_spread.split_hash) names the held-out split's settings alone."""
    from packtrain.evaluate.seed_spread import recipe_hash, split_hash

    return {"config_hash": recipe_hash(cfg), "split_hash": split_hash(cfg), "train_seed": int(cfg.train.seed),
            "init_from": cfg.model.init_from}


def challenger_identity(cfg: RunConfig, model_dir: Path) -> dict:
    """The recipe of the model in `model_dir`: the one its train stage recorded beside it (<train out>/model →
    <train out>/train_result.json `recipe`), else this (evaluate) config's — a model trained with
    `--set train.seed=1` and evaluated by a command without that setting is still seed 1."""
    import json

    try:
        recorded = json.loads((Path(model_dir).parent / "train_result.json").read_text(encoding="utf-8")).get("recipe")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if isinstance(recorded, dict) and recorded.get("config_hash") and recorded.get("train_seed") is not None:
        return {"config_hash": str(recorded["config_hash"]), "split_hash": recorded.get("split_hash"),
                "train_seed": int(recorded["train_seed"]), "init_from": recorded.get("init_from")}
    return recipe_identity(cfg)


def identity_of_tags(tags: dict | None) -> dict | None:
    """A registered version's recipe from its tags (suites.json `against.recipe`), None when it records none.

    >>> identity_of_tags({"packtrain.config_hash": "ab12", "packtrain.train_seed": "0"})
    {'config_hash': 'ab12', 'train_seed': 0}
    """
    t = tags or {}
    if not t.get(CONFIG_TAG) or t.get(SEED_TAG) in (None, ""):
        return None
    try:
        return {"config_hash": str(t[CONFIG_TAG]), "train_seed": int(t[SEED_TAG])}
    except (TypeError, ValueError):
        return None


def identity_tags(manifest: dict) -> dict[str, str]:
    """The version tags of the challenger of an evaluation (suites.json), {} when it recorded none."""
    r = (manifest.get("challenger") or {}).get("recipe") or {}
    if not r.get("config_hash"):
        return {}
    return {CONFIG_TAG: str(r["config_hash"]), SEED_TAG: str(r["train_seed"]),
            **({SPLIT_TAG: str(r["split_hash"])} if r.get("split_hash") else {})}


def seed_rerun_line(manifest: dict) -> str | None:
    """"<challenger> differs from v1 only in train.seed (…)" when the evaluation's challenger is a seed rerun of the
    registered version it was compared with (module doc), else None.

    >>> m = {"challenger": {"recipe": {"config_hash": "ab", "train_seed": 1, "init_from": "scratch"}},
    ...      "against": {"label": "v1", "recipe": {"config_hash": "ab", "train_seed": 0}},
    ...      "champion_domain": {"status": "recent"}}
    >>> seed_rerun_line(m)[:60]
    'the challenger differs from v1 only in train.seed (1, v1 0; '
    """
    from packtrain.model.init_from import is_registry_source

    ch = (manifest.get("challenger") or {}).get("recipe") or {}
    ag = manifest.get("against") or {}
    cp = ag.get("recipe") or {}
    init = str(ch.get("init_from") or "scratch")
    moving = is_registry_source(init) and not (init.startswith("models:/") and "@" not in init)
    same_data = (manifest.get("champion_domain") or {}).get("status") == "recent"   # its held-out packs are ours
    if not ch.get("config_hash") or not cp.get("config_hash") or moving or ag.get("same") or not same_data:
        return None
    if ch["config_hash"] != cp["config_hash"] or ch.get("train_seed") == cp.get("train_seed"):
        return None
    label = ag.get("label")
    return (f"the challenger differs from {label} only in train.seed ({ch['train_seed']}, {label} "
            f"{cp['train_seed']}; config {ch['config_hash']}, init {init}): a seed rerun is not an improvement")


def guard_seed_rerun(v, manifest: dict):
    """The verdict `v` with a promotion refused when the challenger is a seed rerun of the champion (module doc)."""
    line = seed_rerun_line(manifest)
    if line is None or v.against is None or not v.promote:
        return v
    v.promote = False
    v.reason = f"not promoted over {v.against}: {line} (the suites alone: {v.reason})"
    return v
