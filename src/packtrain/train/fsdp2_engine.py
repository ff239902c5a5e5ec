"""FSDP2: PyTorch-native sharding (`torch.distributed.fsdp.fully_shard`) — the only module that imports it.

    shard_model(module, lm, cfg, dist, device)  fully_shard each decoder layer, then the root (the loss wrapper)
    Fsdp2Stepper                                backward, clip, AdamW step; DCP checkpoints; the full state dict

What happens to the model (W ranks, N parameters; `train.fsdp`):

    decoder layer i ── fully_shard(layer, mesh, MixedPrecisionPolicy, reshard_after_forward) ─┐ one all-gather
    ...                                                                                        │ per layer per
    root = PackedCausalLM (embedding, final norm, LM head, tied or not) ── fully_shard ────────┘ pass
    every parameter → a DTensor Shard(0) of 1/W of its rows (fp32: the master copy, what AdamW updates)

    forward   all-gather layer i's shards → unsharded params in param_dtype (bf16 under train.precision
              bf16/fp8: the cast happens once per all-gather, not per matmul as under autocast) → run → free
              them again when reshard_after_forward (ZeRO-3-like), keep them until backward otherwise
    backward  (re-gather) → gradients → reduce-scatter in reduce_dtype (fp32 default) → 1/W fp32 grad shards
    step      clip_grad_norm_ over DTensor grads (one all-reduce of the norm) → AdamW on the shards

Order (torchtitan's parallelize): activation checkpointing → per-layer compile → fully_shard. AC and compile
replace a layer's forward / call in place (techniques.py), and fully_shard's pre/post-forward hooks then run
around the compiled layer (dynamo skips FSDP hooks by default, so the layer graph stays the one the torch
engine compiles). The optimizer is built after sharding: fully_shard swaps every parameter for a DTensor.

Under bf16/fp8 there is no autocast: the MixedPrecisionPolicy computes in bf16 parameters (the RMSNorm and
the rotary embedding upcast to fp32 themselves in transformers; the loss upcasts the logits with `.float()`), so
the numbers differ from the torch engine's autocast by bf16 rounding, not by method. fp16 is refused (it would
need a sharded gradient scaler): use bf16.

One process (world size 1) runs the same code over a 1-rank process group (created here, destroyed with the
session); `reshard_after_forward: auto` then means false — there is nothing to shard, so re-gathering in
backward would only add a cast-copy per layer — and gradients accumulate unsynced until the window's last
micro-batch. Checkpoints (`checkpoints/step_N/dcp/`) are torch.distributed.checkpoint directories of the
sharded model + optimizer state (`get_state_dict`/`dcp.save`), written by every rank, resumable on the same
world size (DCP can reshard, but the loader's per-rank positions cannot); the final `model/` is a plain
`save_pretrained` directory of the gathered full state dict (rank 0, fp32 on CPU).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtrain.errors import ConfigError, InputDataError
from packtrain.train.torch_engine import StepInfo

if TYPE_CHECKING:
    import torch

    from packtrain.config import TrainConfig
    from packtrain.train.distributed import DistInfo

DCP_DIR = "dcp"
"""Sub-directory of a checkpoint step_N that holds the torch.distributed.checkpoint files (.metadata,
__<rank>_0.distcp)."""


def mixed_precision_policy(train_cfg: TrainConfig) -> Any:
    """MixedPrecisionPolicy: bf16 parameters for the compute under bf16/fp8 (fp32 otherwise), gradients reduced
    in train.fsdp.reduce_dtype; the outputs (the loss sum, fp32) are not cast."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if train_cfg.precision == "fp16":
        raise ConfigError("train.precision=fp16 with train.engine=fsdp2: fp16 needs a sharded loss scaler, "
                          "which packtrain does not run; use train.precision=bf16 (or engine torch/deepspeed)")
    param = torch.bfloat16 if train_cfg.precision in ("bf16", "fp8") else None
    reduce = {"fp32": torch.float32, "bf16": torch.bfloat16}[train_cfg.fsdp.reduce_dtype]
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)


def ensure_process_group(device: torch.device) -> bool:
    """FSDP2 needs a process group even on one process: create a 1-rank one (in-memory store) when none exists.
    Returns True when this call created it (the caller destroys it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)
    return True


def shard_model(module, lm, train_cfg: TrainConfig, dist_info: DistInfo, device: torch.device,
                undo: contextlib.ExitStack) -> None:
    """fully_shard every decoder layer of `lm`, then `module` (the loss wrapper the loop calls: the root owns the
    embedding, final norm and LM head, which stay gathered from forward to backward). In place."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from packtrain.train.techniques import decoder_layers

    mp = mixed_precision_policy(train_cfg)
    if ensure_process_group(device):
        undo.callback(dist.destroy_process_group)
    mesh = init_device_mesh(device.type, (dist_info.world_size,))
    reshard = train_cfg.fsdp.reshards(dist_info.world_size)
    layers = decoder_layers(lm)
    for i, layer in enumerate(layers):
        # the last layer's backward comes right after its forward: freeing and re-gathering it buys nothing
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard and i < len(layers) - 1)
    fully_shard(module, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)


def _local(t):
    """A DTensor's full value, any other tensor as is. clip_grad_norm_ over sharded gradients returns the norm as a
    Partial DTensor, so this is one all-reduce of a scalar per step (the clip's own use of it reduced it too —
    two scalar all-reduces where one would do; negligible next to the gradients' reduce-scatter)."""
    full = getattr(t, "full_tensor", None)
    return full() if full is not None else t


def _writer_of(path: Path) -> str:
    """Which engine wrote checkpoint `path`, from its files (checkpoint.py's layout)."""
    if (path / "deepspeed").is_dir():
        return "train.engine=deepspeed"
    if (path / "adapter.safetensors").is_file():
        return "train.engine=torch with train.adapter.type=lora"
    if (path / "model.safetensors").is_file():
        return "train.engine=torch"
    return "an unknown engine (no model.safetensors, adapter.safetensors or deepspeed/ either)"


class Fsdp2Stepper:
    """The FSDP2 side of a train step: backward per micro-batch, clip + AdamW step at the window's end.

    Gradients are reduce-scattered after every micro-batch on several ranks (1/W of them stay, ZeRO-2-like
    memory), and accumulate unsynced until the last micro-batch on one (nothing to reduce)."""

    scaler = None   # no loss scaling (fp16 is refused): the loop may read each step's numbers one step late

    def __init__(self, module, lm, optimizer, train_cfg: TrainConfig, dist_info: DistInfo):
        self.module, self.lm, self.optimizer = module, lm, optimizer
        self.clip = float(train_cfg.grad_clip)
        self.world_size, self.rank = dist_info.world_size, dist_info.rank
        self._params = [p for p in module.parameters() if p.requires_grad]

    def backward(self, loss, last: bool) -> None:
        if self.world_size == 1:
            self.module.set_requires_gradient_sync(last)
        loss.backward()

    def step(self) -> StepInfo:
        import torch

        norm = _local(torch.nn.utils.clip_grad_norm_(self._params, self.clip if self.clip > 0 else float("inf")))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        # on CUDA the norm stays a device tensor: the loop reads it one step later (no sync)
        return StepInfo(norm if norm.is_cuda else float(norm), False, None)

    def save(self, tmp: Path) -> None:
        """All ranks: the sharded model + optimizer state as a DCP directory tmp/dcp/ (one file per rank)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / DCP_DIR))

    def load(self, path: Path) -> None:
        """All ranks: read path/dcp/ into the sharded model and optimizer (same world size as the save)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        if not (path / DCP_DIR).is_dir():
            raise InputDataError(f"checkpoint {path} holds no {DCP_DIR}/ directory: it was written by "
                                 f"{_writer_of(path)}, not train.engine=fsdp2; resume with that engine")
        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path / DCP_DIR))
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def scaler_state(self) -> dict | None:
        return None

    def load_scaler_state(self, state: dict | None) -> None:
        return None

    def full_state_dict(self) -> dict | None:
        """The LM's full fp32 state dict on rank 0 (every rank takes part in the gather), None on the others."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return None
        return {k.removeprefix("lm."): v for k, v in sd.items()}
