"""The model: a Llama-style random init or any supported family's checkpoint (`build.build_model`,
`model.init_from` resolved by `init_from.resolve_init_source`), what each family's attention does and which
backends honour it (`families`), isolated attention backends for packed batches (`attention`). Tiny
random-weight checkpoints per family for tests: packtrain.testing.tiny_families. torch/transformers are
imported inside functions.
docs/model.md has the family × backend table."""
