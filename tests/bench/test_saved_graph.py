"""bench/saved_graph.py on a two-matmul MLP whose saved tensors are known by hand: no recompute keeps exactly what
autograd saves; caching the matrix products keeps their outputs + the input and re-runs only the ReLU; full
recompute keeps the input and re-runs the first product (the second's output is needed by nothing saved)."""

from __future__ import annotations

import torch

from bench.saved_graph import record


def test_policies_of_a_two_matmul_mlp():
    torch.manual_seed(0)
    t, d, h = 8, 64, 128
    w1 = torch.randn(d, h, requires_grad=True)
    w2 = torch.randn(h, d, requires_grad=True)
    x = torch.randn(t, d, requires_grad=True)
    g = record(lambda x: torch.relu(x @ w1) @ w2, x, params=[w1, w2])
    assert [g.ops[i].name for i in g.expensive()] == ["mm", "mm"]
    assert g.forward_flops == 2 * t * d * h * 2
    f32 = 4
    none = g.policy(None)              # x (for w1's gradient) + relu's output (its own backward and w2's gradient)
    assert none.kept_bytes == f32 * (t * d + t * h) and none.recompute_flops == 0
    selective = g.policy(set(g.expensive()))
    assert selective.kept_bytes == f32 * (t * d + t * h) and selective.recompute_flops == 0   # mm1 out + x
    assert set(selective.kept) == {"input", "mm (-)"}
    full = g.policy(set())
    assert full.kept_bytes == f32 * t * d and full.recompute_flops == 2 * t * d * h
    frontier = g.frontier()
    assert [p.kept_bytes for _, p in frontier] == [f32 * t * d, f32 * (t * d + t * h)]
