"""Peak memory and time of the data stages (ingest, validate, tokenize) as the corpus grows.

    python -m bench data-memory --out bench/results/data_memory.json [--mb 100,200,400] [--vocab 4096]
    python -m bench data-memory --smoke --out /tmp/dm      # one corpus of 0.05 M characters, ingest only

For each size: a synthetic JSONL corpus (random words from a 20,000-word vocabulary, lognormal document
lengths, median ≈ 4,300 characters) is written once, then `packtrain ingest`, `validate` and `tokenize` run
as separate processes through the CLI; each process's peak RSS (psutil, every 50 ms, the process and its
children) and wall time are recorded. A stage that streams has a flat peak; one that holds the corpus grows
with it (goal: the largest corpus's peak within 1.5× the smallest's). CPU only; prints a Markdown table.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
from pathlib import Path

from bench.harness import Record, machine_info, peak_rss_mib

SUMMARY = "peak RSS and time of ingest / validate / tokenize as the corpus grows (streaming: a flat peak)"
DEVICE = "cpu"
STAGES = ("ingest", "validate", "tokenize")
SMOKE_STAGES = ("ingest",)
"""--smoke runs ingest only: the suite's code (corpus, one stage process watched for its peak RSS, the row, the
table, the goals) is the same for every stage; validate's process is mostly Great Expectations' import, tokenize's
mostly transformers' (~8 CPU-s, half of the suite's smoke on the 2-core CI machine)."""
GOALS = {"peak_growth_max": 1.5}


def write_corpus(path: Path, n_chars: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(20_000)]
    total = docs = 0
    with open(path, "w") as f:
        while total < n_chars:
            text = " ".join(rng.choices(words, k=int(rng.lognormvariate(6.5, 1.0)) + 1))
            f.write(json.dumps({"text": text}) + "\n")
            total += len(text)
            docs += 1
    return docs


def add_arguments(p) -> None:
    p.add_argument("--mb", default="100,200,400", help="corpus sizes in millions of characters")
    p.add_argument("--vocab", type=int, default=4096)


def run(a, out: Path) -> Record:
    if a.smoke:
        a.mb, a.vocab = "0.05", 300
    packtrain = [sys.executable, "-m", "packtrain.cli"]
    env = {**os.environ, "TQDM_DISABLE": "1", "DVC_NO_ANALYTICS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    rows = []
    with tempfile.TemporaryDirectory(prefix="packtrain-datamem-") as tmp:
        for mb in [float(x) for x in a.mb.split(",") if x]:
            root = Path(tmp) / f"c{mb}"
            root.mkdir()
            docs = write_corpus(root / "corpus.jsonl", int(mb * 1_000_000))
            common = ["--set", f"workdir={root / 'w'}", "--set", "tracking.enabled=false",
                      "--set", f"tokenize.vocab_size={a.vocab}"]
            if a.smoke:
                common += ["--set", "validate.min_rows=10", "--set", "tokenize.train_chars=60000"]
            row = {"corpus_mchars": int(mb) if mb == int(mb) else mb, "documents": docs}
            for stage in SMOKE_STAGES if a.smoke else STAGES:
                extra = ["--source", str(root / "corpus.jsonl")] if stage == "ingest" else []
                rc, peak, secs = peak_rss_mib([*packtrain, stage, *extra, *common], env)
                row[stage] = {"exit": rc, "peak_rss_mib": round(peak), "seconds": round(secs, 1)}
                print(f"{mb} M chars · {stage}: peak {peak:,.0f} MiB, {secs:.1f} s (exit {rc})", file=sys.stderr)
            rows.append(row)
    stages = SMOKE_STAGES if a.smoke else STAGES
    print("| corpus (M chars) | documents | " + " | ".join(f"{s} peak MiB / s" for s in stages) + " |")
    print("|---:|---:|" + "---:|" * len(stages))
    for r in rows:
        print(f"| {r['corpus_mchars']} | {r['documents']:,} | "
              + " | ".join(f"{r[s]['peak_rss_mib']:,} / {r[s]['seconds']}" for s in stages) + " |")
    ok = all(r[s]["exit"] == 0 for r in rows for s in stages)
    flat = all(rows[-1][s]["peak_rss_mib"] <= GOALS["peak_growth_max"] * rows[0][s]["peak_rss_mib"] for s in stages)
    return Record(suite="data-memory", study="data stages' memory vs corpus size", command=a.command,
                  machine=machine_info(), rows=rows, goals=GOALS, goal_met={"stages_ok": ok, "flat_peak": flat},
                  settings={"mb": a.mb, "vocab": a.vocab})
