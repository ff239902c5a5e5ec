"""Peak memory and time of the data stages (ingest, validate, tokenize) as the corpus grows.

    python bench/data_memory.py bench/results/data_memory.json [--mb 100,200,400] [--vocab 4096]

For each size: a synthetic JSONL corpus (random words from a 20,000-word vocabulary, lognormal document
lengths, median ≈ 4,300 characters) is written once, then `packtrain ingest`, `validate` and `tokenize` run
as separate processes through the CLI; each process's peak RSS (psutil, every 50 ms, the process and its
children) and wall time are recorded. A stage that streams has a flat peak; one that holds the corpus grows
with it. CPU only; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = ("ingest", "validate", "tokenize")


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


def peak_rss_run(cmd: list[str], env: dict) -> tuple[int, float, float]:
    """(exit code, peak RSS in MiB over the process tree, seconds)."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ps, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.05)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode:
        print(err[-2000:], file=sys.stderr)
    return proc.returncode, peak / 2**20, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--mb", default="100,200,400", help="corpus sizes in millions of characters")
    p.add_argument("--vocab", type=int, default=4096)
    a = p.parse_args(argv)
    packtrain = [sys.executable, "-m", "packtrain.cli"]
    env = {**os.environ, "TQDM_DISABLE": "1", "DVC_NO_ANALYTICS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}
    rows = []
    with tempfile.TemporaryDirectory(prefix="packtrain-datamem-") as tmp:
        for mb in [int(x) for x in a.mb.split(",") if x]:
            root = Path(tmp) / f"c{mb}"
            root.mkdir()
            docs = write_corpus(root / "corpus.jsonl", mb * 1_000_000)
            common = ["--set", f"workdir={root / 'w'}", "--set", "tracking.enabled=false",
                      "--set", f"tokenize.vocab_size={a.vocab}"]
            row = {"corpus_mchars": mb, "documents": docs}
            for stage in STAGES:
                extra = ["--source", str(root / "corpus.jsonl")] if stage == "ingest" else []
                rc, peak, secs = peak_rss_run([*packtrain, stage, *extra, *common], env)
                row[stage] = {"exit": rc, "peak_rss_mib": round(peak), "seconds": round(secs, 1)}
                print(f"{mb} M chars · {stage}: peak {peak:,.0f} MiB, {secs:.1f} s (exit {rc})", file=sys.stderr)
            rows.append(row)
    report = {"command": "python bench/data_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": f"{platform.node()} · {os.cpu_count()} CPUs · {platform.platform()}",
              "python": platform.python_version(), "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    print("| corpus (M chars) | documents | " + " | ".join(f"{s} peak MiB / s" for s in STAGES) + " |")
    print("|---:|---:|" + "---:|" * len(STAGES))
    for r in rows:
        print(f"| {r['corpus_mchars']} | {r['documents']:,} | "
              + " | ".join(f"{r[s]['peak_rss_mib']:,} / {r[s]['seconds']}" for s in STAGES) + " |")
    return 0 if all(r[s]["exit"] == 0 for r in rows for s in STAGES) else 1


if __name__ == "__main__":
    sys.exit(main())
