"""The evaluate stage's GPU defaults (skipped without CUDA): evaluate.precision auto → bf16, attention auto →
varlen, evaluate.rows auto → FORWARD_TOKENS per forward; the held-out loss in bf16 agrees with fp32 within the
tolerance docs/evaluate.md states (0.5% relative), on a model trained a few steps so the loss is not ln(V).

    python -m pytest -q -s tests/gpu/test_evaluate_gpu.py     # -s prints tokens/s of both precisions
"""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BF16_REL_TOL = 5e-3


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from packtrain.config import load_run_config
    from packtrain.testing.synthetic_inputs import make_synthetic_inputs
    from packtrain.train.loop import train

    cfg = load_run_config("350m-h200")
    root = tmp_path_factory.mktemp("gpu_eval")
    tokens, packs = make_synthetic_inputs(root, n_docs=800, vocab_size=cfg.tokenize.vocab_size,
                                          budget=cfg.pack.budget, eval_fraction=0.2)
    model_cfg = cfg.model.model_copy(update={"hidden_size": 512, "intermediate_size": 1408, "num_layers": 6,
                                             "num_heads": 8})
    train_cfg = cfg.train.model_copy(update={
        "max_steps": 40, "compile": False, "warmup_steps": 4, "rows": 4,
        "checkpoint": cfg.train.checkpoint.model_copy(update={"every_steps": 0})})
    tel = cfg.telemetry.model_copy(update={"warmup_steps": 5})
    r = train(model_cfg, train_cfg, cfg.pack, tel, packs, tokens / "tokenizer", root / "train")
    assert r.final_loss is not None and r.final_loss < r.loss_curve[0]
    return root / "train" / "model", packs / "eval"


def test_bf16_varlen_default_agrees_with_fp32(trained):
    from packtrain.config import EvalConfig
    from packtrain.config.evaluate import FORWARD_TOKENS
    from packtrain.evaluate.perplexity import evaluate
    from packtrain.model.attention import available_backends

    model_dir, split = trained
    ref = evaluate(model_dir, split, EvalConfig(precision="fp32", attention="sdpa", rows=4, prompts=["a"],
                                                sample_tokens=2))
    auto = evaluate(model_dir, split, EvalConfig(prompts=["a"], sample_tokens=2))
    print(json.dumps({"test": "eval_bf16_vs_fp32", "fp32_loss": ref.eval_loss, "bf16_loss": auto.eval_loss,
                      "fp32_tok_s": ref.tokens_per_s, "auto_tok_s": auto.tokens_per_s, "auto_rows": auto.rows,
                      "auto_attention": auto.attention, "timings": auto.timings}))
    assert auto.precision == "bf16" and auto.rows == FORWARD_TOKENS // auto.budget
    if "varlen" in available_backends("cuda", "bf16"):
        assert auto.attention == "varlen"
    assert ref.n_label_tokens == auto.n_label_tokens and auto.complete
    assert math.isfinite(auto.eval_loss)
    assert abs(auto.eval_loss - ref.eval_loss) / ref.eval_loss < BF16_REL_TOL


def test_compiled_scoring_matches_eager_with_one_graph(trained):
    """evaluate.compile auto (on under CUDA): the held-out loss and a suite's per-document NLL agree with the
    eager forward; the held-out epoch compiles one layer graph, the suite (the same tokens per forward, another
    longest segment: varlen's max length is a static int) at most one more, and scoring again compiles none."""
    import numpy as np

    from packtrain.config import EvalConfig
    from packtrain.config.evaluate import forward_rows
    from packtrain.evaluate.docscore import score_documents
    from packtrain.evaluate.loading import load_for_eval
    from packtrain.evaluate.perplexity import evaluate
    from packtrain.evaluate.suites import recent_suite
    from packtrain.train.techniques import CompileCounter

    model_dir, split = trained
    eager = evaluate(model_dir, split, EvalConfig(compile=False, prompts=["a"], sample_tokens=2))
    cfg = EvalConfig(prompts=["a"], sample_tokens=4)
    torch._dynamo.reset()
    counter = CompileCounter().start()
    try:
        ld = load_for_eval(model_dir, cfg)
        comp = evaluate(model_dir, split, cfg, loaded=ld)
        suite = recent_suite("primary", split, ld.tokenizer, 64)
        rows = forward_rows(cfg.rows, "cuda", cfg.suite_budget)
        args = (ld.model, ld.tokenizer, suite.docs, cfg.suite_budget, rows, "bf16", ld.backend, ld.device)
        held_out_compiles = counter.compiles
        sc = score_documents(*args, compiled=True)
        suite_compiles = counter.compiles
        again = score_documents(*args, compiled=True)
        with ld.eager():
            sc_eager = score_documents(*args)
    finally:
        counter.stop()
    print(json.dumps({"test": "eval_compiled_vs_eager", "eager_loss": eager.eval_loss, "compiled_loss": comp.eval_loss,
                      "eager_tok_s": eager.tokens_per_s, "compiled_tok_s": comp.tokens_per_s,
                      "compiles": counter.ids, "timings": comp.timings}))
    assert ld.compiled and comp.compiled and not eager.compiled
    assert comp.n_label_tokens == eager.n_label_tokens
    assert abs(comp.eval_loss - eager.eval_loss) / eager.eval_loss < 2e-3
    assert held_out_compiles == 1 and suite_compiles <= 2 and counter.compiles == suite_compiles, counter.ids
    assert np.allclose(sc.nll, sc_eager.nll, rtol=5e-3) and (sc.tokens == sc_eager.tokens).all()
    assert np.array_equal(sc.nll, again.nll)
