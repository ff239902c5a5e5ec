"""The stage cache of local runs: reuse a stage's output when nothing it depends on changed.

`kfp.local` has no cache keyed on data (its optional cache keys on argument strings and artifact URIs, so
a changed source file behind an unchanged config would be served stale). `packtrain run` (both runners: in
process and `--runner kfp`) therefore keys every stage on what actually determines its output:

    key = sha256( stage,
                  content md5 of what the stage reads of its inputs (StageSpec.read_paths: file names + contents,
                  like DVC's directory md5; a train output's checkpoints/ are read by no later stage; a stage's
                  JSON stats files without the run's measurements and paths: `content_md5`, MEASURED),
                  the config sections the stage declares in the stage table (packtrain.stages.table;
                  packtrain.pipeline.runtime.config_parts; JSON, sorted keys),
                  packtrain version + md5 of the packtrain source files (+ git sha when available) )

    <workdir>/cache/<stage>/<key>/out/      the stage's output directory, as the runner wrote it
    <workdir>/cache/<stage>/<key>/entry.json  {"stage", "key", "stats", "created", "parts"}

An entry is data read from disk: it must resolve inside the cache and hold no symbolic link leading out of
it (PathOutsideError, exit 3, otherwise). A hit hard-links (or copies, across file systems) `out/` into the
new output directory and returns the
stored stats; a miss runs the stage and stores its output (temp dir + rename, so a crash never leaves a
half entry). Hashing costs ~0.2 s per 100 MB of inputs. Delete <workdir>/cache (or `--no-cache`) to
force a rerun. On a cluster KFP's own cache applies instead (docs/pipeline.md, "Caching").
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packtrain.publish import staged_output, write_json


def dir_md5(path: str | Path) -> str:
    """DVC md5 of a file or directory tree (packtrain.versioning.data_md5: names + contents), "missing" when
    absent. Dotfiles (`.x.tmp`, `.packtrain-*`) are skipped: they are never stage outputs.

    >>> # dir_md5("a/") == dir_md5("copy_of_a/") for identical trees; renaming one file changes it.
    """
    from packtrain.versioning import data_md5

    p = Path(path)
    return data_md5(p, skip_hidden=True) if p.exists() else "missing"


MEASURED: dict[str, tuple[str, ...]] = {
    "ingest_result.json": (".source", "output", "seconds"),
    "tokenize_result.json": ("input", "output", "seconds", "train_seconds", "encode_seconds", "tokens_per_second"),
    "pack_result.json": ("input", "output", "seconds", "seconds_plan"),
    "train_result.json": ("model_dir", ".checkpoint", "telemetry_files", "violations", "timings", "throughput",
                          ".system", ".guard", ".memory"),
    "evaluate_result.json": ("model_dir", "eval_split_dir", "seconds", "tokens_per_s", "peak_memory_gib", "timings"),
    # seed_spread's config hash (and the note quoting it), like the challenger's recipe hash, is derived from the
    # config the key already holds, and from ingest.source's spelling: the same documents in another directory must
    # not move register's key
    "suites.json": ("model_dir", "suites[].path", ".seed_spread.config_hash", ".seed_spread.note",
                    ".challenger.recipe.config_hash"),
}
"""What a stage's JSON output records about *how* its run went — wall times, speeds, memory and utilization
measured while it ran, and the absolute paths it ran in — by file name. A plain name is that key at any depth
(pack_result.json's `seconds` of each split too); a path from the top is dotted or starts with "." (`.source`:
ingest's spelled source, not `lineage.input_md5.source`, its md5; `suites[].path`: key path of every item of
list suites). A cache key hashes those files without them (`content_md5`): they change on every run (ingest's
`seconds`, its absolute `output`), and when they were hashed, identical documents got a new key and so did every
stage downstream of them (`--no-cache` stored a second entry per stage each time instead of replacing the one of
the same key). Nothing a later stage computes depends on them; a value a later stage only quotes (register's
`mfu` and `peak_memory_gib` tags) is the one of the run that produced the cached output."""


def content_md5(path: str | Path) -> str:
    """`dir_md5` of a file or directory, with every JSON file named in MEASURED hashed as its content without the
    measured keys (sorted-key JSON), so two runs that produced the same content have the same md5 wherever and
    however fast they ran. "missing" when absent.

    >>> # {"documents": 3, "seconds": 0.31, "output": "/a/x"} and {"documents": 3, "seconds": 0.29,
    >>> # "output": "/b/x"} as ingest_result.json: the same content_md5; {"documents": 4, ...}: another
    """
    from packtrain.versioning import DVC_IGNORED, files_md5

    p = Path(path)
    if not p.exists():
        return "missing"
    if p.is_file():
        return _json_content_md5(p) if p.name in MEASURED else dir_md5(p)
    plain: dict[str, Path] = {}
    measured: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(p):
        dirnames[:] = sorted(d for d in dirnames if d not in DVC_IGNORED and not d.startswith("."))
        rel_dir = Path(dirpath).relative_to(p)
        for name in filenames:
            if name in DVC_IGNORED or name.startswith("."):
                continue
            rel = (rel_dir / name).as_posix()
            if name in MEASURED:
                measured[rel] = _json_content_md5(Path(dirpath) / name)
            else:
                plain[rel] = Path(dirpath) / name
    if not measured:
        return dir_md5(p)
    blob = json.dumps({"files": files_md5(plain) if plain else "", "json": measured}, sort_keys=True)
    return hashlib.md5(blob.encode()).hexdigest() + ".content"


def without_measured(name: str, data: Any) -> Any:
    """`data` (a parsed JSON file called `name`) without the keys MEASURED lists for that name.

    >>> without_measured("pack_result.json", {"fill": 0.99, "seconds": 1.2, "train": {"seconds": 0.5, "n": 3}})
    {'fill': 0.99, 'train': {'n': 3}}
    >>> without_measured("suites.json", {"suites": [{"name": "recent", "path": "/a/eval"}], "note": "n"})
    {'suites': [{'name': 'recent'}], 'note': 'n'}
    """
    for entry in MEASURED.get(name, ()):
        if "." in entry or "[]" in entry:
            data = _drop_path(data, entry.lstrip(".").split("."))
        else:
            data = _drop_everywhere(data, entry)
    return data


def _drop_everywhere(data: Any, key: str) -> Any:
    if isinstance(data, dict):
        return {k: _drop_everywhere(v, key) for k, v in data.items() if k != key}
    if isinstance(data, list):
        return [_drop_everywhere(v, key) for v in data]
    return data


def _drop_path(data: Any, parts: list[str]) -> Any:
    head, rest = parts[0], parts[1:]
    each = head.endswith("[]")
    key = head[:-2] if each else head
    if not isinstance(data, dict) or key not in data:
        return data
    out = dict(data)
    if not rest:
        del out[key]
    elif each and isinstance(out[key], list):
        out[key] = [_drop_path(item, rest) for item in out[key]]
    elif not each:
        out[key] = _drop_path(out[key], rest)
    return out


def _json_content_md5(path: Path) -> str:
    """md5 of a JSON file's content without its measured keys; a file that does not parse: md5 of its bytes."""
    from packtrain.versioning import file_md5

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return file_md5(path)
    canon = json.dumps(without_measured(path.name, data), sort_keys=True, default=str)
    return hashlib.md5(canon.encode()).hexdigest()


def source_md5() -> str:
    """md5 of the packtrain package's .py files: any code change invalidates the cache (~10 ms)."""
    import packtrain

    root = Path(packtrain.__file__).parent
    h = hashlib.md5()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def stage_cache_key(stage: str, inputs: Mapping[str, str | Path], config_parts: dict[str, Any],
                    code: str) -> tuple[str, dict]:
    """Return (sha256 hex, the parts it was computed from) for one stage invocation.

    `inputs` maps input names to directories (hashed by content: `content_md5`), `config_parts` holds the JSON-able
    config sections the stage reads, `code` the code version string.
    """
    parts = {
        "stage": stage,
        "inputs": {name: content_md5(p) for name, p in sorted(inputs.items())},
        "config": config_parts,
        "code": code,
        "python": sys.version.split()[0],
    }
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest(), parts


@dataclass
class CacheHit:
    stats: dict
    key: str
    entry_dir: Path


class StageCache:
    """Stored stage outputs under `root/<stage>/<key>/`. See the module docstring for the layout."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _entry(self, stage: str, key: str) -> Path:
        from packtrain.stages.table import stage_spec

        return self.root / stage_spec(stage).name / key   # a stage of the table (KeyError naming them otherwise)

    def lookup(self, stage: str, key: str) -> CacheHit | None:
        """The entry of (stage, key), None when there is none (or its entry.json does not parse, or its out/
        lacks the stage's record under today's name, StageSpec.stats_file: an entry stored when records had
        other names — `stats.json`, `pack_stats.json` — is a miss, rerun and stored again). An entry
        that leads outside the cache (the entry or its out/ a symbolic link out of `root`, or a link inside
        out/ leading out of the entry: `store` never writes one) raises PathOutsideError (exit 3) naming it,
        so a restore never copies a file from elsewhere into a stage's output."""
        from packtrain.stages.table import stage_spec

        entry = self._entry(stage, key)
        meta = entry / "entry.json"
        if not (meta.is_file() and (entry / "out").is_dir()):
            return None
        self._check_confined(entry)   # before reading anything in it
        if not (entry / "out" / stage_spec(stage).stats_file).is_file():
            return None
        try:
            data = json.loads(meta.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None
        return CacheHit(stats=data.get("stats", {}), key=key, entry_dir=entry)

    def _check_confined(self, entry: Path) -> None:
        from packtrain.paths import PathOutsideError, check_links_inside, confined_path

        try:
            real = confined_path(entry, self.root, "stage cache entry")
            out = confined_path(entry / "out", real, "stage cache output")
            check_links_inside(out, real, "stage cache output")
        except PathOutsideError as e:
            raise PathOutsideError(f"{e}; nothing was restored: delete {entry} (or run with --no-cache)") from None

    def restore(self, hit: CacheHit, out_dir: str | Path) -> None:
        """Materialize a cached output at `out_dir` (hard links; copies across file systems). The entry is
        checked again (see `lookup`) right before copying."""
        self._check_confined(hit.entry_dir)
        # built next to out_dir, then swapped in as one unit (packtrain.publish.publish_dir)
        with staged_output(out_dir, what=f"{hit.entry_dir.parent.name} cache restore") as tmp:
            shutil.copytree(hit.entry_dir / "out", tmp, dirs_exist_ok=True, copy_function=_link_or_copy)

    def store(self, stage: str, key: str, out_dir: str | Path, stats, parts: dict) -> Path:
        """Keep a copy of `out_dir` (hard links where possible) and the stats (a typed result or its dict)
        under the key."""
        from packtrain.stages.results import as_dict

        stats = as_dict(stats)
        entry = self._entry(stage, key)
        with staged_output(entry, what=f"{stage} cache entry") as tmp:   # a crash never leaves a half entry
            shutil.copytree(out_dir, tmp / "out", copy_function=_link_or_copy)
            write_json(tmp / "entry.json", {"stage": stage, "key": key, "stats": stats,
                                            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "parts": parts})
        return entry


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst
