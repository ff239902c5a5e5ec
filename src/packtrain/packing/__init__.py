"""Sequence packing: documents → fixed token budgets, with isolation-ready batches.

    pack_lengths(lengths, budget, strategy)   pure bin-packing over document lengths → PackPlan
    pack_dataset(src, dst, cfg)               token store → pack store (train/, eval/) → PackStats
    PackedLoader / PackedBatch                fixed-shape (1, rows*budget) micro-batches, rank-sharded
    token_mean_loss                           loss normalized over the whole accumulation window

Submodules import numpy only; torch is imported inside the functions that build tensors.
"""
