"""`packtrain plan [--budget N|auto] [--device-memory-gib G] [--json] [--out DIR]`: predicted peak memory.

Prints the memory table of one training step of the recipe (components at the peak, each phase, activations
per layer, whether it fits target_fraction × device memory). `--budget auto` (or `train.budget: auto`)
chooses the largest budget that fits and the grad_accum that keeps the global batch in tokens.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", metavar="N|auto",
                        help="tokens per row (default: train.budget, else pack.budget); 'auto' → choose")
    parser.add_argument("--device-memory-gib", type=float, metavar="G",
                        help="device memory to plan for (default: plan.device_memory_gib, the current GPU, or 80)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON instead of the table")
    parser.add_argument("--out", metavar="DIR", help="also write DIR/plan.json")


def _budget_arg(cfg, args) -> int | str:
    from packtrain.errors import ConfigError

    raw = args.budget if args.budget is not None else (cfg.train.budget or cfg.pack.budget)
    if raw == "auto":
        return "auto"
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"--budget {raw!r}: expected a positive integer or 'auto'") from None
    if value < 2:
        raise ConfigError(f"--budget {value}: must be ≥ 2 tokens (a multiple of 128 is best for the kernels)")
    return value


def run(cfg, args) -> int:
    import json
    from pathlib import Path

    from packtrain.errors import ConfigError
    from packtrain.paths import write_json
    from packtrain.planner import choose_budget, plan_memory

    if args.device_memory_gib is not None and args.device_memory_gib <= 0:
        raise ConfigError(f"--device-memory-gib {args.device_memory_gib}: must be > 0")
    from packtrain.model.source import init_from_value, is_registry_source

    if is_registry_source(init_from_value(cfg.model)):   # champion / models:/...: plan the registered model's shape
        from packtrain.model.registry_source import resolve_init

        cfg = cfg.model_copy(update={"model": resolve_init(cfg).model_config(cfg.model)})
    vocab = cfg.plan.vocab_size or cfg.tokenize.vocab_size
    budget = _budget_arg(cfg, args)
    if budget == "auto":
        budget, ga, plan = choose_budget(cfg.model, cfg.train, cfg.plan, args.device_memory_gib,
                                         vocab_size=vocab, reference_budget=cfg.pack.budget)
        header = f"chosen budget {budget}, grad_accum {ga} (global batch {cfg.train.rows * budget * ga * cfg.train.gpus}" \
                 " tokens)"
    else:
        plan = plan_memory(cfg.model, cfg.train, budget, cfg.plan, args.device_memory_gib, vocab_size=vocab)
        header = f"budget {budget}"
    if args.out:
        write_json(Path(args.out) / "plan.json", plan.to_dict())
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2, default=str))
    else:
        print(f"memory plan: recipe {cfg.name}, {header}")
        print(plan.table())
    return 0
