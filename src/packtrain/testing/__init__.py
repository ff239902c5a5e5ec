"""Builders for tests and the benchmark: tiny models, synthetic inputs, a tiny corpus. The product never imports
them (nothing under packtrain outside this package does); they ship in the wheel because the GPU host runs
`python -m bench` against an installed packtrain.

    tiny_model.py        build_tiny_model_dir: byte-level BPE + random-init Llama, the train stage's layout
    tiny_families.py     build_tiny_family_dir: a random-weight checkpoint of every supported family
    synthetic_inputs.py  make_synthetic_inputs: token store + pack stores + tokenizer of Markov-chain documents
    synthetic_lengths.py length_set: the packing benchmark's lognormal / pareto / uniform document lengths
    tiny_corpus.py       tiny_corpus + tiny_settings: a 60-document corpus and the tiny-cpu overrides for it
    gpu_smoke.py         isolation_error, smoke_run: the GPU smoke checks of `python -m bench train-smoke`

The chat data of the sft-tiny-cpu recipe is not here: users make it with `python -m packtrain.data.synthetic_chat`.
"""
