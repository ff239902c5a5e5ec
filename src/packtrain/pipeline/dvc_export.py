"""`dvc.yaml` from the stage table, `params.yaml` from the recipe, and the small DVC metrics/plots each stage
exports for them.

Both files are generated (tests fail when a committed file differs): regenerate them with

    make dvc-files                                     # = python -m packtrain.pipeline.dvc_export
    python -m packtrain.pipeline.dvc_export            # writes dvc.yaml and params.yaml in the current directory
    python -m packtrain.pipeline.dvc_export --check    # exit 1 when either is not the generated text

`params.yaml` is recipe PARAMS_RECIPE (tiny-cpu) resolved: `load_run_config("tiny-cpu").to_dict()`, every field
written out, defaults included. `dvc repro` (`packtrain <stage> --recipe params.yaml`) therefore runs exactly the
config `packtrain run --recipe tiny-cpu` runs — the same suites, the same device, the same promotion rule — and
reaches the same verdict on the same weights (tests/pipelines/test_dvc.py compares the two). A recipe field or a
default that changes changes params.yaml, so DVC reruns the stages whose sections changed, as the stage cache of
`packtrain run` does.

Each stage of the table (packtrain.stages.table) becomes one DVC stage:

    cmd      packtrain <stage> --recipe params.yaml <flag> ${workdir}/<upstream>[/sub] ... --out ${workdir}/<stage>
             && packtrain pipeline export <stage> --recipe params.yaml --dir ${workdir}/<stage>
    deps     the stage's code paths, its input artifacts' directories, the stats file of each `after` stage;
             validate, tokenize and evaluate also the eval files they read (eval_file_deps: the recipe's
             suite files, a task's data files, `validate.contamination.against`, evaluate's seed-spread
             record), as their stage cache keys in `packtrain run` hold those files by content
    params   the stage's config sections (StageSpec.config): DVC reruns it when one of them changes in
             params.yaml, exactly as the stage cache of `packtrain run` does
    outs     ${workdir}/<stage>
    metrics  metrics/<stage>.json (cache: false; committed to git); plots for train

DVC forbids a metrics file inside a stage's output directory (overlapping outputs), and its plots read
.json/.yaml/.csv/.tsv but not JSON lines. So after each stage `packtrain pipeline export` writes, next to the
data and committed to git:

    metrics/<stage>.json      a few numbers of the stage (StageSpec.metrics), so that `dvc metrics show` over
                              all stages stays one table under 100 columns:
                              metrics/pack.json → {"fill": 0.99712}
    plots/train_steps.csv     train only: step, loss, lr, grad_norm, step_time_s, real_tokens (train_log.jsonl)

The stage's full stats stay in its output directory (<workdir>/<stage>/<StageSpec.stats_file>, DVC-cached).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packtrain.errors import MissingDataError
from packtrain.publish import atomic_write_text, write_json
from packtrain.stages.table import ARTIFACTS, STAGE_NAMES, STAGES, StageSpec, stage_spec

STATS_FILES = {s.name: s.stats_file for s in STAGES}
"""{'pack': 'pack_result.json', ...}: the file each stage runner writes into its output dir (from the table)."""
TRAIN_LOG = "train_log.jsonl"
PLOT_COLUMNS = ("step", "loss", "lr", "grad_norm", "step_time_s", "real_tokens")


def numeric_tree(d):
    """Keep numbers (and booleans as 0/1) and the dicts that contain them.

    >>> numeric_tree({"fill": 0.99, "strategy": "bfd", "eval": {"n_packs": 3, "path": "x"}})
    {'fill': 0.99, 'eval': {'n_packs': 3}}
    """
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, bool):
            out[k] = int(v)
        elif isinstance(v, (int, float)):
            out[k] = v
        elif isinstance(v, dict):
            sub = numeric_tree(v)
            if sub:
                out[k] = sub
    return out


def _number(v: Any) -> int | float | None:
    """A metric value: numbers (floats to 5 significant digits, so a column stays narrow: 12340.57 → 12341,
    0.991784 → 0.99178), booleans as 0/1, numeric strings (a registered version '3' → 3); else None."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        r = float(f"{v:.5g}")
        return int(r) if r.is_integer() and abs(r) >= 1000 else r
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return None
    return None


def stage_metrics(spec: StageSpec, stats: dict) -> dict[str, int | float]:
    """The stage's DVC metrics from its stats: `StageSpec.metrics` names → values; absent/non-numeric left out.

    >>> stage_metrics(stage_spec("train"), {"throughput": {"real_tokens_per_s": 12340.57}, "final_loss": 4.061234})
    {'tok/s': 12341, 'loss': 4.0612}
    """
    out: dict[str, int | float] = {}
    for name, key in spec.metrics:
        node: Any = stats
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        value = _number(node)
        if value is not None:
            out[name] = value
    return out


def export_stage(stage: str, stage_dir: str | Path, metrics_dir: str | Path = "metrics",
                 plots_dir: str | Path = "plots") -> list[Path]:
    """Write metrics/<stage>.json (and plots/train_steps.csv for train); returns the files written."""
    if stage not in STATS_FILES:
        raise MissingDataError(f"unknown stage {stage!r} (stages: {', '.join(STAGE_NAMES)})")
    spec = stage_spec(stage)
    src = Path(stage_dir) / spec.stats_file
    if not src.is_file():
        raise MissingDataError(f"{src} does not exist: run `packtrain {stage}` first (or pass --dir DIR)")
    stats = json.loads(src.read_text(encoding="utf-8"))
    written = [Path(metrics_dir) / f"{stage}.json"]
    write_json(written[0], stage_metrics(spec, stats))
    log = Path(stage_dir) / TRAIN_LOG
    if spec.plots and log.is_file():
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=PLOT_COLUMNS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for line in log.read_text(encoding="utf-8").splitlines():
            if line.strip():
                w.writerow(json.loads(line))
        written.append(Path(plots_dir) / "train_steps.csv")
        atomic_write_text(written[-1], buf.getvalue())
    return written


# ---- dvc.yaml ----------------------------------------------------------------------------------------------------

HEADER = """\
# GENERATED from the stage table (src/packtrain/stages/table.py) by `python -m packtrain.pipeline.dvc_export`:
# do not edit; tests/pipelines/test_dvc.py fails when this file differs from the generated text.
# The packtrain stages for `dvc repro`: the same CLI (and library) as the KFP pipeline and `packtrain run`.
#   dvc repro                 # run what changed (needs `packtrain` on PATH: source .venv/bin/activate)
#   dvc metrics show          # metrics/<stage>.json: a few numbers per stage
#   dvc plots show            # plots/train_steps.csv
# Parameters: params.yaml (a full recipe); each stage lists the config sections its output depends on (the
# same ones as the stage cache key of `packtrain run`). Outputs: ${workdir}/<stage>/ (DVC-cached, `dvc push`).
# Metrics/plots are written by `packtrain pipeline export <stage>` outside the output dirs (DVC forbids
# overlapping outputs) and are small enough to commit (cache: false).
stages:
"""


def _artifact_dir(arg: str) -> str:
    """`model/model` → `${workdir}/train/model` (the producing stage's output directory)."""
    name, _, sub = arg.partition("/")
    return f"${{workdir}}/{ARTIFACTS[name]}" + (f"/{sub}" if sub else "")


def render_stage(spec: StageSpec, extra_deps: Sequence[str] = ()) -> str:
    """One stage of dvc.yaml (YAML text, 2-space indented under `stages:`); `extra_deps`: eval_file_deps'."""
    out = f"${{workdir}}/{spec.name}"
    words = [f"packtrain {spec.name} --recipe params.yaml",
             *(f"{flag} {_artifact_dir(a)}" for flag, a in zip(spec.flags, spec.args, strict=True)), f"--out {out}"]
    cmd = [words[0]]
    for w in words[1:]:   # folded (>-) lines of at most ~100 characters
        if len(cmd[-1]) + 1 + len(w) <= 95:
            cmd[-1] += " " + w
        else:
            cmd.append(w)
    lines = [f"  {spec.name}:"]
    lines += [f"    # runs after {a}: a failure there stops `dvc repro` before this stage" for a in spec.after]
    lines += ["    cmd: >-", *(f"      {c}" for c in cmd),
             f"      && packtrain pipeline export {spec.name} --recipe params.yaml --dir {out}", "    deps:"]
    deps = [*spec.code, *(f"${{workdir}}/{ARTIFACTS[a]}" for a in spec.inputs),
            *(f"${{workdir}}/{a}/{stage_spec(a).stats_file}" for a in spec.after), *extra_deps]
    lines += [f"      - {d}" for d in deps]
    lines += ["    params:", *(f"      - {p}" for p in spec.config)]
    lines += ["    outs:", f"      - {out}"]
    lines += ["    metrics:", f"      - {spec.metrics_file}:", "          cache: false"]
    if spec.plots:
        lines += ["    plots:"]
        for plot in spec.plots:
            lines += [f"      - {plot}:", "          cache: false", "          x: step", "          y: loss"]
    return "\n".join(lines) + "\n"


def render_dvc_yaml(recipe: str | None = None) -> str:
    """The whole dvc.yaml text, generated from the stage table and the eval files of recipe `recipe` (default
    PARAMS_RECIPE, the recipe of params.yaml; deterministic: the committed file equals it)."""
    deps = eval_file_deps(recipe or PARAMS_RECIPE)
    return HEADER + "\n".join(render_stage(s, deps.get(s.name, [])) for s in STAGES)


def eval_file_deps(recipe: str) -> dict[str, list[str]]:
    """{stage: the files it reads beyond its inputs} for dvc.yaml, from recipe `recipe`: every suite's files
    (packtrain.evaluate.suites.suite_files: a task's data files too) for validate, tokenize and evaluate (the first
    two only with `validate.contamination.suites`), each `validate.contamination.against` entry for validate
    and tokenize, and the seed-spread record (`register.promotion.seed_spread`: auto's
    bench/results/seed_spread_<recipe>.json when it exists, or the path given) for evaluate. Paths are relative
    to the checkout root where dvc.yaml lies (`@recipes/…` is its recipes/), absolute outside it.

    >>> eval_file_deps("tiny-cpu")["validate"]
    ['recipes/tasks/wordorder/wordorder.yaml', 'recipes/tasks/wordorder/wordorder.jsonl']
    """
    from packtrain.config import load_run_config, recipe_dir
    from packtrain.evaluate.seed_spread import default_record_path
    from packtrain.evaluate.suites import suite_files

    cfg, root = load_run_config(recipe), recipe_dir().parent

    def rel(p: Path) -> str:
        p = p.resolve()
        return str(p.relative_to(root)) if p.is_relative_to(root) else str(p)

    suites = [rel(f) for s in cfg.evaluate.suites for f in suite_files(s.path, root)]
    contamination = cfg.validate_.contamination
    checked = (suites if contamination.suites else []) + [rel(root / a) for a in contamination.against]
    setting = cfg.register_.promotion.seed_spread
    record = default_record_path(cfg.name) if setting == "auto" else root / setting if setting else None
    spread = [rel(record)] if record is not None and record.is_file() else []
    return {"validate": checked, "tokenize": checked, "evaluate": suites + spread}


# ---- params.yaml -------------------------------------------------------------------------------------------------

PARAMS_RECIPE = "tiny-cpu"
"""The recipe params.yaml is generated from (the default of `packtrain run`)."""

PARAMS_HEADER = """\
# GENERATED from recipes/{recipe}.yaml by `python -m packtrain.pipeline.dvc_export` (`make dvc-files`): do not
# edit; tests/pipelines/test_dvc.py fails when this file differs from the recipe resolved. Change the recipe (or a
# default in src/packtrain/config) and regenerate. For a one-off experiment: `dvc exp run -S train.lr=1e-3`.
# The DVC parameters are the whole recipe, every field written out: `packtrain <stage> --recipe params.yaml` in
# dvc.yaml runs exactly the config of `packtrain run --recipe {recipe}` (the same suites, device and promotion
# rule: the same verdict on the same weights). DVC reruns a stage when a section it lists under `params:` in
# dvc.yaml changes here; `workdir` also names the outputs there (${{workdir}}/<stage>).
"""


def render_params_yaml(recipe: str = PARAMS_RECIPE) -> str:
    """params.yaml: the header, then recipe `recipe` resolved (every RunConfig field, in declaration order)."""
    import yaml

    from packtrain.config import load_run_config

    body = yaml.safe_dump(load_run_config(recipe).to_dict(), sort_keys=False, allow_unicode=True, width=110)
    return PARAMS_HEADER.format(recipe=recipe) + body


def main(argv: list[str] | None = None) -> int:
    """`python -m packtrain.pipeline.dvc_export [--check] [--params PATH] [--recipe NAME] [DVC_YAML]`: write (or
    check) dvc.yaml (DVC_YAML, default dvc.yaml) and params.yaml (default: beside it) from the stage table and the
    recipe (default tiny-cpu)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m packtrain.pipeline.dvc_export",
                                     description="Generate dvc.yaml (stage table) and params.yaml (the recipe).")
    parser.add_argument("dvc_yaml", nargs="?", default="dvc.yaml", help="dvc.yaml to write (default dvc.yaml)")
    parser.add_argument("--params", default=None, help="params.yaml to write (default: beside dvc.yaml)")
    parser.add_argument("--recipe", default=PARAMS_RECIPE, help=f"recipe of params.yaml (default {PARAMS_RECIPE})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file differs")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    dvc_path = Path(args.dvc_yaml)
    params_path = Path(args.params) if args.params else dvc_path.parent / "params.yaml"
    files = [(dvc_path, render_dvc_yaml(args.recipe), f"the stage table ({len(STAGES)} stages) and recipe {args.recipe}"),
             (params_path, render_params_yaml(args.recipe), f"recipe {args.recipe}")]
    if args.check:
        stale = [path for path, text, _ in files if not (path.is_file() and path.read_text(encoding="utf-8") == text)]
        for path, _, source in files:
            print(f"{path}: {'differs from ' + source + ': run `make dvc-files`' if path in stale else 'up to date'}")
        return 1 if stale else 0
    for path, text, source in files:
        atomic_write_text(path, text)
        print(f"wrote {path} (from {source})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
