"""`packtrain register [--model DIR] [--eval DIR] [--train DIR] [--out DIR]`: MLflow registry + aliases."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="DIR", help="save_pretrained model dir (default <workdir>/train/model)")
    parser.add_argument("--eval", metavar="DIR", help="evaluate output with evaluate_result.json "
                                                      "(default <workdir>/evaluate)")
    parser.add_argument("--train", metavar="DIR", help="train output with train_result.json (default "
                                                       "<workdir>/train; optional file)")
    parser.add_argument("--out", metavar="DIR", help="output dir (default <workdir>/register)")


def run(cfg, args) -> int:
    from pathlib import Path

    from packtrain.paths import RunPaths
    from packtrain.stages.register import run_register

    paths = RunPaths(Path(cfg.workdir))
    out = Path(args.out) if args.out else paths.register_dir
    s = run_register(cfg, args.model or paths.model_dir, args.eval or paths.evaluate_dir,
                     args.train or paths.train_dir, out).to_dict()
    if s["decision"] == "deferred":
        print(f"{s['model_name']}: registration deferred (op {s.get('op_id')}): {s['reason']}  → "
              f"{out / 'register_result.json'}")
    else:
        print(f"{s['model_name']} v{s['version']} → {s['decision']} ({s['reason']}); champion is "
              f"v{s['champion_version']}  → {out / 'register_result.json'}")
    if s["missing_tags"]:
        print(f"lineage tags missing: {', '.join(s['missing_tags'])}")
    return 0
