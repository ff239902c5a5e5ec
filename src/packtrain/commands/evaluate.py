"""`packtrain evaluate [--model DIR] [--packs DIR] [--out DIR] [--against champion|MODEL_REF]`.

Without --against: the evaluate stage (held-out perplexity, samples, and every suite scored for the model and
the registry champion). With --against: only the paired evaluation and the promotion decision — "would this
model be promoted over MODEL_REF?" — nothing is registered and no alias moves. MODEL_REF: `champion`,
`models:/NAME/VERSION`, `models:/NAME@ALIAS` or a model directory. Writes suite_scores.parquet, suites.json,
validation.json and validation.md into --out (default <workdir>/validation); exit 0 when it would be promoted,
1 when not (docs/validation.md).
"""

from __future__ import annotations

import argparse

AGAINST_OUTPUTS = ("suite_scores.parquet", "suites.json", "validation.json", "validation.md")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="DIR", help="save_pretrained model dir (default <workdir>/train/model)")
    parser.add_argument("--packs", metavar="DIR", help="pack stage output holding eval/ (default <workdir>/pack)")
    parser.add_argument("--out", metavar="DIR", help="output dir (default <workdir>/evaluate; with --against "
                                                     "<workdir>/validation)")
    parser.add_argument("--against", metavar="MODEL_REF",
                        help="only the paired evaluation and the promotion verdict against champion, models:/NAME/V, "
                             "models:/NAME@ALIAS or a model dir; registers nothing")


def run(cfg, args) -> int:
    from pathlib import Path

    from packtrain.paths import RunPaths
    from packtrain.stages.evaluate import run_evaluate

    paths = RunPaths(Path(cfg.workdir))
    if args.against:
        return run_against(cfg, Path(args.model or paths.model_dir), Path(args.packs or paths.pack_dir),
                           Path(args.out) if args.out else Path(cfg.workdir) / "validation", args.against)
    out = Path(args.out) if args.out else paths.evaluate_dir
    s = run_evaluate(cfg, args.model or paths.model_dir, args.packs or paths.pack_dir, out).to_dict()
    print(f"eval_loss {s['eval_loss']:.4f}  perplexity {s['perplexity']:.2f}  "
          f"{s['n_label_tokens']} label tokens in {s['n_batches']}/{s['n_batches_epoch']} batches  "
          f"{s['tokens_per_s']:.0f} tok/s  → {out / 'evaluate_result.json'}")
    return 0


def run_against(cfg, model_dir, packs_dir, out, ref: str) -> int:
    """The paired evaluation of `model_dir` against `ref` and the verdict under register.promotion."""
    import json
    import sys

    from packtrain.evaluate.loading import check_model_dir
    from packtrain.evaluate.paired_scores import paired_evaluation
    from packtrain.evaluate.promotion import verdict_markdown
    from packtrain.publish import staged_output
    from packtrain.registry.op import promotion_verdict

    check_model_dir(model_dir)
    split = packs_dir / "eval"
    recent = split if split.is_dir() and cfg.evaluate.recent_role != "off" else None
    if recent is None and cfg.evaluate.recent_role != "off":
        print(f"[packtrain] evaluate --against: no eval packs at {split}: suite 'recent' is not scored",
              file=sys.stderr)
    with staged_output(out, AGAINST_OUTPUTS, "evaluate --against") as tmp:
        manifest, _ = paired_evaluation(cfg, model_dir, ref, tmp, recent_packs=recent)
        if manifest["against"] is None and ref == "champion":
            print(f"[packtrain] {manifest['note']}", file=sys.stderr)
        v = promotion_verdict(tmp, cfg.register_)
        (tmp / "validation.json").write_text(json.dumps(v.to_dict(), indent=2) + "\n", encoding="utf-8")
        (tmp / "validation.md").write_text(verdict_markdown(v), encoding="utf-8")
    print(verdict_markdown(v))
    print(f"→ {out / 'validation.md'}")
    return 0 if v.promote else 1
