"""What users do today with transformers, on the same documents: the baselines of the gpu-throughput,
long-context and lora suites.

    pad        every document padded to the budget, one per row         batches_padded("pad", ...)
    dynamic    `rows` random documents padded to the longest of them    batches_padded("dynamic", ...)
    group      like dynamic, grouped by length in mega-batches          batches_padded("group", ...)
    concat     documents concatenated and cut into rows, NOT isolated    batches_concat(...)
    hf_packed  BFD packs as rows, SDPA + position_ids, no mask          batches_packed_rows(...)

`run_hf_variant` trains a transformers model (LlamaForCausalLM, or the family of the suite's --model, e.g.
Qwen2ForCausalLM) on prebuilt CPU batches (bf16 autocast, fused AdamW)
and returns (seconds, NVML utilization, last loss); `isolation_error` is the logit check every row reports.
"""

from __future__ import annotations

import time

import numpy as np

from packtrain.telemetry.sampler import SystemSampler


# -------------------------------------------------------------------------------------- batch builders
# Every builder yields dicts of CPU tensors: input_ids/labels/(attention_mask|position_ids) shaped (rows, S),
# plus "real" (non-padding tokens), "slot" (rows * S) and "seq_lens" (document lengths, for useful FLOPs).
def _rows_batch(docs, S, pad_id, with_mask):
    import torch

    ids = torch.full((len(docs), S), pad_id, dtype=torch.long)
    lab = torch.full((len(docs), S), -100, dtype=torch.long)
    mask = torch.zeros((len(docs), S), dtype=torch.long)
    for r, d in enumerate(docs):
        t = torch.from_numpy(d[:S])
        ids[r, : len(t)] = t
        lab[r, : len(t)] = t
        lab[r, 0] = -100
        mask[r, : len(t)] = 1
    out = {"input_ids": ids, "labels": lab, "attention_mask": mask}
    out["real"] = int(mask.sum())  # non-padding tokens, as packtrain's meter counts them
    out["slot"] = len(docs) * S
    out["seq_lens"] = [min(len(d), S) for d in docs]
    return out


def batches_padded(kind, docs, rows, budget, pad_id, n_steps, seed):
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(docs))
    if kind == "group":  # HF group_by_length: megabatches of 50·rows sorted by length, then chunked
        mb = 50 * rows
        order = np.concatenate([sorted(order[i: i + mb], key=lambda j: -len(docs[j]))
                                for i in range(0, len(order), mb)])
    out = []
    for s in range(n_steps):
        sel = [docs[j] for j in order[s * rows: (s + 1) * rows]]
        S = budget if kind == "pad" else max(len(d) for d in sel)
        out.append(_rows_batch(sel, S, pad_id, with_mask=True))
    if kind == "group":
        rng.shuffle(out)
    return out


def batches_concat(docs, rows, budget, n_steps):
    import torch

    stream = np.concatenate(docs[: n_steps * rows * budget // 100 + 1000])
    out = []
    for s in range(n_steps):
        chunk = torch.from_numpy(stream[s * rows * budget: (s + 1) * rows * budget].copy()).view(rows, budget)
        lab = chunk.clone()
        lab[:, 0] = -100
        out.append({"input_ids": chunk, "labels": lab, "real": rows * budget, "slot": rows * budget,
                    "seq_lens": [budget] * rows, "causal_full": True})
    return out


def batches_packed_rows(docs, packs, rows, budget, n_steps):
    """(rows, budget) packed rows with position_ids restarting per document; padding only at row tails."""
    import torch

    out = []
    for s in range(n_steps):
        ids = torch.zeros((rows, budget), dtype=torch.long)
        pos = torch.zeros((rows, budget), dtype=torch.long)
        lab = torch.full((rows, budget), -100, dtype=torch.long)
        seq_lens = []
        for r, pack in enumerate(packs[s * rows: (s + 1) * rows]):
            o = 0
            for j in pack:
                d = torch.from_numpy(docs[j])
                n = len(d)
                ids[r, o: o + n] = d
                lab[r, o + 1: o + n] = d[1:]
                pos[r, o: o + n] = torch.arange(n)
                o += n
                seq_lens.append(n)
            if o < budget:  # tail padding as its own segment
                pos[r, o:] = torch.arange(budget - o)
        out.append({"input_ids": ids, "position_ids": pos, "labels": lab, "real": sum(seq_lens),
                    "slot": rows * budget, "seq_lens": seq_lens})
    return out


# ------------------------------------------------------------------------------------------- training
def hf_config(spec, vocab, attn, max_pos):
    """The transformers config of a bench model: `spec` holds config kwargs (gpu_throughput.SIZES), its optional
    model_type picks the family (default llama); tied embeddings unless the spec says otherwise."""
    from transformers import AutoConfig

    kw = {k: v for k, v in spec.items() if k not in ("model_type", "vocab_size")}
    kw.setdefault("tie_word_embeddings", True)
    kw.setdefault("max_position_embeddings", max_pos)
    cfg = AutoConfig.for_model(spec.get("model_type", "llama"), vocab_size=vocab, use_cache=False, **kw)
    cfg._attn_implementation = attn
    return cfg


def build_hf(spec, vocab, attn, device, seed, max_pos):
    """A random-init transformers model of the spec's family (LlamaForCausalLM, Qwen2ForCausalLM, ...) on
    `device` in fp32 (the variants autocast to bf16)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(spec, vocab, attn, max_pos))
    return model


def run_hf_variant(name, model, batches, steps, warmup, device):
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    model.train()

    def step(b):
        kw = {k: v.to(device, non_blocking=True) for k, v in b.items()
              if k in ("input_ids", "labels", "attention_mask", "position_ids")}
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(**kw, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for b in batches[:warmup]:
        step(b)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sampler = SystemSampler(0.2).start()     # packtrain's own NVML sampler, over the timed steps only
    t0 = time.perf_counter()
    for b in batches[warmup: warmup + steps]:
        loss = step(b)
    sync()
    dt = time.perf_counter() - t0
    summary = sampler.stop().summary()
    opt.zero_grad(set_to_none=True)
    opt.state.clear()
    return dt, (summary.get("utilization") if summary["kind"] == "nvml" else None), float(loss)


def isolation_error(model, batch, device, kind):
    """Max |logits(doc inside batch) − logits(doc alone)| in bf16 for the first document of row 0 that does
    not start the row (so an unisolated model sees a preceding document)."""
    import torch

    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        ids = batch["input_ids"][:1].to(device)
        kw = {"input_ids": ids, "use_cache": False}
        if "position_ids" in batch:
            kw["position_ids"] = batch["position_ids"][:1].to(device)
            pos = batch["position_ids"][0]
            starts = (pos == 0).nonzero().flatten().tolist()
            s0 = starts[1] if len(starts) > 1 else 0
            n = (starts[2] if len(starts) > 2 else int(ids.shape[1])) - s0
        elif kind == "concat":
            S = int(ids.shape[1])
            s0, n = S // 2, S // 4  # a window inside the stream: what an unisolated document sees
        else:
            kw["attention_mask"] = batch["attention_mask"][:1].to(device)
            s0, n = 0, int(batch["attention_mask"][0].sum())
        full = model(**kw).logits[0, s0: s0 + n].float()
        alone = model(input_ids=ids[:, s0: s0 + n], use_cache=False).logits[0].float()
    model.train()
    return float((full - alone).abs().max())
