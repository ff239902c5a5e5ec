"""LoRA through peft on packed batches: frozen base, exact parameter count, every attention backend that runs
here, activation checkpointing + compile without recompiles, bf16, adapter-only checkpoints, and the planner's
LoRA arithmetic. CPU, tiny real transformers models."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from packtrain.config import ModelConfig, PlanConfig, TrainConfig
from packtrain.config.train import AdapterConfig
from packtrain.errors import ConfigError
from packtrain.model.attention import available_backends, model_inputs
from packtrain.model.build import build_model
from packtrain.model.lora import adapter_param_count, apply_adapter, base_of
from packtrain.packing.batches import build_batch
from packtrain.planner import plan_memory
from packtrain.planner.shapes import model_shape
from packtrain.planner.states import lora_params
from packtrain.planner.step_bytes import CUDA_WORKSPACE_BYTES
from packtrain.train import checkpoint as ck
from packtrain.train import techniques as tq
from packtrain.train.loss import packed_causal_lm

V = 97
MODEL = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
LORA = AdapterConfig(type="lora", r=4, alpha=8.0)
ROWS = [[7, 20, 13], [30, 18]]
BUDGET = 48


def _lora_model(backend="sdpa", cfg=LORA, seed=0, **kw):
    """Tiny llama + LoRA whose B is random (peft starts B at 0, which would make the adapter invisible)."""
    torch.manual_seed(seed)
    model = build_model(MODEL, V, attention=backend)
    peft_model = apply_adapter(model, cfg, **kw)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    return model, peft_model


def _docs(seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.integers(3, V, n) for n in row] for row in ROWS]


def _batch(docs):
    return build_batch([np.concatenate(r) for r in docs], [np.array([len(d) for d in r]) for r in docs], BUDGET)


def test_apply_adapter_freezes_the_base_and_counts_exactly():
    model, peft_model = _lora_model()
    assert base_of(peft_model) is model and base_of(model) is model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # Σ over 2 layers of r·(in+out): q,o 4·(32+32)=256 each; k,v 4·(32+16)=192 each; gate/up/down 4·(32+64)=384
    assert adapter_param_count(peft_model) == 2 * (2 * 256 + 2 * 192 + 3 * 384) == 4096
    assert lora_params(model_shape(MODEL, None, V), 4) == 4096
    q_only = apply_adapter(build_model(MODEL, V), AdapterConfig(type="lora", r=2, target_modules=["q_proj"]))
    assert adapter_param_count(q_only) == 2 * 2 * (32 + 32) == lora_params(model_shape(MODEL, None, V), 2, ["q_proj"])
    assert apply_adapter(model, AdapterConfig()) is model   # type none: untouched
    with pytest.raises(ConfigError, match="train.adapter.target_modules"):
        apply_adapter(build_model(MODEL, V), AdapterConfig(type="lora", target_modules=["no_such_proj"]))


def _doc_loss(module, doc, backend):
    """Σ token losses of one document alone (its own batch, same backend)."""
    b = build_batch([doc], [np.array([len(doc)])], BUDGET).to(next(module.parameters()).device)
    return module(labels=b.labels, **model_inputs(b, backend))


TRAIN_BACKENDS = [b for b in available_backends("cuda" if torch.cuda.is_available() else "cpu", "bf16")
                  if b != "varlen" or torch.cuda.is_available()]


@pytest.mark.parametrize("backend", TRAIN_BACKENDS)
def test_lora_on_packed_rows_isolates_documents_and_trains_only_the_adapter(backend):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model, _ = _lora_model(backend)
    model.to(dev)
    module = packed_causal_lm(model)
    docs = _docs()
    b = _batch(docs).to(dev)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if backend == "varlen" else torch.autocast(dev, enabled=False)
    with amp:
        loss = module(labels=b.labels, **model_inputs(b, backend))
        with torch.no_grad():
            alone = sum(_doc_loss(module, d, backend) for r in docs for d in r)
    tol = 2e-2 if backend == "varlen" else 1e-5
    assert abs(loss.item() - float(alone)) <= tol * abs(float(alone)), (backend, loss.item(), float(alone))
    loss.backward()
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, n
        else:
            assert p.grad is None, n


def test_flex_forward_with_lora_isolates_documents_on_cpu():
    if "flex" not in available_backends("cpu", "fp32", training=False):
        pytest.skip("no FlexAttention in this torch")
    model, _ = _lora_model("flex")
    module = packed_causal_lm(model)
    docs = _docs(1)
    b = _batch(docs)
    with torch.no_grad():
        packed = module(labels=b.labels, **model_inputs(b, "flex"))
        alone = sum(_doc_loss(module, d, "flex") for r in docs for d in r)
    assert abs(packed.item() - alone.item()) <= 1e-5 * abs(alone.item())


def _train_steps(ac: str, compile_backend: str | None, steps: int = 3):
    """`steps` AdamW steps of a LoRA model (adapter → AC → compile, the train stage's order) on new data of one
    shape → (losses, adapter tensors, compile counter)."""
    model, peft_model = _lora_model()
    tq.apply_activation_checkpointing(model, TrainConfig(activation_checkpointing=ac))
    if compile_backend:
        torch._dynamo.reset()   # an earlier model's graphs of the same layer code would make this one a recompile
    counter = tq.apply_compile(model, TrainConfig(compile=True), backend=compile_backend) if compile_backend else None
    opt = tq.build_optimizer(model, TrainConfig(lr=1e-2), "cpu")
    module = packed_causal_lm(model)
    losses = []
    try:
        for s in range(steps):
            b = _batch(_docs(s))
            loss = module(labels=b.labels, **model_inputs(b, "sdpa"))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    finally:
        if counter is not None:
            counter.stop()
    n_opt = sum(p.numel() for g in opt.param_groups for p in g["params"])
    return losses, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, counter, n_opt


@pytest.mark.parametrize("ac", ["full", "selective"])
def test_lora_with_checkpointing_and_compile_matches_eager_and_never_recompiles(ac):
    ref_losses, ref_w, _, n_opt = _train_steps("none", None)
    assert n_opt == 4096   # the optimizer holds the adapter only
    losses, w, counter, _ = _train_steps(ac, "aot_eager")
    assert counter is not None and counter.compiles >= 1 and counter.recompiles == 0, counter.ids
    assert np.allclose(losses, ref_losses, rtol=1e-5), (losses, ref_losses)
    assert max((w[k] - ref_w[k]).abs().max().item() for k in w) <= 1e-5


def test_bf16_base_keeps_an_fp32_adapter():
    model, peft_model = _lora_model(base_dtype=torch.bfloat16)
    dtypes = {p.requires_grad: set() for p in model.parameters()}
    for p in model.parameters():
        dtypes[p.requires_grad].add(p.dtype)
    assert dtypes == {False: {torch.bfloat16}, True: {torch.float32}}
    b = _batch(_docs())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = packed_causal_lm(model)(labels=b.labels, **model_inputs(b, "sdpa"))
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("ac", ["none", "full"])
def test_branches_sharing_their_input_under_autocast_are_bitwise_the_same_and_keep_fewer_bytes(ac):
    """peft's per-branch cast to the fp32 adapter is undone by autocast; with it off (what training does) the loss
    and every gradient are bitwise equal, autograd keeps fewer bytes, and a checkpointed layer's recompute in
    backward (outside the autocast block) still runs."""
    from packtrain.model.lora import adapter_input_casts, lora_layers

    model, peft_model = _lora_model(base_dtype=torch.bfloat16)
    tq.apply_activation_checkpointing(model, TrainConfig(activation_checkpointing=ac))
    layers = lora_layers(model)
    assert len(layers) == 2 * 7
    b = _batch(_docs())
    module = packed_causal_lm(model)
    runs = {}
    for cast in (True, False):
        saved: dict[int, int] = {}

        def pack(t, saved=saved):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with adapter_input_casts(layers, cast):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", torch.bfloat16):
                loss = module(labels=b.labels, **model_inputs(b, "sdpa"))
            loss.backward()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        runs[cast] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad},
                      sum(v for k, v in saved.items() if k not in params))
        model.zero_grad(set_to_none=True)
    assert all(getattr(m, "cast_input_dtype_enabled", True) for m in layers)   # restored on exit
    (l_on, g_on, bytes_on), (l_off, g_off, bytes_off) = runs[True], runs[False]
    assert torch.equal(l_on, l_off) and g_on.keys() == g_off.keys()
    assert all(torch.equal(g_on[k], g_off[k]) for k in g_on)
    if ac == "none":   # (under checkpointing the layers' own hooks replace this one: nothing to compare)
        assert bytes_off < bytes_on


def test_adapter_only_checkpoint_round_trips(tmp_path):
    model, _ = _lora_model()
    opt = tq.build_optimizer(model, TrainConfig(), "cpu")
    b = _batch(_docs())
    packed_causal_lm(model)(labels=b.labels, **model_inputs(b, "sdpa")).backward()
    opt.step()
    path = ck.save_checkpoint(tmp_path, 1, {"history": []}, ck.torch_payload_writer(model, opt, trainable_only=True), 2)
    files = set(json.loads((path / "manifest.json").read_text())["files"])
    assert files == {"adapter.safetensors", "optimizer.pt", "rng.pt", "state.json"}
    from safetensors.torch import load_file

    saved = load_file(str(path / "adapter.safetensors"))
    assert sum(t.numel() for t in saved.values()) == 4096 and all("lora_" in k for k in saved)

    fresh, _ = _lora_model(seed=0)   # the same base (seeded) with a different adapter state
    with torch.no_grad():
        for p in fresh.parameters():
            if p.requires_grad:
                p.zero_()
    fresh_opt = tq.build_optimizer(fresh, TrainConfig(), "cpu")
    ck.load_torch_payload(path, fresh, fresh_opt, "cpu")
    for (n, a), b_ in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b_), n
    sa, sb = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    full = build_model(MODEL, V)   # a full fine-tune cannot resume from an adapter checkpoint
    with pytest.raises(Exception, match="adapter"):
        ck.load_torch_payload(path, full, tq.build_optimizer(full, TrainConfig(), "cpu"), "cpu")


def test_planner_lora_arithmetic_exact():
    """Llama-3-8B shape, r 16 on all linears, bf16, 1 GPU, fused AdamW: the model states exactly."""
    m8b = ModelConfig(hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                      tie_word_embeddings=False)
    plan_cfg = PlanConfig(vocab_size=128256, device_memory_gib=139.0)
    cfg = TrainConfig(precision="bf16", rows=8, attention="varlen", activation_checkpointing="full",
                      adapter=AdapterConfig(type="lora", r=16))
    shape = model_shape(m8b, plan_cfg, 128256)
    a = lora_params(shape, 16)
    # per layer: q,o 16·(4096+4096); k,v 16·(4096+1024); gate,up,down 16·(4096+14336)
    assert a == 32 * 16 * (2 * 8192 + 2 * 5120 + 3 * 18432) == 41_943_040
    plan = plan_memory(m8b, cfg, 2048, plan_cfg, vocab_size=128256, device="cuda")
    full = plan_memory(m8b, cfg.model_copy(update={"adapter": AdapterConfig()}), 2048, plan_cfg,
                       vocab_size=128256, device="cuda")
    P = shape.n_params
    assert plan.adapter_params == a and full.adapter_params == 0
    c = plan.components
    assert c["parameters"] == 2 * P + 4 * a              # frozen bf16 base + fp32 adapter
    assert c["optimizer_states"] == 8 * a                # AdamW m, v of the adapter only
    assert c["weight_casts"] == 0 and c["master_weights"] == 0
    # optimizer step: base + adapter, adapter gradients, AdamW states (fused: no temporary), cuBLAS workspaces
    assert plan.phases["optimizer step"] == 2 * P + 4 * a + 4 * a + 8 * a + CUDA_WORKSPACE_BYTES
    assert full.components["parameters"] == 4 * P and full.components["optimizer_states"] == 8 * P
    assert plan.peak < full.peak / 2
    assert plan.precision.startswith("bf16 autocast (LoRA") and plan.checkpointed_layer_bytes == 2 * 4096 * 8 * 2048


def test_lora_flops_count_no_weight_gradients_for_the_frozen_base():
    from packtrain.telemetry.mfu import step_flops
    from packtrain.train.parts import Telemetry

    dims = {"n_layers": 2, "hidden_size": 32, "vocab_size": V, "attn_width": 32, "windows": (None, None)}
    b = _batch(_docs())
    n = 18_592   # non-embedding parameters of MODEL
    full = Telemetry(None, None, 1.0, dims, n, None)   # type: ignore[arg-type]
    lora = Telemetry(None, None, 1.0, dims, n, None, adapter_params=4096)   # type: ignore[arg-type]
    u_full, d_full = full.window_flops([b])
    assert (u_full, d_full) == step_flops(n, 2, 32, b.seq_lens, b.rows * b.budget, b.budget, V, attn_width=32)
    u, d = lora.window_flops([b])
    real, slot = sum(b.seq_lens), b.rows * b.budget
    assert u == u_full - 2.0 * (n + 32 * V) * real + 6.0 * 4096 * real
    assert d == d_full - 2.0 * (n + 32 * V) * slot + 6.0 * 4096 * slot


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inductor + varlen/flex training need CUDA")
@pytest.mark.parametrize("backend", ["varlen", "flex", "sdpa"])
def test_cuda_lora_bf16_checkpointed_compiled_compiles_only_in_the_first_step(backend):
    """Adapter → AC → inductor compile, bf16 base, packed (1, 4·1024) batches of changing documents: every compile
    happens in step 1 (measured on the H200, torch 2.11: varlen, flex and sdpa alike)."""
    torch.manual_seed(0)
    gpu_model = ModelConfig(hidden_size=256, intermediate_size=512, num_layers=4, num_heads=4, num_kv_heads=2)
    vocab = 1000
    model = build_model(gpu_model, vocab, attention=backend, device="cuda")
    apply_adapter(model, AdapterConfig(type="lora", r=8), base_dtype=torch.bfloat16)
    tq.apply_activation_checkpointing(model, TrainConfig(activation_checkpointing="full"))
    counter = tq.apply_compile(model, TrainConfig(compile=True))
    assert counter is not None
    opt = tq.build_optimizer(model, TrainConfig(lr=1e-3), "cuda")
    module = packed_causal_lm(model)
    rng = np.random.default_rng(0)
    after_first: list[str] = []
    try:
        for step in range(4):
            rows = [[int(x) for x in rng.integers(20, 300, 3)] for _ in range(4)]
            b = build_batch([rng.integers(3, vocab, sum(r)) for r in rows], [np.array(r) for r in rows],
                            1024).to("cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = module(labels=b.labels, **model_inputs(b, backend, compiled=True))
            (loss / b.n_label_tokens).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            assert torch.isfinite(loss)
            if step == 0:
                after_first = list(counter.ids)
    finally:
        counter.stop()
    assert after_first and counter.ids == after_first, counter.ids
