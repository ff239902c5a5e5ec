"""Long context on the CPU: the long-document policy (pack.chunk_positions), RoPE settings that reach the model,
and the planner's growth with the budget (docs/long-context.md).

A document longer than the budget is cut into chunks at multiples of the budget; each chunk is its own segment
(isolated like a document, first label -100). `restart` counts its positions from 0, `continue` from its offset.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch

from packtrain.config import ModelConfig, PackConfig, load_run_config
from packtrain.model.attention import available_backends, model_inputs
from packtrain.model.build import build_model
from packtrain.model.rope import rotary_state
from packtrain.packing.batches import IGNORE, PackedLoader, build_batch, token_loss_sum, token_mean_loss
from packtrain.packing.dataset import pack_dataset
from packtrain.testing.synthetic_lengths import write_random_token_store

V = 61
B = 16                                      # pack budget
LONG = 41                                   # → chunks (0, 16), (16, 16), (32, 9)
MODEL = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    max_position_embeddings=64, init_std=0.2)   # 0.2: attention far from uniform at toy widths
CPU_BACKENDS = [b for b in available_backends("cpu", "fp32", training=False) if b != "varlen"]


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """One token store (a 41-token document + short ones, no eval split) packed both ways at budget 16."""
    root = tmp_path_factory.mktemp("long")
    write_random_token_store(root / "tok", [LONG, 7, 5, 3, 9, 4], vocab_size=V, eval_fraction=0.0, seed=3)
    out = {}
    for policy in ("restart", "continue"):
        pack_dataset(root / "tok", root / policy, PackConfig(budget=B, chunk_positions=policy))
        out[policy] = root / policy / "train"
    return out


def _segments(loader: PackedLoader):
    """(doc_id, start, positions, labels) of every real segment over one epoch, in loader order."""
    st = loader.store
    out = []
    for ids in (loader.rank_packs(0, s) for s in range(len(loader))):
        batch = loader.collate(ids)
        pos, lab = batch.position_ids[0].numpy(), batch.labels[0].numpy()
        flat = 0
        for r, p in enumerate(ids):
            flat = r * B
            for doc, start, n in st.pack_segments(int(p)):
                out.append((int(doc), int(start), pos[flat:flat + n].tolist(), lab[flat:flat + n].tolist()))
                flat += n
    return out


def test_positions_of_a_split_document_follow_the_policy(packs):
    for policy, split in packs.items():
        meta = json.loads((split / "meta.json").read_text())
        assert meta["chunk_positions"] == policy
        loader = PackedLoader(split, rows=1, shuffle=False, drop_last=False, epochs=1)
        segs = _segments(loader)
        chunks = sorted((s, p, lab) for doc, s, p, lab in segs if doc == 100)   # the 41-token document
        assert [(s, len(p)) for s, p, _ in chunks] == [(0, 16), (16, 16), (32, 9)]
        for start, pos, lab in chunks:
            first = start if policy == "continue" else 0
            assert pos == list(range(first, first + len(pos)))
            assert lab[0] == IGNORE and IGNORE not in lab[1:]   # no context in its pack: first label dropped
        for doc, start, pos, _ in segs:                          # other documents start at 0 either way
            if doc != 100:
                assert start == 0 and pos[0] == 0


def test_a_store_without_the_key_restarts_and_a_bad_value_is_named(packs, tmp_path):
    import shutil

    split = tmp_path / "old"
    shutil.copytree(packs["continue"], split)
    meta = json.loads((split / "meta.json").read_text())
    del meta["chunk_positions"]   # a store written before the key existed
    (split / "meta.json").write_text(json.dumps(meta))
    assert PackedLoader(split, rows=1).chunk_positions == "restart"
    assert PackedLoader(split, rows=1, chunk_positions="continue").chunk_positions == "continue"
    meta["chunk_positions"] = "resume"
    (split / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(Exception, match="chunk_positions 'resume'; allowed 'restart', 'continue'"):
        PackedLoader(split, rows=1)


def test_a_continue_store_with_an_odd_chunk_start_is_refused_when_opened(packs, tmp_path):
    import shutil

    from packtrain.errors import InputDataError
    from packtrain.packing.store import file_crc32

    split = tmp_path / "odd"
    shutil.copytree(packs["continue"], split)
    segs = np.load(split / "segments.npy")
    i = int(np.flatnonzero(segs[:, 1] > 0)[0])   # a continuation chunk of the 41-token document
    start = int(segs[i, 1]) + 1
    segs[i, 1] = start
    np.save(split / "segments.npy", segs)
    meta = json.loads((split / "meta.json").read_text())
    meta["checksums"]["segments.npy"] = file_crc32(split / "segments.npy")   # a consistent but wrong store
    (split / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InputDataError, match=rf"segments.npy: segment {i} starts at token {start} .* multiple of the budget"):
        PackedLoader(split, rows=1)


def test_a_boundary_sdpa_would_merge_is_refused():
    # segment 2 starts at position 3 right after a segment ending at position 2: transformers' packed-row
    # detection (position ids not stepping by +1) would see one document
    with pytest.raises(ValueError, match="sdpa/eager would merge the two documents"):
        build_batch([np.arange(6)], [np.array([3, 3])], 8, rows_seg_starts=[np.array([0, 3])])


def _logits(model, batch, backend):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")   # eager-mode flex warns that it is unfused
        return model(**model_inputs(batch, backend)).logits.reshape(-1, V)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_continue_chunk_in_a_pack_equals_the_chunk_alone(backend):
    """Isolation with position ids that do not start at 0: a chunk (positions 32..40) packed after a document
    and before another equals the chunk alone at the same positions; the neighbours equal themselves alone."""
    torch.manual_seed(0)
    model = build_model(MODEL, V, attention=backend).eval()
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, V, n) for n in (5, 9, 7)]
    starts = [0, 32, 0]
    budget = 24
    batch = build_batch([np.concatenate(docs)], [np.array([5, 9, 7])], budget,
                        rows_seg_starts=[np.array(starts)])
    assert batch.position_ids[0, :21].tolist() == [*range(5), *range(32, 41), *range(7)]
    packed = _logits(model, batch, backend)
    at = 0
    for d, s in zip(docs, starts, strict=True):
        alone = _logits(model, build_batch([d], [np.array([len(d)])], len(d), rows_seg_starts=[np.array([s])]),
                        backend)
        assert torch.allclose(packed[at:at + len(d)], alone, atol=1e-5, rtol=1e-5), (backend, s)
        at += len(d)


def _loss_sum(model, b, backend: str = "sdpa") -> torch.Tensor:
    """Σ token losses of a batch; sdpa/eager logits come as (rows, budget, V) → flattened to (1, T, V)."""
    with torch.no_grad():
        logits = model(**model_inputs(b, backend)).logits
    return token_loss_sum(logits.reshape(1, -1, logits.shape[-1]), b.labels)


def _window_loss(model, loader) -> tuple[float, int]:
    """Token-mean loss of one epoch as ONE accumulation window (the loader's rows per micro-batch)."""
    batches = [loader.collate(loader.rank_packs(0, s)) for s in range(len(loader))]
    n = sum(b.n_label_tokens for b in batches)
    total = sum(token_mean_loss(_loss_sum(model, b), n) for b in batches)
    return float(total), n


def test_window_loss_is_independent_of_how_the_packs_are_batched(packs):
    """The long document's chunks in one micro-batch or in several: the same token-mean over the window, equal
    to Σ per-chunk loss sums / Σ label tokens computed chunk by chunk (each chunk alone)."""
    torch.manual_seed(0)
    model = build_model(MODEL, V).eval()
    one, n1 = _window_loss(model, PackedLoader(packs["restart"], rows=1, shuffle=False, drop_last=False))
    many, n3 = _window_loss(model, PackedLoader(packs["restart"], rows=3, shuffle=False, drop_last=False))
    assert n1 == n3 == (LONG + 7 + 5 + 3 + 9 + 4) - 8   # every segment's first token carries no label: 8 segments
    loader = PackedLoader(packs["restart"], rows=1, shuffle=False, drop_last=False)
    alone_sum, alone_n = 0.0, 0
    for p in range(loader.store.n_packs):
        st = loader.store
        toks = st.pack_tokens(p)
        at = 0
        for _, _, n in st.pack_segments(p):
            b = build_batch([toks[at:at + n]], [np.array([n])], int(n))
            alone_sum += float(_loss_sum(model, b))
            alone_n += b.n_label_tokens
            at += n
    assert alone_n == n1
    assert math.isclose(one, many, rel_tol=1e-6) and math.isclose(one, alone_sum / alone_n, rel_tol=1e-6)


def _epoch_loss(model, split, backend="sdpa") -> float:
    loader = PackedLoader(split, rows=2, shuffle=False, drop_last=False, epochs=1)
    s, n = 0.0, 0
    for b in loader:
        s += float(_loss_sum(model, b, backend))
        n += b.n_label_tokens
    return s / n


@pytest.mark.parametrize("scaling", [None, {"type": "linear", "factor": 4.0}])
def test_restart_and_continue_give_the_same_loss_under_plain_rope(packs, scaling):
    """RoPE scores depend only on q - k: shifting a whole chunk's positions by its offset changes nothing
    (fp32, up to rounding of cos/sin at larger angles). Holds for linear scaling too (still relative)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig.model_validate({**MODEL.model_dump(), "rope_scaling": scaling}), V).eval()
    restart, cont = _epoch_loss(model, packs["restart"]), _epoch_loss(model, packs["continue"])
    assert abs(restart - cont) / restart < 1e-5, (restart, cont)


def test_dynamic_rope_makes_the_policies_differ(packs, capfd):
    """Dynamic NTK grows θ once a position reaches max_position_embeddings (here 20 < 41): continue chunks get
    other frequencies than restart chunks, so the two losses differ (docs/long-context.md)."""
    cfg = ModelConfig.model_validate({**MODEL.model_dump(), "max_position_embeddings": 20,
                                      "rope_scaling": {"type": "dynamic", "factor": 4.0}})
    torch.manual_seed(0)
    model = build_model(cfg, V).eval()
    assert "dynamic: θ follows the micro-batch's largest position id" in capfd.readouterr().err   # said at build
    restart, cont = _epoch_loss(model, packs["restart"]), _epoch_loss(model, packs["continue"])
    assert abs(restart - cont) / restart > 1e-4, (restart, cont)


# ---- RoPE settings reach the model --------------------------------------------------------------------------

def test_scratch_llama_rope_theta_and_scaling():
    base = dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4, max_position_embeddings=64)
    d = 8   # head_dim
    default = 10000.0 ** (-torch.arange(0, d, 2).float() / d)
    inv, scale = rotary_state(build_model(ModelConfig(**base), V))
    assert torch.allclose(inv, default) and scale == 1.0
    inv, _ = rotary_state(build_model(ModelConfig(**base, rope_theta=500000.0), V))
    assert torch.allclose(inv, 500000.0 ** (-torch.arange(0, d, 2).float() / d))
    inv, _ = rotary_state(build_model(ModelConfig(**base, rope_scaling={"type": "linear", "factor": 4}), V))
    assert torch.allclose(inv, default / 4)
    yarn = {"type": "yarn", "factor": 4, "original_max_position_embeddings": 16}
    inv, scale = rotary_state(build_model(ModelConfig(**base, rope_scaling=yarn), V))
    assert math.isclose(scale, 0.1 * math.log(4) + 1, rel_tol=1e-6)      # YaRN's attention temperature
    assert inv[0] == default[0] and torch.allclose(inv[-1], default[-1] / 4)   # fast kept, slow interpolated
    llama3 = {"type": "llama3", "factor": 8, "original_max_position_embeddings": 16}
    m = build_model(ModelConfig(**base, rope_scaling=llama3), V)
    assert m.config.rope_parameters["rope_type"] == "llama3" and not torch.allclose(rotary_state(m)[0], default)
    dyn = build_model(ModelConfig(**base, rope_scaling={"type": "dynamic", "factor": 4}), V)
    assert torch.allclose(rotary_state(dyn)[0], default)   # dynamic changes θ only past max_position_embeddings


def test_rope_settings_are_explicit_only_when_not_null():
    assert load_run_config("tiny-cpu").model.rope_theta is None
    cfg = load_run_config("tiny-cpu", ["model.rope_theta=500000", "model.rope_scaling.type=yarn",
                                       "model.rope_scaling.factor=4"])
    assert cfg.model.rope_theta == 500000.0 and cfg.model.rope_scaling.factor == 4.0


@pytest.mark.parametrize("sets, fragment", [
    (["model.rope_scaling.type=linear", "model.rope_scaling.original_max_position_embeddings=8192"],
     "read by type yarn or llama3 only, not 'linear'"),
    (["model.rope_scaling.type=yarn", "model.rope_scaling.low_freq_factor=2"], "read by type llama3 only"),
    (["model.rope_scaling.type=llama3", "model.rope_scaling.low_freq_factor=4", "model.rope_scaling.high_freq_factor=2"],
     "must be greater than low_freq_factor"),
])
def test_rope_scaling_fields_the_type_ignores_are_refused(sets, fragment):
    from packtrain.errors import ConfigError

    with pytest.raises(ConfigError, match=fragment):
        load_run_config("tiny-cpu", sets)


def test_a_config_read_back_in_another_process_keeps_the_checkpoint_theta(tmp_path):
    """--gpus N ranks, KFP/Airflow pods and run.yaml read the config written out in full: the checkpoint's θ
    (here Llama-3's 500,000) must survive that round trip (it once became the default 10,000)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from packtrain.config import ModelConfig, RunConfig

    d = tmp_path / "llama3"
    LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=4, rope_theta=500000.0)).save_pretrained(d)
    cfg = load_run_config("tiny-cpu", [f"model.init_from={d}"])
    again = RunConfig.model_validate(cfg.to_dict())      # what a rank / pod reads
    assert again.model.rope_theta is None
    m = build_model(ModelConfig.model_validate(again.model.model_dump()), V)
    assert m.config.rope_parameters["rope_theta"] == 500000.0


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_checkpoint_rope_kept_unless_set_and_overridden_when_set(tmp_path, capfd, family):
    from packtrain.testing.tiny_families import build_tiny_family_dir

    d = build_tiny_family_dir(tmp_path / family, family, vocab_size=V)
    theta = json.loads((d / "config.json").read_text()).get("rope_parameters", {}).get("rope_theta", 10000.0)
    themed = build_model(ModelConfig(init_from=str(d), rope_theta=123.0), V)
    capfd.readouterr()
    plain = build_model(ModelConfig.model_validate({"init_from": str(d)}), V)
    assert "rope_parameters" not in capfd.readouterr().err
    inv0, _ = rotary_state(plain)
    assert plain.config.rope_parameters["rope_theta"] == theta
    assert themed.config.rope_parameters["rope_theta"] == 123.0
    m = build_model(ModelConfig.model_validate({"init_from": str(d),
                                                "rope_scaling": {"type": "linear", "factor": 4}}), V)
    err = capfd.readouterr().err
    assert f"model.init_from {d}: rope_parameters" in err and "rope_type: linear, factor: 4" in err
    assert torch.allclose(rotary_state(m)[0], inv0 / 4) and m.config.rope_parameters["rope_theta"] == theta


# ---- the planner at long budgets ------------------------------------------------------------------------------

@pytest.mark.parametrize("backend,order", [("varlen", 1), ("flex", 1), ("sdpa", 2), ("eager", 2)])
def test_planned_memory_grows_linearly_for_varlen_flex_and_quadratically_for_sdpa_eager(backend, order):
    from packtrain.planner.plan import plan_memory

    cfg = load_run_config("1b-32k-h200")
    budgets = [8192, 16384, 32768, 65536]
    plans = [plan_memory(cfg.model, cfg.train, s, cfg.plan, 139.8, vocab_size=32768, rows=1, device="cuda",
                         attention=backend, suggest=False) for s in budgets]
    per_layer = np.array([p.layer_activation_bytes for p in plans], float)
    fwd = np.array([p.phases["forward"] for p in plans], float)
    s = np.array(budgets, float)
    for y in (per_layer, fwd):
        c2, c1, c0 = np.polyfit(s, y, 2)          # four points, three coefficients: the fit must be exact
        assert np.allclose(np.polyval([c2, c1, c0], s), y, rtol=1e-9)
        share = c2 * s[-1] ** 2 / y[-1]            # the s² term's share at 64k
        assert (abs(share) < 1e-9) if order == 1 else (share > 0.2), (backend, share)
    if order == 1:
        assert plans[-1].components["attention_workspace"] == 0
        assert math.isclose(per_layer[2] / per_layer[0], 4.0, rel_tol=1e-6)   # 4× the tokens, 4× the bytes
    else:
        assert plans[2].components["attention_workspace"] == 4 * plans[1].components["attention_workspace"]


def test_the_32k_recipe_plans_a_sensible_shape():
    from packtrain.planner.micro_batch import choose_shape

    cfg = load_run_config("1b-32k-h200")
    assert (cfg.pack.budget, cfg.model.max_position_embeddings, cfg.model.rope_theta) == (32768, 32768, 5e5)
    shape = choose_shape(cfg.model, cfg.train, cfg.pack.budget, cfg.plan, 32768, device_memory_gib=139.8,
                         device="cuda")
    assert (shape.rows, shape.tokens) == (1, 32768)
    from packtrain.planner.plan import plan_memory

    plan = plan_memory(cfg.model, cfg.train, 32768, cfg.plan, 139.8, vocab_size=32768, rows=1, device="cuda")
    assert plan.attention == "varlen" and plan.fits and 35 < plan.peak_gib < 70
