"""`packtrain plan [--rows N|auto] [--packs DIR] [--budget N] [--device-memory-gib G] [--json] [--out DIR]`.

Prints the memory table of one training step of the recipe (components at the peak, each phase, activations
per layer, whether it fits target_fraction × device memory) for exactly the shape `packtrain train` would run:
both take it from packtrain.planner.choose_shape. The packs' budget (tokens per pack) and vocabulary come from
`--packs DIR` (a pack stage output, as train reads them), else pack.budget and tokenize.vocab_size. `--rows auto`
(or `train.rows: auto`) chooses the most rows per micro-batch that fit, and the grad_accum that keeps
plan.global_batch_tokens when it is set.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", metavar="N|auto",
                        help="packs per micro-batch (default: train.rows); 'auto' → the most that fit")
    parser.add_argument("--packs", metavar="DIR",
                        help="pack stage output holding train/: plan for its budget and vocabulary (as train does)")
    parser.add_argument("--budget", metavar="N",
                        help="tokens per pack to plan for (default: the --packs store's, else pack.budget)")
    parser.add_argument("--device-memory-gib", type=float, metavar="G",
                        help="device memory to plan for (default: plan.device_memory_gib, the current GPU, or 80)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON instead of the table")
    parser.add_argument("--out", metavar="DIR", help="also write DIR/plan.json")


def _with_flags(cfg, args):
    """The config with --rows / --budget applied as the overrides they stand for (train.rows, pack.budget), checked
    by the config schema like any --set."""
    from packtrain.config import load_run_config
    from packtrain.errors import ConfigError

    sets, given = [], []
    if args.rows is not None:
        sets.append(f"train.rows={args.rows}")
        given.append(f"--rows {args.rows}")
    if args.budget is not None:
        if str(args.budget).strip() == "auto":
            raise ConfigError("--budget auto: a budget is tokens per pack (pack.budget, fixed by the pack stage) and "
                              "is never chosen; to let the planner choose rows per micro-batch use --rows auto")
        sets.append(f"pack.budget={args.budget}")
        given.append(f"--budget {args.budget}")
    if not sets:
        return cfg
    try:
        return load_run_config(args.recipe, [*args.overrides, *sets])
    except ConfigError as e:
        raise ConfigError(f"{' '.join(given)}: {e}") from None


def _packs_budget_vocab(packs: str) -> tuple[int, int]:
    """The budget and vocabulary of the packs train would read (<packs>/train/meta.json)."""
    from pathlib import Path

    from packtrain.packing.store import PackStore

    store = PackStore.open(Path(packs) / "train", verify=False)
    return store.budget, int(store.meta["vocab_size"])


def run(cfg, args) -> int:
    import json
    from pathlib import Path

    from packtrain.errors import ConfigError
    from packtrain.planner import choose_shape, plan_shape
    from packtrain.planner.plan import device_memory_source
    from packtrain.publish import write_json

    if args.device_memory_gib is not None and args.device_memory_gib <= 0:
        raise ConfigError(f"--device-memory-gib {args.device_memory_gib}: must be > 0")
    cfg = _with_flags(cfg, args)
    from packtrain.model.init_from import init_from_value, is_registry_source

    if is_registry_source(init_from_value(cfg.model)):   # champion / models:/...: plan the registered model's shape
        from packtrain.registry.source import resolve_init

        cfg = cfg.model_copy(update={"model": resolve_init(cfg).model_config(cfg.model)})
    budget, vocab = cfg.pack.budget, cfg.plan.vocab_size or cfg.tokenize.vocab_size
    if args.packs:
        budget, vocab = _packs_budget_vocab(args.packs)
        if args.budget is not None and budget != cfg.pack.budget:
            raise ConfigError(f"--budget {args.budget}: the packs in {args.packs} have {budget} tokens each; "
                              "drop --budget or re-pack")
    shape = choose_shape(cfg.model, cfg.train, budget, cfg.plan, vocab, device_memory_gib=args.device_memory_gib)
    plan = plan_shape(cfg.model, cfg.train, shape, cfg.plan, vocab, device_memory_gib=args.device_memory_gib)
    gib, source = device_memory_source(cfg.plan, args.device_memory_gib)
    doc = {**plan.to_dict(), "rows_source": shape.source, "device_memory_gib": round(gib, 2),
           "device_memory_source": source}
    if args.out:
        write_json(Path(args.out) / "plan.json", doc)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        rows = f"train.rows=auto → {shape.rows} rows" if shape.source == "auto" else f"{shape.rows} rows"
        on = "CPU (train.device cpu)" if plan.device == "cpu" else f"{shape.gpus} GPU"
        print(f"memory plan: recipe {cfg.name}, {rows} × {shape.budget} tokens per pack, grad_accum "
              f"{shape.grad_accum}, {on}: {shape.tokens_per_step} tokens per step")
        note = assumptions(cfg, plan, source)
        if note:
            print(note)
        print(plan.table())
    return 0


def assumptions(cfg, plan, source: str) -> str:
    """A line saying what the plan assumed that this machine did not tell it: the device memory (no CUDA device
    here and none given: `source` "default", planner.plan.device_memory_source) and the attention backend
    train.attention auto resolves to; "" when nothing was assumed."""
    from packtrain.planner.plan import DEFAULT_DEVICE_MEMORY_GIB

    cpu = cfg.train.device == "cpu"
    said = []
    if source == "default":
        host = host_memory_gib()
        mem = "--device-memory-gib G or plan.device_memory_gib to plan for another size" + (
            f", e.g. this host's {host:.1f} GiB" if cpu and host else "")
        said.append(f"train.device cpu: one CPU process's step, against the default {DEFAULT_DEVICE_MEMORY_GIB:.0f} "
                    f"GiB, not this host's memory ({mem}; --set train.device=cuda to plan for a GPU)" if cpu else
                    f"no CUDA device here: planned for one GPU of {DEFAULT_DEVICE_MEMORY_GIB:.0f} GiB, the device "
                    f"train.device {cfg.train.device} would use on a GPU host ({mem}; --set train.device=cpu to "
                    "plan for this host's CPU)")
    if cfg.train.attention == "auto":
        said.append(f"attention {plan.attention} is what train.attention auto picks on {'the CPU' if cpu else 'CUDA'} "
                    f"in {plan.precision} (--set train.attention=... to plan another)")
    return ("assumed: " + "; ".join(said)) if said else ""



def host_memory_gib() -> float | None:
    """This host's physical memory in GiB (None where the OS does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (AttributeError, ValueError, OSError):
        return None
