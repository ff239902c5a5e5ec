"""Ranks, devices and the host-side collectives of a training run.

    dist_info()                 rank / local_rank / world_size from torchrun or the DeepSpeed launcher env
    resolve_device(cfg, d)      cuda:LOCAL_RANK, or cpu
    init_distributed(d, dev)    NCCL (CUDA) or gloo (CPU) process group when world_size > 1 (+ a gloo host group)
    global_sum / gather_floats / broadcast_object / barrier     over the host group; no-ops on one process
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from packtrain.errors import ConfigError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1   # processes (GPUs) on this node

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def dist_info() -> DistInfo:
    """From RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE (set by torchrun and the DeepSpeed launcher);
    0/0/1/1 otherwise."""
    env = os.environ
    world = int(env.get("WORLD_SIZE", 1))
    return DistInfo(int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), world,
                    int(env.get("LOCAL_WORLD_SIZE", world)))


def resolve_device(device: str, d: DistInfo):
    """'auto' → cuda:LOCAL_RANK when CUDA is available, else cpu. 'cuda' without CUDA is a ConfigError."""
    import torch

    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise ConfigError("train.device: 'cuda' but torch sees no CUDA device (this torch is "
                          f"{torch.__version__}); use train.device=auto or cpu")
    if device in ("cuda", "auto") and has_cuda:
        torch.cuda.set_device(d.local_rank)
        return torch.device("cuda", d.local_rank)
    return torch.device("cpu")


_HOST_GROUP = None
"""A gloo process group for host numbers on CUDA runs (None: the default group, gloo on CPU)."""


def init_distributed(d: DistInfo, device) -> None:
    """NCCL (CUDA) or gloo (CPU) default group; on CUDA also a gloo group for the loop's host numbers, so summing
    a label count or a loss over ranks never waits for the GPU's queue to drain (an NCCL all-reduce + .item()
    would; measured with the bucket-view change on 2 H200s: DDP 0.865 → 0.875 per-GPU efficiency)."""
    global _HOST_GROUP
    if d.world_size <= 1:
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda" and _HOST_GROUP is None:
        _HOST_GROUP = dist.new_group(backend="gloo")


def global_sum(x: float | int, d: DistInfo) -> float:
    """Σ over ranks of a Python number (the window's label tokens, its loss sum), all-reduced on the host."""
    if d.world_size <= 1:
        return x
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t, group=_HOST_GROUP)
    return t.item()


def gather_floats(values: list[float], d: DistInfo) -> list[list[float]]:
    """Every rank's `values` (same length on all ranks), in rank order; [values] on one process."""
    if d.world_size <= 1:
        return [list(values)]
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    out = [torch.empty_like(t) for _ in range(d.world_size)]
    dist.all_gather(out, t, group=_HOST_GROUP)
    return [o.tolist() for o in out]


def broadcast_object(obj, d: DistInfo):
    """Rank 0's `obj` (any picklable value) on every rank, over the host group (never waits on the GPU)."""
    if d.world_size <= 1:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_HOST_GROUP)
    return box[0]


def barrier(d: DistInfo) -> None:
    if d.world_size > 1:
        import torch.distributed as dist

        dist.barrier()

