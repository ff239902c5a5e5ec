"""`packtrain run` end to end on a GPU host: each stage's wall time, where the GPU stages' time went, and the
pipeline GPU efficiency.

    python -m bench gpu-pipeline --out bench/results/gpu_pipeline_350m.json [--recipe 350m-h200] [--steps 60,2000]
    python -m bench gpu-pipeline --smoke --out /tmp/gp      # CPU: tiny-cpu on a 40-document corpus, one run of 2 steps
                                                            # (--steps: other step counts)

The runs share one working directory, in order: the first (e.g. 60 steps) runs every stage from scratch and
registers the first champion; each later one re-uses the cached data stages (ingest … pack) and trains,
evaluates (against the champion: two models scored) and registers again — a scheduled retrain.

Each run is as on a fresh cluster pod: its own empty TMPDIR (inductor's default cache, /tmp/torchinductor_<user>,
starts empty) and no TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR, so only the workdir carries compiled graphs from
one run to the next (<workdir>/compile-cache, packtrain.train.compile_cache). Each row records the train and
evaluate stages' compile_cache (hit | miss | partial | off), the first step's seconds and the cache's size.
`--shared-tmp`: the runs share this host's /tmp and the caller's environment instead (the records before the
workdir cache: the second run found the first one's graphs in /tmp).

Per run, from the run's own output (`--json`): every stage's wall time (the runner's "success in X s"), and

    train steps     train_result.json timings.train_s − timings.checkpoint_s − timings.compile_s (the optimizer
                    steps; the loop's checkpoint saves are not steps, nor is the compile the first step waits for:
                    a compile-cache hit shortens the non-step time, it does not lengthen the steps. Records written
                    before the rows held `compile_s` counted the compile as step time)
    eval steps      evaluate_result.json seconds (the timed held-out epoch) + timings.suites_text_forward_s (the
                    text suites' forwards, both models: evaluation steps as much as the held-out epoch)
    GPU-stage time  train + evaluate + register walls (the GPU is held from the first step to the registered
                    model: on a cluster the job keeps its node for the whole tail)
    efficiency      (train steps + eval steps) / GPU-stage time
    non-step        train wall − train steps; evaluate wall − eval steps; register wall (its log_model_s too)

plus eval tok/s over train tok/s. Goals, judged on every row (each row records its `goals` and `goal_met`; the
record's goal_met holds a goal met when every row meets it): register ≤ 10 s, train non-step ≤ 25 s, evaluate
non-step ≤ 10 s, eval ÷ train tok/s ≥ 2.5, and an efficiency that depends on the run's length, since the non-step
time is paid once a run (EFFICIENCY_GOALS):

    steps ≤ 60          efficiency ≥ 0.65
    steps ≥ 2,000       efficiency ≥ 0.90
    60 < steps < 2,000  efficiency ≥ 0.65: the goal of the largest goal step count not above the run's (no goal
                        is set in between; an interpolated one would be a target nobody set)

Every run must train: the step counts are distinct (`--steps 60,60` is refused before anything runs or is
written: the second run's stages would all be stage-cache hits). A row whose train, evaluate or register stage
came from the stage cache anyway (an earlier run's timings) gets `cached_stages` and `stale`, and none of the
numbers above; a goal read from such a row is not met.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from bench.harness import Record, machine_info
from bench.packtrain_runs import clean_env, run_packtrain_cli

SUMMARY = "`packtrain run` on a GPU host: stage walls, non-step time, pipeline GPU efficiency"
DEVICE = "gpu"
CLI = [sys.executable, "-c", "import sys; from packtrain.cli import main; sys.exit(main())"]
STAGE_LINE = re.compile(r"^\[\d+/\d+\] (\w+)\s+success in ([\d.]+) s")
EFFICIENCY_GOALS = {60: 0.65, 2000: 0.90}
"""{step count: the GPU efficiency a run of at least that many steps must reach} (a run of fewer steps than the
smallest key: that key's goal; module doc)."""
GOALS: dict[str, float | dict[int, float]] = {
    "register_s": 10.0, "train_non_step_s": 25.0, "evaluate_non_step_s": 10.0, "efficiency": EFFICIENCY_GOALS,
    "eval_over_train_tok_s": 2.5}
"""The record's goals: seconds at most (…_s), ratios at least (AT_LEAST); efficiency by step count."""
AT_LEAST = frozenset({"efficiency", "eval_over_train_tok_s"})


def efficiency_goal(steps: int) -> float:
    """The efficiency a run of `steps` steps must reach (module doc).

    >>> efficiency_goal(2), efficiency_goal(60), efficiency_goal(400), efficiency_goal(2000), efficiency_goal(5000)
    (0.65, 0.65, 0.65, 0.9, 0.9)
    """
    at = [n for n in EFFICIENCY_GOALS if n <= steps]
    return EFFICIENCY_GOALS[max(at) if at else min(EFFICIENCY_GOALS)]


def row_goals(steps: int) -> dict[str, float]:
    """The goals one run of `steps` steps is judged against: GOALS with its own efficiency goal."""
    return {g: t if isinstance(t, float) else efficiency_goal(steps) for g, t in GOALS.items()}


def row_goal_met(row: dict) -> dict[str, bool]:
    """{goal: met} of one row against its row_goals; a stale row (an earlier run's timings) meets none."""
    goals = row_goals(row["steps"])
    if row.get("stale"):
        return dict.fromkeys(goals, False)
    return {g: (row[g] or 0.0) >= t if g in AT_LEAST else row[g] <= t for g, t in goals.items()}


def add_arguments(p) -> None:
    p.add_argument("--recipe", default="350m-h200")
    p.add_argument("--steps", default=None, help="train.max_steps of each run, in order (comma-separated, "
                   "distinct); default 60,2000 (--smoke: 2)")
    p.add_argument("--set", action="append", default=[], help="more --set for every run")
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    p.add_argument("--shared-tmp", action="store_true",
                   help="the runs share this host's /tmp (and compile cache variables) instead of a fresh TMPDIR each")


def fresh_host_env(tmp: Path) -> dict[str, str]:
    """The environment of a run as on a fresh pod (module doc): TMPDIR=`tmp` (empty), no compile cache variables."""
    env = {k: v for k, v in clean_env().items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    return {**env, "TMPDIR": str(tmp)}


def compile_cache_mib(key_dir: str | None) -> float | None:
    """Size of a compile cache directory (MiB), None when there is none."""
    if not key_dir or not Path(key_dir).is_dir():
        return None
    return round(sum(p.stat().st_size for p in Path(key_dir).rglob("*") if p.is_file()) / 2**20, 1)


def step_counts(args) -> list[int]:
    """train.max_steps of each run (`--steps`, default 60,2000; --smoke 2)."""
    text = args.steps if args.steps is not None else ("2" if args.smoke else "60,2000")
    return [int(s) for s in str(text).split(",") if s.strip()]


def check_args(args) -> str | None:
    """Why these arguments cannot be measured (None: they can); `python -m bench` refuses them before anything
    runs or is written."""
    try:
        steps = step_counts(args)
    except ValueError:
        return f"--steps {args.steps!r}: comma-separated whole numbers, e.g. 60,2000"
    if not steps or min(steps) < 1:
        return f"--steps {args.steps!r}: at least one run, each of at least 1 step"
    repeated = sorted({n for n in steps if steps.count(n) > 1})
    if repeated:
        return (f"--steps {args.steps!r}: {', '.join(map(str, repeated))} step(s) more than once; a repeated run "
                "trains nothing (every stage is a stage-cache hit of the earlier one, whose timings it would "
                "report again): give distinct step counts")
    return None


def one_run(cwd: Path, recipe: str, steps: int, sets: list[str], k: int, env: dict[str, str] | None = None) -> dict:
    """One `packtrain run` in `cwd` under `env` (None: this process's, clean_env); the row of numbers (module doc)."""
    out_json = cwd / f"run{k}.json"
    cmd = [*CLI, "run", "--recipe", recipe, "--set", f"train.max_steps={steps}", "--json", str(out_json)]
    for s in sets:
        cmd += ["--set", s]
    r, wall = run_packtrain_cli(cmd, cwd, f"run {k} ({steps} steps)", env)
    walls = {m[1]: float(m[2]) for m in (STAGE_LINE.match(ln) for ln in r.stdout.splitlines()) if m}
    return run_row(steps, wall, walls, json.loads(out_json.read_text())["stages"], r.stdout)


def run_row(steps: int, wall: float, walls: dict, stats: dict, stdout: str) -> dict:
    """The row of one run from its stage walls and `--json` stages (module doc); a run whose GPU stages came
    from the stage cache: the walls, the stages and why, no numbers."""
    cached = [s for s in ("train", "evaluate", "register") if (stats.get(s) or {}).get("cache") == "hit"]
    if cached:
        return {"name": f"{steps} steps", "steps": steps, "wall_s": round(wall, 1), "stage_walls_s": walls,
                "cached_stages": cached, "stale": f"{', '.join(cached)} restored from the stage cache: the "
                "timings are an earlier run's, nothing was measured", "stdout": stdout.splitlines()[-24:]}
    tr, ev, rg = stats["train"], stats["evaluate"], stats["register"]
    compile_s = float(tr["timings"].get("compile_s") or 0.0)
    train_steps = float(tr["timings"]["train_s"]) - float(tr["timings"].get("checkpoint_s") or 0.0) - compile_s
    eval_steps = float(ev["seconds"]) + float(ev.get("timings", {}).get("suites_text_forward_s") or 0.0)
    gpu_s = walls["train"] + walls["evaluate"] + walls["register"]
    train_tok_s = float(tr["throughput"].get("real_tokens_per_s") or 0.0)
    return {
        "name": f"{steps} steps", "steps": steps, "wall_s": round(wall, 1), "stage_walls_s": walls,
        "train_steps_s": round(train_steps, 2), "eval_steps_s": round(eval_steps, 3),
        "gpu_stage_s": round(gpu_s, 2), "efficiency": round((train_steps + eval_steps) / gpu_s, 4),
        "train_non_step_s": round(walls["train"] - train_steps, 2),
        "evaluate_non_step_s": round(walls["evaluate"] - eval_steps, 2),
        "register_s": walls["register"], "log_model_s": rg.get("log_model_s"),
        "train_tok_s": round(train_tok_s), "eval_tok_s": round(float(ev["tokens_per_s"])),
        "eval_over_train_tok_s": round(float(ev["tokens_per_s"]) / train_tok_s, 2) if train_tok_s else None,
        "compile_cache": {"train": tr["timings"].get("compile_cache"),
                          "evaluate": ev.get("timings", {}).get("compile_cache")},
        "first_step_s": tr["timings"].get("first_step_s"), "compile_s": round(compile_s, 3),
        "compile_cache_mib": compile_cache_mib(tr["timings"].get("compile_cache_dir")),
        "train_timings": tr["timings"], "eval_timings": ev.get("timings", {}),
        "cache_key_s": {k: v.get("cache_key_s") for k, v in stats.items() if isinstance(v, dict)},
        "eval": {k: ev.get(k) for k in ("precision", "attention", "rows", "n_real_tokens", "eval_loss", "compiled")},
        "train_memory": {k: (tr.get("memory") or {}).get(k) for k in ("peak_alloc_gib", "peak_reserved_gib",
                                                                       "fragmentation")},
        "useful_mfu": tr["throughput"].get("useful_mfu"), "decision": rg.get("decision"),
        "stdout": stdout.splitlines()[-24:],
    }


def run(args, out: Path) -> Record:
    recipe, sets = args.recipe, list(args.set)
    why = check_args(args)   # `python -m bench` asked already; a direct caller is refused here
    if why:
        raise SystemExit(why)
    steps = step_counts(args)
    cwd = Path(tempfile.mkdtemp(prefix="packtrain-gpu-pipeline-"))
    if args.smoke:   # the same code path in seconds: the tests' tiny corpus and settings (train.max_steps after); one
        # run (a later one, restoring the data stages from the cache, is a whole `packtrain run` process more: ~1/3
        # of `python -m bench all --smoke` on the 2-core CI machine)
        from packtrain.testing.tiny_corpus import tiny_corpus, tiny_settings

        recipe = "tiny-cpu"
        sets = [s for s in tiny_settings(cwd / "data", tiny_corpus(cwd / "corpus", n_docs=40))
                if not s.startswith("train.max_steps=")] + sets
    rows = []
    hosts = Path(tempfile.mkdtemp(prefix="packtrain-gpu-pipeline-hosts-"))   # each run's TMPDIR: outside cwd
    try:
        for k, n in enumerate(steps):
            env = None if args.shared_tmp else fresh_host_env(Path(tempfile.mkdtemp(dir=hosts, prefix=f"run{k}-")))
            rows.append(one_run(cwd, recipe, n, sets, k, env))
            r = rows[-1]
            if r.get("stale"):
                print(f"{n} steps: {r['stale']}", file=sys.stderr, flush=True)
                continue
            print(f"{n} steps: efficiency {r['efficiency']:.1%} · train non-step {r['train_non_step_s']} s · "
                  f"evaluate non-step {r['evaluate_non_step_s']} s · register {r['register_s']} s · eval/train "
                  f"tok/s {r['eval_over_train_tok_s']} · compile cache train {r['compile_cache']['train']}, "
                  f"evaluate {r['compile_cache']['evaluate']} (first step {r['first_step_s']} s)",
                  file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(hosts, ignore_errors=True)
        if args.keep:
            print(f"workdir kept: {cwd}", file=sys.stderr)
        else:
            shutil.rmtree(cwd, ignore_errors=True)
    for r in rows:
        r["goals"], r["goal_met"] = row_goals(r["steps"]), row_goal_met(r)
    met = {g: all(r["goal_met"][g] for r in rows) for g in GOALS}   # a stale row meets no goal (module doc)
    if not args.smoke:
        import torch  # noqa: F401 - so machine_info reads the CUDA device (the runs are subprocesses)
    return Record(suite="gpu-pipeline", study=f"`packtrain run --recipe {recipe}` end to end, "
                  f"{' then '.join(str(s) for s in steps)} steps in one working directory",
                  command=args.command, machine=machine_info(),
                  settings={"recipe": recipe, "steps": steps, "set": sets, "fresh_host": not args.shared_tmp},
                  rows=rows, goals=GOALS, goal_met=met,
                  smoke=bool(args.smoke))
