"""Resumable checkpoints: atomic, checksummed, last K kept; a corrupt one is skipped for the previous one.

    <out_dir>/checkpoints/
      step_000010/
        model.safetensors   weights (torch engine; tied embedding stored once)
        adapter.safetensors instead of model.safetensors with train.adapter lora: the trainable (LoRA A/B)
                            tensors only — the frozen base is rebuilt from model.init_from (or the seed)
        optimizer.pt        optimizer.state_dict() (tensors only: torch.load(weights_only=True))
        rng.pt              torch CPU + CUDA RNG states
        deepspeed/...       engine.save_checkpoint output instead of the two files above (engine: deepspeed)
        dcp/...             torch.distributed.checkpoint of the sharded model + optimizer, one file per rank,
                            instead of model.safetensors + optimizer.pt (engine: fsdp2)
        state.json          step, scheduler, scaler, loader (PackedLoader.state_dict), python/numpy RNG, progress
        manifest.json       written last: {"format", "version", "step", "files": {relpath: {"bytes", "sha256_tree",
                            "chunk_bytes"}}} (version 1 manifests, read as before, have "sha256" instead)
      step_000020/ ...

      quarantine/
        step_000030/          a checkpoint that failed verification on --resume, moved here untouched
        step_000030.reason.txt   why (names the file: "model.safetensors fails its sha256 checksum")

A checkpoint is written into `.tmp-step_N/` and renamed into place, so a crash (SIGKILL included) leaves
either the complete directory or a `.tmp-*` leftover (an incomplete write, never a usable checkpoint) that
the next save removes. `find_latest_checkpoint` walks newest → oldest and verifies every file's size and
checksum against the manifest (checkpoint_manifest.py: the manifest, its sha256 tree, `verify_checkpoint`).

Nothing is deleted implicitly:
- a checkpoint that fails verification is *moved* to `quarantine/` (with a `.reason.txt`), named in a warning,
  and resume falls back to the newest one that verifies; quarantined files are never pruned or overwritten;
- retention is the one explicit policy `train.checkpoint`: after each save keep the newest `keep_last` and,
  with `keep_best`, the one with the lowest mean training loss over its interval (`interval_loss` in the
  manifest); every other `step_N` is removed. Example, every 5 steps, keep_last 2, keep_best, interval
  losses 5:4.1 10:3.2 15:3.6 20:3.5 → kept 10 (best), 15, 20. With evaluation during training
  (train.eval_every_steps) a checkpoint of an evaluated step records its held-out `eval_loss`, and the best is
  the lowest eval_loss among those instead (kept whatever keep_best says: it is the one exported);
- a fresh `packtrain train` into an output directory that already holds checkpoints refuses (see
  `existing_run`), naming `--resume` and `--overwrite`; `--overwrite` removes them (`remove_run`) and keeps
  `quarantine/` as it is, and quarantined checkpoints alone never make a run refuse.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from packtrain.errors import DiskFull, InputDataError
from packtrain.faults import kill_point
from packtrain.train.checkpoint_manifest import build_manifest, manifest_loss, verify_checkpoint

STEP_RE = re.compile(r"^step_(\d{6,})$")


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def rng_state() -> tuple[dict, dict]:
    """(JSON-able python/numpy states, torch tensors) of every RNG a run draws from."""
    import numpy as np
    import torch

    py = random.getstate()
    np_state = cast("tuple[Any, ...]", np.random.get_state())   # legacy=True (default): the tuple form
    plain = {"python": [py[0], list(py[1]), py[2]],
             "numpy": [np_state[0], np_state[1].tolist(), *[float(x) if isinstance(x, float) else int(x)
                                                             for x in np_state[2:]]]}
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["cuda"] = torch.cuda.get_rng_state_all()
    return plain, tensors


def set_rng_state(plain: dict, tensors: dict) -> None:
    import numpy as np
    import torch

    v, state, gauss = plain["python"]
    random.setstate((v, tuple(state), gauss))
    n = plain["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), int(n[2]), int(n[3]), float(n[4])))
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(tensors["cuda"])


def begin_checkpoint(ckpt_root: Path, step: int) -> Path:
    """Create (empty) the temp directory checkpoint `step` is written into; returns it."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_root / f".tmp-{step_dir_name(step)}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def commit_checkpoint(ckpt_root: Path, tmp: Path, step: int, state: dict, keep_last: int,
                      keep_best: bool = False, after_step: int = 0) -> Path:
    """Add state.json, rng.pt and the manifest (last: it marks completeness) to `tmp`, rename it to
    step_N atomically and apply the retention policy (`prune_checkpoints`). `state` is the JSON-able part
    (scheduler, scaler, loader, history); the weights/optimizer files are already in `tmp`. `after_step`: the
    previous checkpoint's step (the manifest's `interval_loss` averages the steps after it)."""
    import torch

    kill_point("checkpoint.payload")
    plain, tensors = rng_state()
    torch.save(tensors, writing(tmp / "rng.pt"))
    writing(tmp / "state.json").write_text(json.dumps({**state, "step": step, "rng": plain}))
    loss = interval_loss(state.get("history"), after_step)
    ev = next((h.get("eval_loss") for h in reversed(state.get("history") or []) if h.get("step") == step), None)
    writing(tmp / "manifest.json").write_text(json.dumps(build_manifest(tmp, step, loss, ev), indent=1))
    kill_point("checkpoint.manifest")
    final = ckpt_root / step_dir_name(step)
    if final.exists():
        old = ckpt_root / f".old-{final.name}"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    kill_point("checkpoint.renamed")
    prune_checkpoints(ckpt_root, keep_last, keep_best)
    return final


def interval_loss(history: list[dict] | None, after_step: int) -> float | None:
    """Mean training loss of the steps after `after_step` (the previous checkpoint's step, or 0): the number
    `keep_best` ranks checkpoints by. [{'step':1,'loss':4.0}, {'step':2,'loss':2.0}], 0 → 3.0; ..., 1 → 2.0"""
    vals = [float(h["loss"]) for h in history or [] if h.get("step", 0) > after_step
            and isinstance(h.get("loss"), (int, float))]
    return sum(vals) / len(vals) if vals else None


DISK_FULL_ERRNOS = (28, 122)   # ENOSPC, EDQUOT
_writing: dict[str, Path] = {}   # "path": the checkpoint file this process is writing now (named on a full disk)


def writing(path: Path) -> Path:
    """Note that `path` is the checkpoint file being written now (a full disk's error names it); returns it."""
    _writing["path"] = path
    return path
LOW_SPACE = 4 << 20
"""Free bytes below which a write that failed without an errno (torch.save's C++ stream says only `basic_ios::clear:
iostream error`; safetensors `failed to write`) is taken for a full disk."""


def is_disk_full(err: BaseException, where: Path) -> bool:
    """True when `err` (or what caused it) is ENOSPC/EDQUOT or says so (safetensors), or a write error of a library
    that lost the errno (torch.save) on a file system with less than LOW_SPACE free at `where`."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        if any(text in str(e) for text in ("No space left on device", "Disk quota exceeded")):
            return True   # safetensors' SafetensorError: "I/O error: No space left on device (os error 28)"
        e = e.__cause__ or e.__context__
    free = _free_bytes(where)
    return free is not None and free < LOW_SPACE


def _free_bytes(where: Path) -> int | None:
    for p in (where, *where.parents):
        try:
            return shutil.disk_usage(p).free
        except OSError:
            continue
    return None


def _human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GiB"


def disk_full_error(ckpt_root: Path, tmp: Path, step: int, err: BaseException) -> DiskFull:
    """The one-line DiskFull of a checkpoint write that ran out of space; removes the partial `.tmp-step_N` first
    (an incomplete write is never a usable checkpoint; the next save would remove it anyway) so the run can still
    end its MLflow runs on that disk. Names the file last written, the directory, free space before and after."""
    files = sorted((p for p in tmp.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime) if tmp.is_dir() else []
    current = _writing.get("path")
    last = current if current is not None and current.parent == tmp else files[-1] if files else None
    wrote = sum(p.stat().st_size for p in files)
    free = _free_bytes(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    freed = _free_bytes(ckpt_root)
    usage = None
    with contextlib.suppress(OSError):
        usage = shutil.disk_usage(ckpt_root)
    kept = list_checkpoints(ckpt_root)
    what = last.name if last is not None else "its first file"
    return DiskFull(
        f"no space left on the device while writing checkpoint step {step} ({what}, {_human(wrote)} written) to "
        f"{tmp}: {_human(free or 0)} free" + (f" of {_human(usage.total)}" if usage else "")
        + (f" on that file system ({_human(freed)} after removing the incomplete write)" if freed is not None else "")
        + (f"; the earlier checkpoints are intact (newest: {kept[0][1].name})" if kept else "; no earlier checkpoint")
        + " — free space (or lower train.checkpoint.keep_last), then rerun with --resume"
        + f" [{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}]")


def save_checkpoint(ckpt_root: Path, step: int, state: dict, write_payload: Callable[[Path], None],
                    keep_last: int, keep_best: bool = False) -> Path:
    """Single-process save: begin, `write_payload(tmp)` (e.g. `torch_payload_writer`), commit."""
    tmp = begin_checkpoint(ckpt_root, step)
    write_payload(tmp)
    return commit_checkpoint(ckpt_root, tmp, step, state, keep_last, keep_best)


def list_checkpoints(ckpt_root: Path) -> list[tuple[int, Path]]:
    """(step, dir) of every step_N directory, newest first (validity not checked)."""
    if not ckpt_root.is_dir():
        return []
    out = [(int(m.group(1)), p) for p in ckpt_root.iterdir() if p.is_dir() and (m := STEP_RE.match(p.name))]
    return sorted(out, reverse=True)


def prune_checkpoints(ckpt_root: Path, keep_last: int, keep_best: bool = False) -> list[Path]:
    """Apply the retention policy: keep the newest `keep_last` step_N directories and, with `keep_best`, the
    one whose manifest has the lowest `eval_loss` (when any has one: evaluation during training), else the lowest
    `interval_loss`; remove the other step_N directories and leftover `.tmp-*`/`.old-*` writes. Quarantined
    checkpoints are never touched. Returns the removed directories."""
    ckpts = list_checkpoints(ckpt_root)
    keep = {p for _, p in ckpts[:keep_last]}
    if keep_best:
        scored = [(loss, -step, p) for step, p in ckpts if (loss := manifest_loss(p, "eval_loss")) is not None]
        scored = scored or [(loss, -step, p) for step, p in ckpts if (loss := manifest_loss(p)) is not None]
        if scored:
            keep.add(min(scored)[2])
    removed = [p for _, p in ckpts if p not in keep]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    for p in [*ckpt_root.glob(".tmp-*"), *ckpt_root.glob(".old-*")]:
        shutil.rmtree(p, ignore_errors=True)
    return removed



QUARANTINE = "quarantine"


def find_latest_checkpoint(ckpt_root: Path, quarantine: bool = False) -> Path | None:
    """The newest checkpoint that verifies. Each newer broken one gets a RuntimeWarning naming the file at
    fault; with `quarantine` it is also moved, untouched, to `<ckpt_root>/quarantine/` (see `quarantine_checkpoint`)
    so that retention never removes it and the next save of that step cannot overwrite it."""
    recover_complete_writes(ckpt_root)
    for step, p in list_checkpoints(ckpt_root):
        reason = verify_checkpoint(p)
        if reason is None:
            return p
        where = f"; moved to {quarantine_checkpoint(p, reason)}" if quarantine else ""
        warnings.warn(f"checkpoint {p} (step {step}) is corrupt or partial: {reason}{where}; trying the "
                      "previous one", RuntimeWarning, stacklevel=2)
    return None


def quarantine_checkpoint(path: Path, reason: str) -> Path:
    """Move a checkpoint that failed verification to `<root>/quarantine/<name>[-k]` (files byte-identical) and
    write the reason beside it as `<name>[-k].reason.txt`. Returns the new location."""
    qdir = path.parent / QUARANTINE
    qdir.mkdir(exist_ok=True)
    dst, k = qdir / path.name, 1
    while dst.exists():
        k += 1
        dst = qdir / f"{path.name}-{k}"
    path.rename(dst)
    (qdir / f"{dst.name}.reason.txt").write_text(reason + "\n", encoding="utf-8")
    return dst


def recover_complete_writes(ckpt_root: Path) -> list[Path]:
    """A `.tmp-step_N` whose manifest verifies is a complete checkpoint whose final rename was interrupted (a kill
    between `checkpoint.manifest` and the rename): move it into place as step_N when that name is free.
    Returns the recovered directories."""
    out = []
    for tmp in sorted(ckpt_root.glob(".tmp-step_*")) if ckpt_root.is_dir() else []:
        final = ckpt_root / tmp.name[len(".tmp-"):]
        if STEP_RE.match(final.name) and not final.exists() and verify_checkpoint(tmp) is None:
            tmp.rename(final)
            warnings.warn(f"checkpoint {final}: recovered a complete write whose rename was interrupted",
                          RuntimeWarning, stacklevel=3)
            out.append(final)
    return out


def existing_run(ckpt_root: Path) -> list[Path]:
    """Everything a fresh (non-resume) run would clobber: step_N checkpoints and complete `.tmp-step_N` writes.
    Quarantined checkpoints are not in it: they are kept whatever a run does (`--overwrite` included)."""
    found = [p for _, p in list_checkpoints(ckpt_root)]
    if ckpt_root.is_dir():
        found += [p for p in sorted(ckpt_root.glob(".tmp-step_*")) if verify_checkpoint(p) is None]
    return found


def quarantined(ckpt_root: Path) -> list[Path]:
    """The checkpoints under `<ckpt_root>/quarantine/` (each next to its `.reason.txt`)."""
    q = ckpt_root / QUARANTINE
    return sorted(p for p in q.iterdir() if p.is_dir()) if q.is_dir() else []


def existing_run_message(ckpt_root: Path, found: list[Path]) -> str:
    """Why a fresh run into `ckpt_root` holding `found` (existing_run) is refused, and what to pass instead."""
    steps = ", ".join(p.name for p in found[:6]) + (" ..." if len(found) > 6 else "")
    msg = (f"{ckpt_root} already holds {len(found)} checkpoint(s) ({steps}) from an earlier run: pass --resume to "
           "continue it, or --overwrite to delete them and start from step 0 (or train into another --out)")
    q = quarantined(ckpt_root)
    if q:
        msg += f"; the {len(q)} quarantined checkpoint(s) in {ckpt_root / QUARANTINE} are kept either way"
    return msg


def remove_run(ckpt_root: Path) -> list[Path]:
    """`--overwrite`: delete the earlier run's step_N checkpoints and its `.tmp-*`/`.old-*` writes; returns the
    step_N directories removed. `quarantine/` (and anything else that is not a checkpoint) stays byte-identical."""
    removed = [p for _, p in list_checkpoints(ckpt_root)]
    leftovers = [*ckpt_root.glob(".tmp-*"), *ckpt_root.glob(".old-*")] if ckpt_root.is_dir() else []
    for p in removed + leftovers:
        shutil.rmtree(p)
    return removed


def read_state(path: Path) -> dict:
    """state.json of a verified checkpoint, with RNG states restored."""
    import torch

    state = json.loads((path / "state.json").read_text())
    set_rng_state(state["rng"], torch.load(path / "rng.pt", weights_only=True))
    return state


ADAPTER_FILE = "adapter.safetensors"


def torch_payload_writer(model, optimizer, trainable_only: bool = False) -> Callable[[Path], None]:
    """Payload of the torch engine: weights as safetensors (shared tensors stored once) + optimizer state.
    `trainable_only` (LoRA): adapter.safetensors with the parameters that train, nothing of the frozen base
    (tiny-cpu r 16: 154 KiB instead of 1.3 MiB; Llama-3-8B r 16: 168 MiB instead of 32 GiB)."""

    def write(tmp: Path) -> None:
        import torch
        from safetensors.torch import save_file, save_model

        if trainable_only:
            tensors = {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}
            save_file(tensors, str(writing(tmp / ADAPTER_FILE)))
        else:
            save_model(model, str(writing(tmp / "model.safetensors")))
        torch.save(optimizer.state_dict(), writing(tmp / "optimizer.pt"))

    return write


def load_torch_payload(path: Path, model, optimizer, device: Any) -> None:
    """Load a checkpoint written by `torch_payload_writer` (full weights, or the adapter onto a rebuilt base)."""
    import torch
    from safetensors.torch import load_file, load_model

    if (path / ADAPTER_FILE).is_file():
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        saved = load_file(str(path / ADAPTER_FILE), device=str(device))
        missing, unexpected = sorted(set(params) - set(saved)), sorted(set(saved) - set(params))
        if missing or unexpected or any(saved[n].shape != p.shape for n, p in params.items()):
            raise InputDataError(f"checkpoint {path}/{ADAPTER_FILE} does not match the model's adapter: missing "
                                 f"{missing[:5]}, unexpected {unexpected[:5]} (different train.adapter or model?)")
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved[n])
    else:
        if (path / "dcp").is_dir() and not (path / "model.safetensors").is_file():
            raise InputDataError(f"checkpoint {path} was written by train.engine=fsdp2 (a dcp/ directory, no "
                                 "model.safetensors): resume with train.engine=fsdp2 on the same number of GPUs")
        if not all(p.requires_grad for p in model.parameters()):
            raise InputDataError(f"checkpoint {path} holds full weights (model.safetensors) but this run trains an "
                                 "adapter (train.adapter): resume with the run's own config")
        missing_, unexpected_ = load_model(model, str(path / "model.safetensors"), strict=False, device=str(device))
        if missing_ or unexpected_:
            raise InputDataError(f"checkpoint {path}/model.safetensors does not match the model: missing "
                                 f"{sorted(missing_)[:5]}, unexpected {sorted(unexpected_)[:5]} (different model "
                                 "config?)")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
