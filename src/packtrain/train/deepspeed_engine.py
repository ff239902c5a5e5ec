"""ZeRO through DeepSpeed — the only module that imports deepspeed (an optional extra: `pip install .[deepspeed]`).

`build_deepspeed_config(train_cfg)` turns the one TrainConfig into DeepSpeed's JSON (saved beside the run as
`deepspeed_config.json`), so the recipe stays the single source of truth:

    train.precision        → bf16.enabled / fp16.enabled (dynamic loss scale, 2^16 start)
    train.grad_accum       → gradient_accumulation_steps; train.grad_clip → gradient_clipping
    train.rows             → train_micro_batch_size_per_gpu (packs per micro-batch); × grad_accum × world
                             = train_batch_size
    train.deepspeed        → zero_optimization: stage 0–3, offload_optimizer / offload_param to CPU (pinned)

Memory per GPU for N params, mixed-precision Adam (16 B/param of model state, ZeRO paper), W GPUs:
stage 0: 16N; stage 1: 4N + 12N/W; stage 2: 2N + 14N/W; stage 3: 16N/W; optimizer offload moves the 12N of
fp32 master + Adam moments to CPU; parameter offload (stage 3) moves the parameters too. Measured on the H200:
350M ZeRO-3 + both offloads, 13.3 GiB peak, 0.55 s/step at 4×2048 tokens (docs/design.md).

Training passes a client torch AdamW to `deepspeed.initialize` instead of declaring an optimizer in the JSON:
a JSON optimizer makes DeepSpeed JIT-build FusedAdam/CPU-Adam (~95 s on CPU; FusedAdam's build failed on the
H200 machine's TORCH_CUDA_ARCH_LIST="9.0a"). With offload the client optimizer runs torch's AdamW on the CPU
copy (`zero_force_ds_cpu_optimizer: false`). On a CPU-only machine (DS_ACCELERATOR=cpu) DeepSpeed JIT-builds
its shared-memory all-reduce op (deepspeed_shm_comm) for 2+ CPU ranks, once per venv path (~47 s here, 70-150 s
on a loaded 2-core machine), cached in TORCH_EXTENSIONS_DIR (default: packtrain.paths.user_cache_dir's torch_extensions); one CPU
process skips it (`skip_shm_comm`: it has no peer to share memory with).
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from packtrain.errors import ConfigError
from packtrain.train.torch_engine import StepInfo

if TYPE_CHECKING:
    from packtrain.config import TrainConfig

LOSS_SCALE_WINDOW = 1000


def build_deepspeed_config(train_cfg: TrainConfig, world_size: int = 1,
                           rows: int | Literal["auto"] | None = None, grad_accum: int | None = None) -> dict:
    """DeepSpeed JSON for `train_cfg` on `world_size` data-parallel ranks.

    `rows`/`grad_accum` override the config's (the shape packtrain.planner.choose_shape decided, e.g. for
    train.rows: auto).

    >>> from packtrain.config import TrainConfig
    >>> c = build_deepspeed_config(TrainConfig(precision="bf16", rows=8, grad_accum=2), world_size=4)
    >>> c["train_batch_size"], c["bf16"], c["zero_optimization"]["stage"]
    (64, {'enabled': True}, 2)
    """
    ds = train_cfg.deepspeed
    if ds.offload_params and ds.zero_stage != 3:
        raise ConfigError("train.deepspeed.offload_params: needs train.deepspeed.zero_stage 3")
    if ds.offload_optimizer and ds.zero_stage == 0:
        raise ConfigError("train.deepspeed.offload_optimizer: needs train.deepspeed.zero_stage ≥ 1")
    rows = rows or train_cfg.rows
    if not isinstance(rows, int):
        raise ConfigError("train.rows 'auto': build_deepspeed_config needs the planned rows (rows=, from "
                          "packtrain.planner.choose_shape)")
    ga = grad_accum or train_cfg.grad_accum
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.zero_stage >= 1:
        zero["overlap_comm"] = ds.overlap_comm
        zero["contiguous_gradients"] = ds.contiguous_gradients
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if ds.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg: dict[str, Any] = {
        "train_batch_size": rows * ga * world_size,
        "train_micro_batch_size_per_gpu": rows,
        "gradient_accumulation_steps": ga,
        "gradient_clipping": float(train_cfg.grad_clip),
        "zero_optimization": zero,
        "bf16": {"enabled": train_cfg.precision == "bf16"},
        "fp16": ({"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                  "loss_scale_window": LOSS_SCALE_WINDOW, "hysteresis": 2, "min_loss_scale": 1}
                 if train_cfg.precision == "fp16" else {"enabled": False}),
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    return cfg


def validate_deepspeed_config(cfg: dict) -> Any:
    """Parse `cfg` with DeepSpeed's own parser (`DeepSpeedConfig`, which checks train_batch_size against the
    world size of the initialized process group, or 1 without one); raises ConfigError on rejection.
    The process environment is left as it was (a launcher must not mistake this process for a rank)."""
    saved = dict(os.environ)
    try:
        _prepare_env("cpu")
        from deepspeed.runtime.config import DeepSpeedConfig
    finally:
        os.environ.clear()
        os.environ.update(saved)

    try:
        return DeepSpeedConfig(dict(cfg))
    except Exception as e:  # DeepSpeed raises AssertionError/ValueError/pydantic errors
        raise ConfigError(f"DeepSpeed rejected the generated config: {type(e).__name__}: {e}") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prepare_env(device_type: str, world_size: int = 1) -> None:
    """Env DeepSpeed reads at import/init: accelerator, single-process rendezvous, extension cache."""
    if device_type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from packtrain.paths import user_cache_dir

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(user_cache_dir() / "torch_extensions"))
    if "RANK" not in os.environ:   # not launched by torchrun/deepspeed: a single local process
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))


def skip_shm_comm() -> None:
    """Mark DeepSpeed's CPU shared-memory all-reduce op (deepspeed_shm_comm) unavailable for this process, so
    `deepspeed.initialize` does not JIT-build it: g++ -O2 of two C++ files, 70-150 s of CPU on a loaded 2-core
    machine, again for every new venv path (the build hash names the include dirs). One process has no peer to
    share memory with; DeepSpeed then reduces through torch.distributed (gloo), which at world size 1 returns
    the tensor as it is, so the numbers are those of a run with the op."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False   # DeepSpeed reads this dict before a build


class DeepSpeedStepper:
    """The DeepSpeed side of a train step: backward per micro-batch, optimizer step at the window's end.

    The loss passed to `backward` is already token-mean-normalized over the whole window (and ×W for the
    rank average), so DeepSpeed's own 1/gradient_accumulation_steps scaling is turned off (scale_wrt_gas)."""

    def __init__(self, module, optimizer, train_cfg: TrainConfig, device, world_size: int, rows: int,
                 grad_accum: int, out_dir: Path | None = None):
        _prepare_env(str(device).split(":")[0], world_size)
        import deepspeed

        if world_size == 1 and str(device).startswith("cpu"):
            skip_shm_comm()

        self.config = build_deepspeed_config(train_cfg, world_size, rows, grad_accum)
        if out_dir is not None and int(os.environ.get("RANK", "0")) == 0:
            from packtrain.publish import write_json

            write_json(Path(out_dir) / "deepspeed_config.json", self.config)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=module, optimizer=optimizer,
                                                                 config=self.config)
        self.module = self.engine
        self.grad_accum = grad_accum
        self._skipped_before = 0

    @property
    def lm(self):
        return self.engine.module.lm

    def backward(self, loss, last: bool) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)
        self.engine.step()   # no-op until the accumulation boundary

    def step(self) -> StepInfo:
        skipped_total = int(getattr(self.engine, "skipped_steps", 0))
        skipped = skipped_total > self._skipped_before
        self._skipped_before = skipped_total
        norm = self.engine.get_global_grad_norm()
        scale = None
        if self.config["fp16"]["enabled"]:
            scale = float(getattr(self.optimizer, "cur_scale", getattr(self.optimizer, "loss_scale", 0.0)))
        return StepInfo(grad_norm=None if norm is None else float(norm), skipped=skipped, loss_scale=scale)

    def save(self, tmp: Path) -> None:
        """All ranks: DeepSpeed writes its sharded model/optimizer states under tmp/deepspeed/."""
        self.engine.save_checkpoint(str(tmp / "deepspeed"), tag="engine", save_latest=False)

    def load(self, path: Path) -> None:
        self.engine.load_checkpoint(str(path / "deepspeed"), tag="engine", load_optimizer_states=True,
                                    load_lr_scheduler_states=False, load_module_strict=True)
        self._skipped_before = int(getattr(self.engine, "skipped_steps", 0))

    def scaler_state(self) -> dict | None:
        return None   # the fp16 loss scale lives in DeepSpeed's checkpoint

    def load_scaler_state(self, state: dict | None) -> None:
        return None

    def full_state_dict(self) -> dict | None:
        """The LM's full state dict on rank 0 (ZeRO-3 shards gathered), None on other ranks."""
        import deepspeed
        import torch

        lm = self.lm
        rank = int(os.environ.get("RANK", "0"))
        params = list(lm.parameters())
        ctx = (deepspeed.zero.GatheredParameters(params, modifier_rank=None)
               if self.config["zero_optimization"]["stage"] == 3 else contextlib.nullcontext())
        with ctx:
            if rank != 0:
                return None
            return {k: v.detach().to("cpu", dtype=torch.float32).clone() for k, v in lm.state_dict().items()}

