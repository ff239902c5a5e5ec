"""Tiny models with known histories for the promotion tests: two text domains, a shared BPE, a short real
training loop (AdamW on packed-free 64-token rows, seeded: the same call gives the same weights on the CPU).

    domain_a(n, seed)   prose-like sentences from a small grammar (the champion's domain, harder)
    domain_b(n, seed)   counting / repetition lines (a new, easier domain)
    train_tiny(src, dst, texts, steps, lr, seed)   continue the model in src on texts, save into dst
    write_train_result(dir, data_version, tokens)  a train output folder (train_result.json) for `register --train`
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

NOUNS = ["cat", "dog", "river", "engine", "garden", "teacher", "window", "market", "signal", "forest"]
VERBS = ["sees", "follows", "builds", "paints", "carries", "finds", "opens", "moves"]
ADJS = ["red", "quiet", "old", "bright", "small", "heavy", "green", "strange"]


def domain_a(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        sents = []
        for _ in range(int(rng.integers(3, 6))):
            sents.append(f"The {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} a "
                         f"{rng.choice(ADJS)} {rng.choice(NOUNS)}.")
        out.append(" ".join(sents))
    return out


def domain_b(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed + 1000)
    out = []
    for _ in range(n):
        start = int(rng.integers(0, 5))
        out.append(" ".join(str(k % 10) for k in range(start, start + 40)))
    return out


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def train_tiny(src: Path, dst: Path, texts: list[str], steps: int, lr: float, seed: int, seq: int = 64,
               batch: int = 8) -> Path:
    """Continue the model in `src` on `texts` for `steps` AdamW steps (rows of `seq` tokens cut from the texts
    joined by EOS, drawn with a seeded generator); save it with its tokenizer into `dst`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src))
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    ids: list[int] = []
    for t in texts:
        ids += [tok.eos_token_id] + tok(t, add_special_tokens=False)["input_ids"]
    data = torch.tensor(ids, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[s: s + seq] for s in starts])
        loss = model(input_ids=x, labels=x, use_cache=False).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    if dst.exists():
        shutil.rmtree(dst)
    model.save_pretrained(str(dst))
    tok.save_pretrained(str(dst))
    return dst


def write_eval_packs(split_dir: Path, model_dir: Path, texts: list[str], budget: int = 128) -> Path:
    """An eval pack store (packtrain.packing.store) of `texts` tokenized with the model's tokenizer + EOS."""
    from transformers import AutoTokenizer

    from packtrain.testing.tiny_model import write_tiny_packs

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    docs = [np.array((tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])[:budget], np.int64)
            for t in texts]
    return write_tiny_packs(split_dir, docs, budget, pad_id=tok.pad_token_id, vocab_size=len(tok),
                            eos_id=tok.eos_token_id)


def write_train_result(path: Path, data_version: str = "5d41", tokens: str | None = None) -> Path:
    """A train output folder whose train_result.json names `data_version` and the token store md5 `tokens`: the
    register stage then tags the version with that lineage (tokens_md5) and with the recipe it was trained with
    (packtrain.evaluate.recipe_identity)."""
    from packtrain.stages.lineage import Lineage
    from packtrain.stages.results import TrainResult

    path.mkdir(parents=True, exist_ok=True)
    TrainResult(
        steps=50, start_step=0, tokens=10, label_tokens=9, slot_tokens=12, final_loss=3.0, loss_curve=[3.5, 3.0],
        lr_curve=[3e-3, 3e-3], skipped_steps=0, compiles=None, recompiles=None, timings={}, throughput={}, memory={},
        system={}, violations=[], telemetry_files=[], setup={}, params={}, model_dir=None, checkpoint=None,
        lineage=Lineage(git_sha=None, code_version="0.1.0", input_md5={"tokens": tokens} if tokens else {},
                        data_version=data_version)).write(path)
    return path
