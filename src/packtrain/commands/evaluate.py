"""`packtrain evaluate [--model DIR] [--packs DIR] [--out DIR]`: held-out perplexity + samples."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="DIR", help="save_pretrained model dir (default <workdir>/train/model)")
    parser.add_argument("--packs", metavar="DIR", help="pack stage output holding eval/ (default <workdir>/pack)")
    parser.add_argument("--out", metavar="DIR", help="output dir (default <workdir>/evaluate)")


def run(cfg, args) -> int:
    from pathlib import Path

    from packtrain.paths import RunPaths
    from packtrain.stages.evaluate import run_evaluate

    paths = RunPaths(Path(cfg.workdir))
    out = Path(args.out) if args.out else paths.evaluate_dir
    s = run_evaluate(cfg, args.model or paths.model_dir, args.packs or paths.pack_dir, out).to_dict()
    print(f"eval_loss {s['eval_loss']:.4f}  perplexity {s['perplexity']:.2f}  "
          f"{s['n_label_tokens']} label tokens in {s['n_batches']}/{s['n_batches_epoch']} batches  "
          f"{s['tokens_per_s']:.0f} tok/s  → {out / 'eval_result.json'}")
    return 0
