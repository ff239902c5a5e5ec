"""Evaluation: held-out perplexity on packed batches, the suites, both models scored, the paired comparison.

    evaluate(model_dir, eval_split_dir, cfg: EvalConfig) -> EvalStats           perplexity.py
    build_tiny_model_dir(out_dir, texts)                                       tiny.py (tests, smoke runs)

Registration, the champion/challenger aliases and loading a registered model live in packtrain.registry.

Import from the module that defines a name (`from packtrain.evaluate.perplexity import evaluate`): this package
exports nothing, so `import packtrain.evaluate` costs no torch/mlflow import.
"""
