"""The model: a Llama-style transformers model (`build.build_model`) and isolated attention backends for
packed batches (`attention`). torch/transformers are imported inside functions."""
