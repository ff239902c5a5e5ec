"""Random-init accuracy on the shipped wordorder task: chance (0.5) by construction, measured over seeds.

    python -m bench wordorder-chance --out bench/results                         # 40 seeds, lm-eval on 5
    python -m bench wordorder-chance --items OLD.jsonl --delimiter " " --seeds 20 --lm-eval-seeds 1 \
        --out bench/results/wordorder_chance_before.json                        # the first generator's items
    python -m bench wordorder-chance --smoke --out /tmp/wc                        # 2 seeds, 20 items

Models: the tiny-cpu recipe's shape (packtrain.model.build, random init, `torch.manual_seed(seed)`), vocab of a
byte-level BPE trained as the tokenize stage trains it (packtrain.data.tokenizer_setup.train_tokenizer, 4096,
on ~4 MB of the default corpus) or `--tokenizer DIR` (a tokenize stage's tokenizer/). Each item is scored the way
lm-eval scores multiple_choice `acc`: Σ log p(choice tokens | context), continuation = encode(context +
target_delimiter + choice) after encode(context), argmax over the choices; the first `--lm-eval-seeds` seeds are also scored by
packtrain.evaluate.tasks.score_task (lm-eval itself, as the evaluate stage runs it) and must agree document
for document. A row per seed; `summary`: mean, standard deviation, min and max of the accuracy.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from bench.harness import Record, machine_info

SUMMARY = "random-init accuracy on the wordorder task over seeds (chance by construction)"
DEVICE = "cpu"
SHIPPED = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "wordorder" / "wordorder.yaml"


def add_arguments(p) -> None:
    p.add_argument("--seeds", type=int, default=40, help="random initialisations (seeds 0..N-1)")
    p.add_argument("--lm-eval-seeds", type=int, default=5, help="of which the first K are also scored by lm-eval")
    p.add_argument("--items", type=Path, default=None, help="a wordorder-style .jsonl (default: the shipped task)")
    p.add_argument("--delimiter", default=None, help="target_delimiter (default: the shipped YAML's)")
    p.add_argument("--tokenizer", type=Path, default=None, help="a saved tokenizer directory (default: train one)")


def _tokenizer(args, tmp: Path):
    from transformers import PreTrainedTokenizerFast

    if args.tokenizer is not None:
        return PreTrainedTokenizerFast.from_pretrained(str(args.tokenizer))
    from packtrain.data.corpus import select_default_corpus
    from packtrain.data.tokenizer_setup import train_tokenizer

    corpus = select_default_corpus(0.5 if args.smoke else 4.0)
    texts = [f.path.read_text(encoding="utf-8") for f in corpus.files]
    return train_tokenizer(texts, 512 if args.smoke else 4096, tmp / "tokenizer")


def _accuracy(model, tok, items: list[dict], delim: str) -> list[float]:
    """Per item 1.0 / 0.0: lm-eval's multiple_choice acc, computed directly (module doc), one batched forward."""
    import torch

    seqs = []
    for it in items:
        ctx = tok.encode(it["context"], add_special_tokens=False)
        for ch in it["choices"]:
            whole = tok.encode(it["context"] + delim + ch, add_special_tokens=False)
            seqs.append((whole, len(ctx)))
    ids = torch.zeros(len(seqs), max(len(w) for w, _ in seqs), dtype=torch.long)
    for i, (w, _) in enumerate(seqs):
        ids[i, : len(w)] = torch.tensor(w)
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits.double(), -1)   # (2·items, T, V); padding only after each sequence
    ll = [float(lp[i, torch.arange(c - 1, len(w) - 1), torch.tensor(w[c:])].sum()) for i, (w, c) in enumerate(seqs)]
    k = len(items[0]["choices"])
    return [float(max(range(k), key=lambda j: (ll[n * k + j], -j)) == it["label"]) for n, it in enumerate(items)]


def run(args, out: Path | None) -> Record:
    import torch
    import yaml

    from packtrain.config import load_run_config
    from packtrain.evaluate.suite_types import TaskSuite
    from packtrain.evaluate.tasks import score_task
    from packtrain.model.build import build_model

    items_path = args.items or SHIPPED.with_suffix(".jsonl")
    delim = args.delimiter if args.delimiter is not None else yaml.safe_load(SHIPPED.read_text())["target_delimiter"]
    items = [json.loads(x) for x in items_path.read_text(encoding="utf-8").splitlines() if x.strip()]
    seeds, lm_seeds = (2, 1) if args.smoke else (args.seeds, args.lm_eval_seeds)
    if args.smoke:
        items = items[:20]
    cfg = load_run_config("tiny-cpu", ["tracking.enabled=false"])
    rows = []
    with tempfile.TemporaryDirectory(prefix="wordorder-chance-") as tmp:
        tok = _tokenizer(args, Path(tmp))
        data = Path(tmp) / "items.jsonl"
        data.write_text("".join(json.dumps(x) + "\n" for x in items), encoding="utf-8")
        spec = yaml.safe_load(SHIPPED.read_text())
        (Path(tmp) / "task.yaml").write_text(yaml.safe_dump({**spec, "target_delimiter": delim}), encoding="utf-8")
        suite = TaskSuite("wordorder", "task", str(Path(tmp) / "task.yaml"), "", spec["task"], {"test": str(data)})
        for seed in range(seeds):
            torch.manual_seed(seed)
            model = build_model(cfg.model, len(tok), attention="sdpa", device="cpu", training=False).eval()
            acc = _accuracy(model, tok, items, delim)
            row = {"seed": seed, "acc": round(statistics.fmean(acc), 4), "n": len(items)}
            if seed < lm_seeds:
                res = score_task(model, tok, suite, "cpu")
                row["lm_eval_acc"] = round(res.metric["value"], 4)
                row["lm_eval_agrees"] = [a for _, a in res.per_doc] == acc
            rows.append(row)
            print(f"wordorder-chance: seed {seed}: {row}", flush=True)
    accs = [r["acc"] for r in rows]
    summary = {"mean": round(statistics.fmean(accs), 4),
               "sd": round(statistics.stdev(accs), 4) if len(accs) > 1 else None,
               "min": min(accs), "max": max(accs), "seeds": len(accs),
               "binomial_sd_if_independent": round((0.25 / len(items)) ** 0.5, 4)}
    agree = [r["lm_eval_agrees"] for r in rows if "lm_eval_agrees" in r]
    return Record(suite="wordorder-chance", command=args.command, machine=machine_info(),
                  study="accuracy of random-init tiny-cpu models on the wordorder items, over seeds",
                  settings={"items": str(items_path), "target_delimiter": delim, "model": cfg.model.model_dump(mode="json"),
                            "vocab": len(tok), "tokenizer": str(args.tokenizer or "trained: default corpus")},
                  rows=rows, goals={"mean_within_0.03_of_chance": 0.03, "lm_eval_agrees": True},
                  goal_met={"mean_within_0.03_of_chance": abs(summary["mean"] - 0.5) <= 0.03,
                            "lm_eval_agrees": all(agree)},
                  extra={"summary": summary})
