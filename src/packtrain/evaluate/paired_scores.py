"""One evaluation, both models: challenger and champion scored on every suite with the same code.

    resolve_against(cfg, "champion" | "models:/NAME/V" | "models:/NAME@ALIAS" | DIR) -> Against | None
    score_suites(models, suites, cfg: EvalConfig) -> (table rows, per-suite task metrics)
    write_scores(out_dir, rows, manifest)         suite_scores.parquet + suites.json
    read_decision_input(eval_dir) -> (suites for packtrain.evaluate.promotion.decide_promotion, manifest)

suite_scores.parquet, one row per (suite, model, document):

    suite    role        kind  model       doc_id  nll (nats)  tokens  bytes  acc
    recent   primary     text  challenger  17      812.4       301     1204   null
    recent   primary     text  champion    17      845.0       301     1204   null
    arith    task        task  challenger  0       null        0       0      1.0

Both models see the same documents, budget (`evaluate.suite_budget`), rows, precision and attention backend;
a task suite runs through lm-evaluation-harness on the in-memory model (packtrain.evaluate.tasks). The models are
loaded one at a time. suites.json records every suite's md5, n and path, both models (directory md5, tokenizer
hash, registry version) and the settings used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packtrain.errors import ConfigError, InputDataError, MissingDataError

if TYPE_CHECKING:
    from packtrain.config import EvalConfig, RunConfig
    from packtrain.evaluate.champion_domain import ChampionDomain
    from packtrain.evaluate.loading import Loaded
    from packtrain.evaluate.suite_types import Suite

SCORES_FILE, MANIFEST_FILE = "suite_scores.parquet", "suites.json"
COLUMNS = ("suite", "role", "kind", "model", "doc_id", "nll", "tokens", "bytes", "acc")


@dataclass(frozen=True)
class Against:
    """The model the challenger is compared with."""

    label: str                 # "v3" (registry) or the directory
    model_dir: Path
    uri: str | None            # models:/NAME/3
    version: str | None
    same: bool = False         # the champion is this very model (equal md5): scored once, Δ = 0 exactly
    tags: dict | None = None   # the registry version's tags (its lineage: packtrain.evaluate.champion_domain)


def resolve_against(cfg: RunConfig, ref: str, challenger: Path | None = None) -> tuple[Against | None, str]:
    """(the model to compare with, a note). "champion": `register.model_name@champion` of the run's registry,
    None when there is none yet (or tracking is off); when the champion is this very model (its version's
    `model_md5` tag equals the md5 of `challenger`, a rerun on unchanged data) it is not downloaded: an Against
    with `same` set, whose scores are the challenger's (Δ = 0 exactly, not promoted);
    models:/… a registry version; else a model directory."""
    from packtrain.model.init_from import is_registry_source
    from packtrain.registry.source import cache_dir, download_version, registry_ref

    if ref == "none":
        return None, "evaluate.against is none: the challenger is scored alone"
    if ref != "champion" and not is_registry_source(ref):
        path = Path(ref)
        if not (path / "config.json").is_file():
            raise MissingDataError(f"--against {ref!r}: not champion, a models:/ URI or a model directory with "
                                   "config.json")
        return Against(str(path), path, None, None), f"compared with the model in {path}"
    if not cfg.tracking.enabled:
        if ref == "champion":
            return None, "tracking.enabled is false: no registry, the challenger is scored alone"
        raise ConfigError(f"--against {ref!r} needs the model registry: tracking.enabled is false")
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from packtrain.secrets import redact_text, redact_uri
    from packtrain.tracking import resolve_tracking_uri
    from packtrain.tracking.transport import is_transient, short_http

    uri = resolve_tracking_uri(cfg)
    name, alias, version = registry_ref(ref, cfg.register_.model_name)
    from packtrain.tracking.store_creation import ensure_store

    ensure_store(uri)   # a fresh sqlite store: created by one process at a time
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    try:
        with short_http(uri, 30):
            mv = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, version)
    except Exception as e:
        missing = isinstance(e, MlflowException) and e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")
        if ref == "champion" and missing:
            return None, f"no champion yet: {name}@champion does not exist, the challenger is scored alone"
        if ref == "champion" and is_transient(e):   # register then keeps any champion (decide_from_verdict)
            return None, (f"the registry at {redact_uri(uri)} cannot be read ({redact_text(str(e))[:160]}): the "
                          "challenger is scored alone, and register will not move an existing champion")
        if not (missing or is_transient(e) or isinstance(e, MlflowException)):
            raise
        raise MissingDataError(f"--against {ref!r}: not found in the registry at {redact_uri(uri)} "
                               f"({redact_text(str(e))[:200]})") from None
    v = str(mv.version)
    if ref == "champion" and challenger is not None:
        from packtrain.versioning import data_md5

        md5 = data_md5(challenger)
        if (mv.tags or {}).get("model_md5") == md5:
            return Against(f"v{v}", challenger, f"models:/{name}/{v}", v, same=True), (
                f"the champion {name} v{v} is this very model (model md5 {md5[:12]}): scored once, its scores "
                "are the challenger's (Δ = 0)")
    path = download_version(uri, name, v, cache_dir(cfg.workdir, name, v), run_id=mv.run_id, source=mv.source)
    return Against(f"v{v}", path, f"models:/{name}/{v}", v, tags=dict(mv.tags or {})), \
        f"compared with {name} v{v} ({ref})"


def evaluate_identity(cfg: RunConfig, model_md5: str | None = None) -> dict:
    """What the evaluate stage's output depends on beyond its inputs and config (the stage cache key): the
    champion version it is compared with, the md5 of every suite's files and the seed-spread record (its margins). An unreadable
    registry gives a key that never repeats (a miss, never a stale comparison: champion_version)."""
    import time

    from packtrain.evaluate.suites import suite_identity

    suites = {s.name: suite_identity(s.path, Path.cwd()) for s in cfg.evaluate.suites}   # a task: its data files too
    from packtrain.evaluate.champion_domain import champion_version
    from packtrain.evaluate.recipe_identity import CONFIG_TAG

    champion, version, tags = champion_version(cfg)
    # ("v1", its packtrain.config_hash): its seed-spread record
    champion_hash = (f"v{version}", str(tags[CONFIG_TAG])) if tags.get(CONFIG_TAG) else None
    if model_md5 and tags.get("model_md5") == model_md5:
        # the champion is this very model: keyed as with none, so a rerun on unchanged data restores the first
        # run's evaluation (and its registration) from the cache instead of registering the same weights again;
        # evaluated afresh (no cache) it is scored once with Δ = 0 (resolve_against)
        champion, champion_hash = None, None
    from packtrain.evaluate.seed_spread import resolve_seed_spread

    try:
        sp = resolve_seed_spread(cfg, champion=champion_hash)
        # the record used (or none), not this run's config hash: whether it applies follows from the sections the
        # stage table declares for evaluate, and a corpus in another directory must not move the key
        spread = f"{sp.get('path')} {sp.get('md5')}"
    except Exception as e:   # the evaluate stage itself reports it, with its exit code
        spread = f"unresolved {type(e).__name__} {time.time_ns()}"
    return {"champion": champion, "suites": suites, "seed_spread": spread}


def score_suites(models: list[tuple[str, Path]], suites: list[Suite], cfg: EvalConfig,
                 recent_packs: Path | None = None, challenger: Loaded | None = None,
                 timings: dict | None = None) -> tuple[list[dict], list[dict], dict]:
    """Score every suite with every model ((label, directory), challenger first): (table rows, task metrics
    [{"suite", "model", "metric", "value", "stderr"}], the suites as scored (with "recent" first when
    `recent_packs` is given)). The recent suite is decoded with the first model's tokenizer (the packs' own).
    `challenger`: the first model already loaded (loading.load_for_eval), used as it is. `timings`, when given,
    gets the seconds of the text suites' forwards (`text_forward_s`), the task suites (`tasks_s`), the loads
    of the other models (`load_s`) and the suites' decoding and encoding (`encode_s`, the recent suite's too)."""
    from packtrain.evaluate.suite_progress import SuiteBar
    from packtrain.telemetry.memory import frozen_heap

    with_recent = recent_packs is not None and cfg.recent_role != "off"
    progress = SuiteBar(len(models) * (len(suites) + int(with_recent)))   # the terminal's progress (module doc)
    scored = list(suites)
    encoded: dict[tuple, object] = {}   # (suite, tokenizer hash) → PackedDocs: a tokenizer's work done once
    spent = {"text_forward_s": 0.0, "tasks_s": 0.0, "load_s": 0.0, "encode_s": 0.0}
    # each model is freed by a collection after its suites: with what existed before frozen it walks only what the
    # loop made, not torch + transformers + mlflow (~0.3-1 s)
    with frozen_heap():
        rows, metrics = _score_models(models, scored, cfg, with_recent, recent_packs, challenger, progress, encoded,
                                      spent)
    if timings is not None:
        timings.update({k: round(v, 3) for k, v in spent.items()})
    return rows, metrics, {"suites": [s.describe() for s in scored]}


def _score_models(models: list[tuple[str, Path]], scored: list, cfg: EvalConfig, with_recent: bool,
                  recent_packs: Path | None, challenger: Loaded | None, progress, encoded: dict, spent: dict
                  ) -> tuple[list[dict], list[dict]]:
    """score_suites' loop: every model on every suite (`scored`, the recent suite inserted first by the first
    model when `with_recent`); fills `encoded` and `spent`."""
    import gc
    import time

    from packtrain.config.evaluate import eval_precision, forward_rows
    from packtrain.data.tokenizer_files import tokenizer_hash
    from packtrain.evaluate.docscore import pack_documents, score_packed
    from packtrain.evaluate.loading import load_for_eval
    from packtrain.evaluate.suite_types import TextSuite
    from packtrain.evaluate.suites import recent_suite

    rows, metrics = [], []   # type: tuple[list[dict], list[dict]]
    for k, (label, model_dir) in enumerate(models):
        t_load = time.perf_counter()
        ld = challenger if k == 0 and challenger is not None else load_for_eval(model_dir, cfg)
        spent["load_s"] += time.perf_counter() - t_load
        model, tok, backend, dev = ld.model, ld.tokenizer, ld.backend, ld.device
        precision, n_rows = eval_precision(cfg.precision, dev.type), forward_rows(cfg.rows, dev.type, cfg.suite_budget)
        t_enc = time.perf_counter()
        if k == 0 and with_recent and recent_packs is not None:
            scored.insert(0, recent_suite(cfg.recent_role, recent_packs, tok, cfg.recent_max_documents))
        tok_key = tokenizer_hash(model_dir) or f"model {k}"
        spent["encode_s"] += time.perf_counter() - t_enc
        for s in scored:
            if isinstance(s, TextSuite):
                key = (s.name, tok_key)
                if key not in encoded:
                    t_enc = time.perf_counter()
                    encoded[key] = pack_documents(s.docs, tok, cfg.suite_budget, suite=s.name)
                    spent["encode_s"] += time.perf_counter() - t_enc
                with progress.suite(s.name, label, len(s.docs)) as advance:
                    sc = score_packed(model, encoded[key], n_rows, precision, backend, dev,
                                      ld.compiled, on_docs=advance)
                spent["text_forward_s"] += sc.seconds
                rows += [{"suite": s.name, "role": s.role, "kind": "text", "model": label, "doc_id": d.doc_id,
                          "nll": float(sc.nll[i]), "tokens": int(sc.tokens[i]), "bytes": int(sc.bytes[i]),
                          "acc": None} for i, d in enumerate(s.docs)]
            else:
                from packtrain.evaluate.tasks import score_task

                t_task = time.perf_counter()
                # eager: lm-eval's batches have a shape each, no graph per shape
                with ld.eager(), progress.suite(s.name, label, s.max_documents) as advance:
                    res = score_task(model, tok, s, dev, on_items=advance)
                spent["tasks_s"] += time.perf_counter() - t_task
                metrics.append({"suite": s.name, "model": label, **res.metric})
                rows += [{"suite": s.name, "role": s.role, "kind": "task", "model": label, "doc_id": str(doc),
                          "nll": None, "tokens": 0, "bytes": 0, "acc": float(a)} for doc, a in res.per_doc]
        del model, ld
        gc.collect()
    return rows, metrics


def write_scores(out_dir: Path, rows: list[dict], manifest: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtrain.publish import write_json

    out_dir.mkdir(parents=True, exist_ok=True)
    types = {"nll": pa.float64(), "acc": pa.float64(), "tokens": pa.int64(), "bytes": pa.int64()}
    table = pa.table({c: pa.array([r[c] for r in rows], types.get(c, pa.string())) for c in COLUMNS})
    pq.write_table(table, out_dir / SCORES_FILE)
    write_json(out_dir / MANIFEST_FILE, manifest)


def read_decision_input(eval_dir: Path) -> tuple[list[dict], dict]:
    """(suites as packtrain.evaluate.promotion.suite_delta takes them, suites.json) from an evaluate output.
    A champion document missing from the challenger's rows (or the reverse) is an error: both were scored on
    the same documents, or the files were edited."""
    import pyarrow.parquet as pq

    man_path, scores_path = Path(eval_dir) / MANIFEST_FILE, Path(eval_dir) / SCORES_FILE
    for p in (man_path, scores_path):
        if not p.is_file():
            raise MissingDataError(f"{p} does not exist: run `packtrain evaluate` (it scores the challenger and the "
                                   "champion on every suite; the register stage decides from that)")
    try:
        manifest = json.loads(man_path.read_text(encoding="utf-8"))
        t = pq.read_table(scores_path).to_pydict()
    except (ValueError, OSError) as e:
        raise InputDataError(f"{eval_dir}: {MANIFEST_FILE}/{SCORES_FILE} cannot be read ({e})") from None
    against = (manifest.get("against") or {}).get("label")
    out = []
    for s in manifest["suites"]:
        per: dict[str, dict] = {}
        for i, name in enumerate(t["suite"]):
            if name == s["name"]:
                per.setdefault(t["model"][i], {})[t["doc_id"][i]] = i
        ch = per.get("challenger") or {}
        cp = per.get("champion") if against else None
        if cp is not None and set(cp) != set(ch):
            raise InputDataError(f"{scores_path}: suite {s['name']!r} has {len(ch)} challenger and {len(cp)} champion "
                                 "documents that do not match one to one")
        ids = list(ch)
        out.append({"suite": s["name"], "role": s["role"], "kind": s["kind"], "md5": s["md5"],
                    "challenger": _columns(t, ch, ids), "champion": _columns(t, cp, ids) if cp is not None else None,
                    "same_tokenizer": manifest.get("tokenizers_match")})
    return out, manifest


def _columns(t: dict, idx: dict, ids: list) -> dict:
    """{"nll", "tokens", "bytes", "acc"} arrays of one model's rows, in the order of `ids`."""
    import numpy as np

    def value(c: str, d: str) -> float:
        v = t[c][idx[d]]
        return np.nan if v is None else v

    return {c: np.array([value(c, d) for d in ids], np.float64 if c in ("nll", "acc") else np.int64)
            for c in ("nll", "tokens", "bytes", "acc")}


def paired_manifest(challenger: Path, against: Against | None, note: str, cfg: EvalConfig, scored: dict) -> dict:
    """suites.json (module doc)."""
    from packtrain.data.tokenizer_files import tokenizer_hash
    from packtrain.versioning import data_md5

    ch_tok = tokenizer_hash(challenger)
    ag = None
    match = None
    if against is not None:
        ag_tok = tokenizer_hash(against.model_dir)
        match = ch_tok == ag_tok
        ag = {"label": against.label, "uri": against.uri, "version": against.version,
              "model_dir": str(against.model_dir), "model_md5": data_md5(against.model_dir), "tokenizer_hash": ag_tok,
              "same": against.same}
    return {"challenger": {"model_dir": str(challenger), "model_md5": data_md5(challenger), "tokenizer_hash": ch_tok},
            "against": ag, "note": note, "tokenizers_match": match,
            "settings": {"precision": cfg.precision, "attention": cfg.attention, "budget": cfg.suite_budget,
                         "rows": cfg.rows, "device": cfg.device},
            **scored}


def _champion_recipe(against: Against | None) -> dict | None:
    """The recipe the registered version compared with was trained with (its version tags), or None."""
    from packtrain.evaluate.recipe_identity import identity_of_tags

    return identity_of_tags(against.tags) if against is not None and against.version is not None else None


def measure_champion_domain(cfg: EvalConfig, against: Against | None, recent_packs: Path | None
                            ) -> ChampionDomain | None:
    """How the registered version compared with is measured on its own held-out documents
    (packtrain.evaluate.champion_domain);
    None for no champion, a model directory or the challenger itself. `recent_packs`: this run's eval packs
    (None: not scored, so the champion's documents are read even when they are this run's)."""
    if against is None or against.same or against.version is None:
        return None
    from packtrain.evaluate.champion_domain import champion_domain
    from packtrain.versioning import data_md5

    scored = recent_packs is not None and cfg.recent_role != "off"
    recent_md5 = data_md5(Path(recent_packs).resolve()) if scored and recent_packs is not None else None
    return champion_domain(against.label, against.tags or {}, against.model_dir, recent_md5,
                           cfg.recent_max_documents)


def paired_evaluation(cfg: RunConfig, challenger: Path, ref: str, out_dir: Path,
                      recent_packs: Path | None = None, loaded: Loaded | None = None,
                      timings: dict | None = None) -> tuple[dict, list[dict]]:
    """Resolve `ref`, load the suites, score both models, write suite_scores.parquet + suites.json into
    `out_dir`; returns (manifest, task metrics). `loaded`: the challenger already loaded (the evaluate stage);
    `timings` (given) gets score_suites' seconds, the champion's resolution and download (`against_s`) and the
    manifest's hashes + the scores' write (`write_s`)."""
    import time

    from packtrain.evaluate.recipe_identity import challenger_identity
    from packtrain.evaluate.seed_spread import resolve_seed_spread
    from packtrain.evaluate.suites import load_suites

    suites = load_suites(cfg.evaluate)   # bad suites fail before any model is loaded or downloaded
    spread = resolve_seed_spread(cfg)    # so does a seed-spread record of another recipe
    t0 = time.perf_counter()
    against, note = resolve_against(cfg, ref, Path(challenger))
    if against is not None and not against.same:
        from packtrain.versioning import hash_ahead

        hash_ahead(against.model_dir)   # its md5 (the manifest's) computed while the challenger is scored
    if timings is not None:
        timings["against_s"] = round(time.perf_counter() - t0, 3)
    models = [("challenger", Path(challenger))] + ([("champion", against.model_dir)] if against and not against.same
                                                   else [])
    champ = _champion_recipe(against)
    if champ is not None and not spread.get("path"):   # auto: the record of the champion's own config
        spread = resolve_seed_spread(cfg, champion=(against.label, champ["config_hash"]))  # type: ignore[union-attr]
    domain = measure_champion_domain(cfg.evaluate, against, recent_packs)
    if domain is not None and domain.suite is not None:
        suites = [*suites, domain.suite]
    rows, metrics, scored = score_suites(models, suites, cfg.evaluate, recent_packs, loaded, timings)
    if against is not None and against.same:   # identical weights: identical scores, without a second pass
        rows += [{**r, "model": "champion"} for r in rows]
        metrics += [{**m, "model": "champion"} for m in metrics]
    t_write = time.perf_counter()
    manifest = paired_manifest(Path(challenger), against, note, cfg.evaluate, scored)
    manifest["challenger"]["recipe"] = challenger_identity(cfg, Path(challenger))   # a seed rerun: never promoted
    if manifest["against"] is not None:
        manifest["against"]["recipe"] = champ
    if domain is not None:
        manifest["champion_domain"] = domain.describe()
    manifest["task_metrics"] = metrics
    manifest["seed_spread"] = spread
    write_scores(out_dir, rows, manifest)
    if timings is not None:
        timings["write_s"] = round(time.perf_counter() - t_write, 3)
    return manifest, metrics
