"""`model.init_from` resolved with the run config: registry sources become a local directory.

    resolve_init(cfg) -> InitSource(value, path, kind, name, version, uri, reason)
      scratch                  path None: random init from model.* sizes
      /path/to/dir             that directory (config.json checked by packtrain.model.init_from)
      models:/NAME/VERSION     the version, from the Model Registry of the run's tracking URI
      models:/NAME@ALIAS       the version the alias points to now
      champion                 models:/<register.model_name>@champion; while there is none (the first
                               scheduled run) → model.init_fallback (scratch or a directory), said on stderr
                               and in the train run's tags (packtrain.init_fallback_reason)

A registry version is downloaded once into

    <workdir>/models/<name>/v<version>/    config.json, model.safetensors, generation_config.json,
                                           tokenizer files, packtrain_source.json (what it is, written last)

built in a staging directory and published by one rename (packtrain.publish.publish_dir): a killed download
leaves nothing half-written, and a directory holding packtrain_source.json is complete and reused (registered
versions are immutable). What the registry holds is the MLflow model the register stage logged
(packtrain.registry.model): with the transformers flavor the HF directory is its `model/` (MLmodel
`model_binary`) and the tokenizer `components/tokenizer/`; with the pytorch fallback the save_pretrained copy
and the tokenizer in `extra_files/`. Nothing is unpickled: a pytorch-flavor version that holds only the pickle
is refused (exit 3) unless `model.allow_pickle: true`, which loads it with mlflow.pytorch.load_model and saves
it with save_pretrained (packtrain.model.logged_model).

Errors (nothing is written but the cache): a name, version or alias the registry does not have → exit 5
naming what it has; an unreachable store → exit 5 naming the cached versions to start from instead.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtrain.errors import InputDataError, MissingDataError
from packtrain.model.init_from import init_from_value, is_registry_source, resolve_init_source
from packtrain.model.saving import save_pretrained

if TYPE_CHECKING:
    from packtrain.config import ModelConfig, RunConfig

SOURCE_FILE = "packtrain_source.json"
"""Written last into a downloaded version: its presence means the directory is complete."""
MODELS_DIR = "models"


@dataclass(frozen=True)
class InitSource:
    """Where the weights of a run come from, after resolution."""

    value: str                    # model.init_from as configured: scratch | a directory | models:/… | champion
    path: Path | None             # the directory to load; None: random init
    kind: str                     # scratch | dir | registry
    name: str | None = None       # registered model (registry)
    version: str | None = None    # registered version (registry)
    uri: str | None = None        # models:/NAME/VERSION (registry)
    reason: str | None = None     # why model.init_fallback was used (None: it was not)

    @property
    def resolved(self) -> str:
        """One line: 'models:/lm/3', a directory, or 'scratch'."""
        return self.uri or (str(self.path) if self.path else "scratch")

    def model_config(self, model_cfg: ModelConfig) -> ModelConfig:
        """`model_cfg` whose init_from is the resolved directory (or scratch): what every consumer that only
        sees the ModelConfig (build_model, the memory planner) can load without the registry."""
        return model_cfg.model_copy(update={"init_from": str(self.path) if self.path else "scratch",
                                            "pretrained_dir": None})

    def tags(self) -> dict[str, str]:
        """MLflow tags of the train run (and, through train_result.json, of the registered version)."""
        tags = {"packtrain.init_from": self.value, "packtrain.init_resolved": self.resolved}
        if self.reason:
            tags["packtrain.init_fallback_reason"] = self.reason
        if self.version:
            tags["packtrain.parent_model_version"] = self.version
            tags["packtrain.parent_model"] = f"models:/{self.name}/{self.version}"
        return tags

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path) if self.path else None
        d["resolved"] = self.resolved
        return d


def registry_ref(value: str, default_name: str) -> tuple[str, str | None, str | None]:
    """(name, alias, version) of a registry source.

    >>> registry_ref("champion", "packtrain-lm"), registry_ref("models:/lm/3", "x"), registry_ref("models:/lm@a", "x")
    (('packtrain-lm', 'champion', None), ('lm', None, '3'), ('lm', 'a', None))
    """
    from packtrain.config.model import REGISTRY_URI

    if value == "champion":
        return default_name, "champion", None
    m = REGISTRY_URI.match(value)
    if not m:   # the config already checked the syntax; a model_copy may not have
        from packtrain.errors import ConfigError

        raise ConfigError(f"model.init_from {value!r}: a models:/ URI must be models:/NAME@ALIAS or "
                          "models:/NAME/VERSION")
    return m["name"], m["alias"], m["version"]


def cache_dir(workdir: str | Path, name: str, version: str) -> Path:
    """<workdir>/models/<name>/v<version> (a name's path-unsafe characters become '_')."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    if safe in (".", ".."):
        safe = "_"
    return Path(workdir) / MODELS_DIR / safe / f"v{version}"


def _say(msg: str) -> None:
    from packtrain.tracking.context import is_rank_zero

    if is_rank_zero():
        print(f"[packtrain] {msg}", file=sys.stderr, flush=True)


def resolve_init(cfg: RunConfig, model_cfg: ModelConfig | None = None, announce: bool = True) -> InitSource:
    """The init source of a run (module doc). `model_cfg` defaults to cfg.model; `announce` prints the
    resolution (and any fallback) on stderr, rank 0 only."""
    model_cfg = model_cfg or cfg.model
    value = init_from_value(model_cfg)
    if value == "scratch":
        return InitSource(value, None, "scratch")
    if not is_registry_source(value):
        return InitSource(value, resolve_init_source(model_cfg), "dir")
    from packtrain.secrets import redact_uri
    from packtrain.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(cfg)
    shown = redact_uri(uri) or uri
    name, alias, version = registry_ref(value, cfg.register_.model_name)
    mv, missing = _find_version(uri, shown, value, name, alias, version, cfg.workdir)
    if mv is None:
        if value != "champion":
            raise MissingDataError(f"model.init_from {value!r}: {missing}")
        fallback = model_cfg.init_fallback
        reason = f"no champion yet: {missing}"
        path = resolve_init_source(model_cfg.model_copy(update={"init_from": fallback, "pretrained_dir": None}))
        if announce:
            _say(f"model.init_from=champion: {missing}; starting from model.init_fallback={fallback} instead "
                 "(the first run of a scheduled retraining; the train run is tagged packtrain.init_fallback_reason)")
        return InitSource(value, path, "dir" if path else "scratch", reason=reason)
    version = str(mv.version)
    dst = cache_dir(cfg.workdir, name, version)
    cached = (dst / SOURCE_FILE).is_file()
    path = download_version(uri, name, version, dst, run_id=mv.run_id, source=mv.source,
                            allow_pickle=model_cfg.allow_pickle)
    if announce:
        _say(f"model.init_from={value} → models:/{name}/{version} "
             f"({'cached' if cached else 'downloaded'} in {path})")
    return InitSource(value, path, "registry", name=name, version=version, uri=f"models:/{name}/{version}")


def _find_version(uri: str, shown: str, value: str, name: str, alias: str | None, version: str | None,
                  workdir: str | Path):
    """(ModelVersion, None), or (None, why: what the registry has instead). An unreachable store raises."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from packtrain.tracking.store_creation import ensure_store
    from packtrain.tracking.transport import is_transient, short_http

    ensure_store(uri)   # a fresh sqlite store: created by one process at a time
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    with short_http(uri, 30):
        try:
            if alias:
                return client.get_model_version_by_alias(name, alias), None
            return client.get_model_version(name, version), None
        except MlflowException as e:
            if is_transient(e) or e.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise _unreachable(value, shown, name, workdir, e) from None
        except Exception as e:   # a connection error outside MlflowException
            if not is_transient(e):
                raise
            raise _unreachable(value, shown, name, workdir, e) from None
        return None, _what_is_there(client, shown, name, alias, version)


def _what_is_there(client, shown: str, name: str, alias: str | None, version: str | None) -> str:
    from mlflow.exceptions import MlflowException

    try:
        versions = sorted(client.search_model_versions(f"name = '{name}'"), key=lambda v: int(v.version))
    except MlflowException:
        versions = []
    if not versions:
        try:
            names = [m.name for m in client.search_registered_models(max_results=10)]
        except MlflowException:
            names = []
        return (f"no registered model {name!r} in {shown} (registered models there: "
                f"{', '.join(names) if names else 'none'})")
    try:
        aliases = sorted(f"{a} → v{v}" for a, v in (client.get_registered_model(name).aliases or {}).items())
    except MlflowException:
        aliases = []
    have = (f"versions {', '.join(str(v.version) for v in versions[-10:])}"
            + (f"; aliases {', '.join(aliases)}" if aliases else "; no aliases"))
    what = f"no alias {alias!r}" if alias else f"no version {version}"
    return f"registered model {name!r} has {what} in {shown} ({have})"


def _unreachable(value: str, shown: str, name: str, workdir: str | Path, err: Exception) -> MissingDataError:
    from packtrain.secrets import redact_text

    root = cache_dir(workdir, name, "0").parent
    cached = sorted((p for p in root.glob("v*") if (p / SOURCE_FILE).is_file()),
                    key=lambda p: int(p.name[1:]) if p.name[1:].isdigit() else 0)
    hint = (f"start from a cached copy instead: model.init_from={cached[-1]} (cached: "
            f"{', '.join(p.name for p in cached)})" if cached else "set model.init_from to a local directory")
    first = redact_text(str(err)).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
    return MissingDataError(f"model.init_from {value!r}: the model registry at {shown} cannot be read ({first}); "
                            f"retry when it is back, or {hint} or scratch")


def download_version(tracking_uri: str, name: str, version: str, dst: Path, run_id: str | None = None,
                     source: str | None = None, allow_pickle: bool = False) -> Path:
    """`models:/<name>/<version>` as a save_pretrained directory at `dst` (module doc); reused when complete.
    `allow_pickle`: model.allow_pickle (a pickle-only version is refused without it)."""
    if (dst / SOURCE_FILE).is_file():
        return dst
    import fcntl

    dst.parent.mkdir(parents=True, exist_ok=True)
    # one download per version at a time (all ranks of a torchrun job, a concurrent `packtrain plan`): the others
    # wait here and then reuse the finished copy
    with open(dst.parent / f".{dst.name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dst / SOURCE_FILE).is_file():
            return dst
        return _download_version(tracking_uri, name, version, dst, run_id, source, allow_pickle)


def _download_version(tracking_uri: str, name: str, version: str, dst: Path, run_id: str | None,
                      source: str | None, allow_pickle: bool) -> Path:
    from packtrain.publish import publish_dir, staging_dir

    tmp = staging_dir(dst)
    try:
        raw = tmp / "_mlflow"
        local = _download(tracking_uri, f"models:/{name}/{version}", raw)
        flavor = _unpack(local, tmp, f"models:/{name}/{version}", allow_pickle)
        shutil.rmtree(raw)
        if not (tmp / "config.json").is_file():
            raise InputDataError(f"models:/{name}/{version}: the logged model has no config.json (not a "
                                 "transformers causal LM packtrain can continue)")
        from packtrain.data.tokenizer_files import tokenizer_hash
        from packtrain.secrets import redact_uri

        info = {"uri": f"models:/{name}/{version}", "name": name, "version": version, "run_id": run_id,
                "source": source, "flavor": flavor, "tracking_uri": redact_uri(tracking_uri),
                "tokenizer_hash": tokenizer_hash(tmp), "downloaded": time.strftime("%Y-%m-%dT%H:%M:%S")}
        (tmp / SOURCE_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        if (dst / SOURCE_FILE).is_file():   # another process finished the same version meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
            return dst
        publish_dir(tmp, dst, what="registry model cache")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def _download(tracking_uri: str, model_uri: str, raw: Path) -> Path:
    import mlflow

    from packtrain.tracking.run_lifecycle import set_fluent_tracking_uri

    # as packtrain.registry.model.load_registered: MLflow 3.17 resolves models:/ through the global registry
    # URI whatever download_artifacts is given, so the store is made global for the download and restored after
    before = mlflow.get_tracking_uri()
    set_fluent_tracking_uri(tracking_uri)
    try:
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(raw),
                                                        tracking_uri=tracking_uri, registry_uri=tracking_uri))
    finally:
        set_fluent_tracking_uri(before)


def _move_files(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        shutil.move(str(f), str(dst / f.name))


def _unpack(local: Path, out: Path, what: str, allow_pickle: bool = False) -> str:
    """The HF directory of a downloaded MLflow model, moved into `out`; returns the flavor. Only safetensors
    and tokenizer files are read; a pickle-only model needs `allow_pickle` (packtrain.model.logged_model)."""
    from packtrain.data.tokenizer_files import TOKENIZER_FILES
    from packtrain.model.logged_model import hf_files, load_pickled

    files = hf_files(local, what)
    if files.flavor == "transformers":
        from mlflow.models import Model

        assert files.model_dir is not None
        _move_files(files.model_dir, out)
        for comp in Model.load(str(local)).flavors["transformers"].get("components") or []:
            if (local / "components" / comp).is_dir():
                _move_files(local / "components" / comp, out)
        return files.flavor
    if not files.pickle_only:   # pytorch flavor: extra_files/ is the save_pretrained copy + tokenizer
        assert files.model_dir is not None
        _move_files(files.model_dir, out)
        return files.flavor
    model = load_pickled(local, what, allow_pickle)
    if not hasattr(model, "save_pretrained"):
        raise InputDataError(f"{what}: the pytorch-flavor model is a {type(model).__name__}, not a "
                             "transformers model packtrain can continue")
    save_pretrained(model, str(out), safe_serialization=True)
    extra = local / "extra_files"
    for name in TOKENIZER_FILES:
        if (extra / name).is_file():
            shutil.copyfile(extra / name, out / name)
    return files.flavor


def cache_identity(cfg: RunConfig, stage: str) -> dict | None:
    """What of the init source a stage's output depends on (the stage cache key): None for scratch.

    tokenize: the hash of the tokenizer the init source ships (None: it ships none). train: the registered
    version (immutable), or a directory's fingerprint (packtrain.registry.source.dir_fingerprint), or
    scratch after a champion fallback. A new champion therefore misses the cache; the same one hits.
    """
    if init_from_value(cfg.model) == "scratch":
        return None
    from packtrain.data.tokenizer_files import tokenizer_hash

    src = resolve_init(cfg, announce=False)
    if stage == "tokenize":
        return {"tokenizer_hash": tokenizer_hash(src.path) if src.path else None}
    if src.uri:
        return {"init": src.uri}
    return {"init": dir_fingerprint(src.path) if src.path else "scratch"}


def dir_fingerprint(path: Path) -> str:
    """sha256 over the relative names, sizes and mtimes of a directory's files (not their bytes: a 14 GB
    checkpoint would cost ~30 s to hash at every cache lookup)."""
    import hashlib

    h = hashlib.sha256(str(Path(path).resolve()).encode())
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return "dir:" + h.hexdigest()
