"""Seed spread: k trainings of one recipe that differ only in `train.seed`, every suite's metric of each, and the
between-seed spread the promotion decision uses as its margins (packtrain.evaluate.seed_spread,
docs/validation.md "Seed noise").

    python -m bench seed-spread --recipe tiny-cpu --seeds 0 1 2 3 --out bench/results/seed_spread_tiny-cpu.json
    python -m bench seed-spread --smoke --out /tmp/ss        # 3 random-init tiny models on 12 documents (seconds)

Each seed is `packtrain run --recipe R --set train.seed=S --set evaluate.against=none` in one fresh working
directory (the data stages come from the stage cache after the first seed; train and evaluate run for every
seed), its evaluate output copied aside. The record carries, beside the harness's command and machine:

    recipe, config_hash (packtrain.evaluate.seed_spread.recipe_hash: the resolved config minus train.seed; built by
    packtrain.evaluate.seed_record.spread_record),
    seeds, k, suites: {name: {kind, unit, n, values (one per seed), mean, sd, doc_sd}},
    rows: one per suite with sd, doc_sd and the margin t(0.95, k − 1)·sd·√2; runs: per seed seconds

`register.promotion.seed_spread: auto` reads bench/results/seed_spread_<recipe>.json.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import Record, machine_info
from bench.packtrain_runs import run_packtrain_cli, run_seconds

SUMMARY = "k trainings differing only in train.seed: each suite's between-seed spread (the promotion's margins)"
DEVICE = "cpu"
PACKTRAIN = Path(sys.executable).with_name("packtrain")
SMOKE_DOCS = [f"def f{i}(x):\n    return x * {i} + {i % 3}\n" for i in range(12)]
"""--smoke: twelve tiny documents, scored by three random-init models of seeds 0, 1, 2 (no `packtrain run`)."""


def add_arguments(p) -> None:
    p.add_argument("--recipe", default="tiny-cpu", help="recipe name or YAML path (default tiny-cpu)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="train.seed values (≥ 3)")
    p.add_argument("--set", dest="sets", action="append", default=[],
                   help="extra --set KEY=VALUE for every seed's run (also hashed into config_hash)")
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    p.add_argument("--workdir", type=Path, default=None,
                   help="working directory to use and keep (default: a fresh temporary one); a seed whose "
                        "evaluation is already there (seed_<S>/, from an interrupted session) is not run again")


def _smoke_sets(cwd: Path) -> list[str]:
    (cwd / "smoke.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in SMOKE_DOCS), encoding="utf-8")
    return ["evaluate.recent_role=off", f"evaluate.suites=[{{name: smoke, role: primary, path: {cwd / 'smoke.jsonl'}}}]",
            "evaluate.suite_budget=64", "tracking.enabled=false", "register.promotion.seed_spread=null",
            "register.promotion.resamples=200"]


def _smoke_seed(cfg, cwd: Path, seed: int) -> Path:
    """--smoke: a random-init tiny model of `seed` scored alone on the smoke suite → its evaluate output."""
    from packtrain.evaluate.paired_scores import paired_evaluation
    from packtrain.testing.tiny_model import build_tiny_model_dir

    model = build_tiny_model_dir(cwd / f"model_{seed}", SMOKE_DOCS, vocab_size=300, seed=seed)
    paired_evaluation(cfg, model, "none", cwd / f"seed_{seed}")
    return cwd / f"seed_{seed}"


def pair_verdicts(cfg, seeds: list[int], eval_dirs: list[Path], spread: dict) -> list[dict]:
    """Every ordered pair of seeds as challenger and champion, decided twice on the same tables: on the configured
    margins alone, and with the margins of this record (what `register` would do with it)."""
    from packtrain.evaluate.paired_scores import read_decision_input
    from packtrain.evaluate.promotion import decide_promotion

    tables = [read_decision_input(d)[0] for d in eval_dirs]
    entry = {"suites": spread["suites"], "k": spread["k"], "note": "this record"}
    out = []
    for i, a in enumerate(seeds):
        for j, b in enumerate(seeds):
            if i == j:
                continue
            suites = [dict(s, champion=t["challenger"]) for s, t in zip(tables[i], tables[j], strict=True)]
            plain = decide_promotion(suites, cfg.register_.promotion, f"seed {b}", True)
            seeded = decide_promotion(suites, cfg.register_.promotion, f"seed {b}", True, entry)
            out.append({"challenger": a, "champion": b, "promoted_configured": plain.promote,
                        "promoted_with_record": seeded.promote,
                        "suites": {d.suite: {"delta": round(d.delta or 0.0, 6), "upper": round(d.upper or 0.0, 6),
                                             "threshold_configured": d.threshold,
                                             "threshold_with_record": round(e.threshold, 6)}
                                   for d, e in zip(plain.suites, seeded.suites, strict=True)}})
    return out


def run(args, out: Path) -> Record:
    from packtrain.config import load_run_config
    from packtrain.evaluate.seed_record import spread_record
    from packtrain.evaluate.seed_spread import seed_margin

    seeds = [0, 1, 2] if args.smoke else list(dict.fromkeys(args.seeds))
    if len(seeds) < 3:
        raise SystemExit(f"--seeds: at least 3 distinct seeds are needed (got {seeds})")
    cwd = Path(args.workdir).resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="packtrain-seed-spread-"))
    cwd.mkdir(parents=True, exist_ok=True)
    sets = [*(_smoke_sets(cwd) if args.smoke else []), *args.sets]
    cfg = load_run_config(args.recipe, sets)
    runs, eval_dirs = [], []
    try:
        for s in seeds:
            keep = cwd / f"seed_{s}"
            if (keep / "suite_scores.parquet").is_file() and (cwd / f"run_{s}.json").is_file():
                eval_dirs.append(keep)
                done = json.loads((cwd / f"run_{s}.json").read_text())
                runs.append(done.get("bench_run") or {
                    "seed": s, "seconds": round(float(done["seconds"]), 1),
                    "evaluate_timings": json.loads((keep / "evaluate_result.json").read_text()).get("timings", {})})
                print(f"seed {s}: reused from {keep}", file=sys.stderr)
                continue
            if args.smoke:
                t0 = time.perf_counter()
                eval_dirs.append(_smoke_seed(cfg, cwd, s))
                runs.append({"seed": s, "seconds": round(time.perf_counter() - t0, 2)})
                continue
            cmd = [str(PACKTRAIN), "run", "--recipe", args.recipe, "--set", f"train.seed={s}",
                   "--set", "evaluate.against=none", "--set", "register.promotion.power_check=off",
                   *[x for kv in sets for x in ("--set", kv)], "--json", str(cwd / f"run_{s}.json")]
            r, wall = run_packtrain_cli(cmd, cwd, f"seed {s}")
            ev = Path(json.loads((cwd / f"run_{s}.json").read_text())["summary"]["evaluate_dir"])
            shutil.copytree(ev, keep)
            eval_dirs.append(keep)
            timing = json.loads((ev / "evaluate_result.json").read_text()).get("timings", {})
            runs.append({"seed": s, "seconds": run_seconds(r.stdout, wall), "wall_s": round(wall, 1),
                         "evaluate_timings": timing})
            done = json.loads((cwd / f"run_{s}.json").read_text())
            (cwd / f"run_{s}.json").write_text(json.dumps({**done, "bench_run": runs[-1]}))
            print(f"seed {s}: {runs[-1]['seconds']} s", file=sys.stderr)
        spread = spread_record(cfg, seeds, eval_dirs)
        pairs = pair_verdicts(cfg, seeds, eval_dirs, spread)
    finally:
        if args.keep or args.workdir:
            print(f"working directory kept: {cwd}", file=sys.stderr)
        else:
            shutil.rmtree(cwd, ignore_errors=True)
    k, suites = len(seeds), spread["suites"]
    rows = [{"name": name, "kind": s["kind"], "unit": s["unit"], "n": s["n"], "mean": s["mean"], "sd": s["sd"],
             "doc_sd": s["doc_sd"], "margin_95": round(seed_margin(s["sd"], k, 0.95), 6)} for name, s in suites.items()]
    return Record(suite="seed-spread", study=f"between-seed spread of every suite, recipe {cfg.name}, k {k}",
                  command=args.command, machine=machine_info(),
                  settings={"recipe": cfg.name, "sets": sets, "seeds": seeds,
                            "run": f"packtrain run --recipe {args.recipe} --set train.seed=S --set evaluate.against=none"},
                  rows=rows,
                  extra={"recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **spread, "pairs": pairs, "runs": runs})
