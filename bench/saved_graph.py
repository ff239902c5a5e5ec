"""What one forward keeps for backward, and what any selective-recompute policy would keep and recompute instead.

`record(fn, *inputs, shared=...)` runs `fn` once under a TorchDispatchMode and autograd's saved-tensor hooks and
returns its `SavedGraph`: every aten op with the storages it read and wrote, its FLOPs (matrix products and
attention), and the storages autograd saved for backward. A storage is keyed by (address, version), so in-place
ops and views resolve to the tensor that was actually saved; every op output is held alive while recording so no
address is reused.

`SavedGraph.policy(cached, compiled)` answers what selective activation checkpointing (torch.utils.checkpoint
with a `create_selective_checkpoint_contexts` policy) keeps when the outputs of the ops in `cached` are saved and
every other op is recomputed — as eager torch runs it, or inside torch.compile (see the method) — as the bytes
kept and the FLOPs re-run in backward. `cached=None` is no checkpointing (exactly what
autograd saved); an empty set is full checkpointing (the region's inputs only, the whole forward re-run).
Parameters and `shared` tensors (RoPE tables, common to every layer) are not counted. `expensive()` names the
ops `train.activation_checkpointing=selective` keeps (packtrain.train.selective_ac.keeps, the one rule), so
`policy(set(expensive()))` is what that mode keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from packtrain.train.selective_ac import ATTENTION, keeps, matmul_widths


@dataclass
class Op:
    name: str                   # aten overload packet ("mm", "_scaled_dot_product_flash_attention_for_cpu", ...)
    where: str                  # the innermost module running it ("mlp.gate_proj.base_layer"), "" outside any
    inputs: list[tuple]         # storage keys read
    outputs: list[tuple]        # storage keys written (new storages, or a new version of an input's)
    flops: float                # 2·m·k·n for matrix products, 4·b·heads·s_q·s_k·d for attention, else 0
    inner: int = 0              # a matrix product's contracted width
    out: int = 0                # a matrix product's output width
    mutable: bool = False       # an in-place / out= overload (never kept)


@dataclass
class Policy:
    kept_bytes: int             # bytes held from forward to backward
    recompute_flops: float      # FLOPs re-run in backward to rebuild what backward needs
    kept: dict[str, int] = field(default_factory=dict)   # producer op name → bytes kept, for the record


@dataclass
class SavedGraph:
    ops: list[Op]
    producer: dict[tuple, int]  # storage key → index of the op that wrote it
    nbytes: dict[tuple, int]    # storage key → bytes of its storage
    saved: set[tuple]           # keys autograd saved for backward (parameters and shared tensors excluded)
    inputs: set[tuple]          # keys that existed before the region (its inputs); parameters excluded
    forward_flops: float        # FLOPs of the whole forward
    stop: int = 0               # ops before this index ran when the last saved tensor was saved: what a
                                # checkpoint's recompute replays before it stops early (torch's early stop)

    def expensive(self, rank: int | None = None) -> list[int]:
        """The ops whose outputs the selective policy keeps (packtrain.train.selective_ac.keeps: attention and
        the linear layers' products; the adapter's rank-`rank` products and element-wise ops are recomputed)."""
        return [i for i, o in enumerate(self.ops) if not o.mutable and keeps(o.name, o.inner, o.out, rank)]

    def policy(self, cached: set[int] | None, compiled: bool = False) -> Policy:
        """What torch.utils.checkpoint keeps and re-runs with the outputs of `cached` saved (its selective
        contexts). Eager: every output of every cached op, needed or not, plus the region's inputs; backward
        replays the forward in order, cached ops from the cache, until the last tensor autograd saves is saved
        again (early stop), so every other op before that point runs once more. Compiled (the region inside
        torch.compile): the partitioner keeps only the cached outputs backward needs and recomputes only the
        ancestors of what it saves — a walk back from each saved tensor to a cached output or an input. None: no
        checkpointing."""
        if cached is None:   # no checkpointing: exactly what autograd saved
            return self._kept(self.saved, ())
        if not compiled:
            return self._kept({k for i in cached for k in self.ops[i].outputs} | self.inputs,
                              [i for i in range(self.stop) if i not in cached])
        kept, walked = set(), set()
        stack = list(self.saved)
        while stack:
            key = stack.pop()
            i = self.producer.get(key)
            if i is None:                      # an input of the region (or a parameter: not in nbytes)
                if key in self.nbytes:
                    kept.add(key)
            elif i in cached:
                kept.add(key)
            elif i not in walked:
                walked.add(i)
                stack.extend(self.ops[i].inputs)
        return self._kept(kept, walked)

    def _kept(self, keys, rerun) -> Policy:
        """The Policy of keeping the storages of `keys` and re-running the ops `rerun`."""
        return Policy(sum(self.nbytes[k] for k in _unique_storages(keys)), sum(self.ops[i].flops for i in rerun),
                      _by_producer(self, keys))

    def frontier(self, rank: int | None = None, compiled: bool = False) -> list[tuple[frozenset[int], Policy]]:
        """Every subset of the expensive ops cached (2^n, n ≈ 8 for a decoder layer), Pareto-optimal in
        (kept bytes, recompute FLOPs), fewest bytes first."""
        ex = self.expensive(rank)
        points = [(frozenset(c), self.policy(set(c), compiled)) for n in range(len(ex) + 1)
                  for c in combinations(ex, n)]
        points.sort(key=lambda p: (p[1].kept_bytes, p[1].recompute_flops))
        best: list[tuple[frozenset[int], Policy]] = []
        for c, p in points:
            if not best or p.recompute_flops < best[-1][1].recompute_flops:
                best.append((c, p))
        return best


def _unique_storages(keys) -> set[tuple]:
    """One key per storage address (two versions of one storage are the same bytes)."""
    seen: dict[int, tuple] = {}
    for k in keys:
        seen.setdefault(k[0], k)
    return set(seen.values())


def _by_producer(g: SavedGraph, keys) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in _unique_storages(keys):
        i = g.producer.get(k)
        name = "input" if i is None else f"{g.ops[i].name} ({g.ops[i].where or '-'})"
        out[name] = out.get(name, 0) + g.nbytes[k]
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _flops(name: str, args: tuple) -> tuple[float, int, int]:
    """(FLOPs, inner width, output width) of one op: 2·m·k·n for matrix products, 4·b·heads·s_q·s_k·d for
    SDPA-layout (b, heads, s, d) attention (full s_q·s_k, the packtrain MFU convention), 0 for the rest."""
    import math

    if name in ("mm", "addmm", "_scaled_mm"):
        inner, out = matmul_widths(name, args)
        m = (args[1] if name == "addmm" else args[0]).shape[0]
        return 2.0 * m * inner * out, inner, out
    if name in ("bmm", "baddbmm"):
        a, b = (args[1], args[2]) if name == "baddbmm" else (args[0], args[1])
        return 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2], 0, 0
    if name in ATTENTION and args[0].dim() == 4:
        q, k = args[0], args[1]
        return 4.0 * math.prod(q.shape[:-1]) * k.shape[-2] * q.shape[-1], 0, 0
    return 0.0, 0, 0


def op_counter():
    """A TorchDispatchMode that tallies, per op (overload packet), its calls and FLOPs (as `_flops` counts them):
    `with op_counter() as c: loss.backward()` → c.calls["mm"], c.flops["mm"]."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls: Counter[str] = Counter()
            self.flops: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            self.calls[name] += 1
            self.flops[name] += _flops(name, args)[0]
            return func(*args, **(kwargs or {}))

        def matmul_flops(self) -> float:
            """FLOPs of the 2-D matrix products (mm, addmm)."""
            return self.flops["mm"] + self.flops["addmm"]

    return OpCounter()


def record(fn, *inputs, shared: tuple = (), params=(), module=None) -> SavedGraph:
    """Run `fn(*inputs)` (its forward only) and return what it saved and how each saved tensor was made.
    `module`: its submodules' names label the ops (Op.where)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def key(t) -> tuple:
        return (t.untyped_storage().data_ptr(), t._version)

    skip = {t.untyped_storage().data_ptr() for t in [*params, *shared]}
    ops: list[Op] = []
    producer: dict[tuple, int] = {}
    nbytes: dict[tuple, int] = {}
    alive: list = []
    where: list[str] = []
    hooks = []

    def enter(name: str):
        def hook(mod, args) -> None:
            where.append(name)
        return hook

    def leave(mod, args, out) -> None:
        where.pop()

    for name, sub in (module.named_modules() if module is not None else []):
        hooks += [sub.register_forward_pre_hook(enter(name)), sub.register_forward_hook(leave)]

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            flat_in = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            before = [key(t) for t in flat_in]
            out = func(*args, **kwargs)
            flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            name = func.overloadpacket.__name__
            new = []
            for t in flat_out:
                k = key(t)
                if k in producer or k[0] in skip or k in before or not t.numel():   # a view of a known one
                    continue                                                          # (or empty: no storage)
                new.append(k)
                nbytes[k] = t.untyped_storage().nbytes()
                alive.append(t)
            if new:
                for k in new:
                    producer[k] = len(ops)
                ops.append(Op(name, where[-1] if where else "", before, new, *_flops(name, args),
                              mutable=bool(getattr(getattr(func, "_schema", None), "is_mutable", False))))
            return out

    for t in inputs:
        nbytes[key(t)] = t.untyped_storage().nbytes()
    saved: set[tuple] = set()

    stop = [0]

    def pack(t: Any):
        stop[0] = len(ops)   # every pack counts for the early stop; inputs are saved before their op is recorded,
        k = key(t)           # outputs after
        if k[0] not in skip and t.numel():
            saved.add(k)
            nbytes.setdefault(k, t.untyped_storage().nbytes())
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), Recorder():
            fn(*inputs)
    finally:
        for hk in hooks:
            hk.remove()
    in_keys = {key(t) for t in inputs}
    return SavedGraph(ops, producer, nbytes, saved, in_keys, sum(o.flops for o in ops), stop[0])
