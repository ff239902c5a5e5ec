"""Greedy generation samples from fixed prompts: the same prompts every run, so runs compare by eye.

    [{"prompt": "def ", "completion": "get_name(self):\n    return", "n_new_tokens": 32}, ...]

Greedy (do_sample=False), `max_new_tokens` each, stops early at EOS. About 32 tokens × 3 prompts ≈ 0.3 s for
the tiny-cpu model on CPU.
"""

from __future__ import annotations


def generate_samples(model, tokenizer, prompts: list[str], max_new_tokens: int, device) -> list[dict]:
    """One greedy completion per prompt; an empty prompt starts from the EOS token."""
    import torch

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"] or ([eos] if eos is not None else [0])
            x = torch.tensor([ids], dtype=torch.long, device=device)                  # (1, P)
            y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                               do_sample=False, pad_token_id=pad, eos_token_id=eos)   # (1, P + ≤max_new)
            new = y[0, x.shape[1]:].tolist()
            out.append({"prompt": prompt, "completion": tokenizer.decode(new, skip_special_tokens=True),
                        "n_new_tokens": len(new)})
    return out
