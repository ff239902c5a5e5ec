"""`packtrain run`: the whole DAG on this machine (ingest → ... → register) + a summary.

    packtrain run                                  # tiny-cpu recipe, default corpus, embedded MLflow
    packtrain run --set ingest.max_docs=200 --set train.max_steps=5
    packtrain run --no-cache --verbose             # rerun every stage, stream what the stages print
    packtrain run --progress 30                    # a progress line of a long stage every 30 s (default 10)
    packtrain run --runner kfp                     # the compiled KFP DAG through kfp.local, a process per stage
    packtrain run --runner docker                  # the same DAG, each component in its image (make images)

`--runner in-process` (default) walks the stage table in this process (packtrain.pipeline.dag); `--runner kfp`
runs the pipeline compiled for the cluster through kfp.local, each component in its own process as a pod would
(packtrain.pipeline.kfp_local); `--runner docker` runs that DAG with each component in the container image it
names, over podman's or Docker's API (packtrain.pipeline.containers; build the images with `make images`). All
print the same lines, write the same outputs and share the stage cache.

Ends with the summary, where to look in MLflow, the pipeline run id (`run id  3f2a9c0e (pipeline run
3f2a9c0e…)`) and the `packtrain compare ...` / `packtrain gate ...` lines to type next.

Exit codes: 0 done; the failing stage's code otherwise (4: validation failed, the report path is printed).
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-cache", action="store_true",
                        help="rerun every stage without restoring from <workdir>/cache; the fresh outputs replace "
                             "the cache entries, so later runs restore these")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="stream everything the stages print (the run's log) to the terminal")
    parser.add_argument("--runner", choices=("in-process", "kfp", "docker"), default="in-process",
                        help="in-process (default): the stages in this process; kfp: the compiled KFP DAG "
                             "through kfp.local, one process per component as on a cluster; docker: the same "
                             "DAG, each component in its container image (podman or Docker; `make images`)")
    parser.add_argument("--progress", type=float, default=None, metavar="S",
                        help="print a progress line of a long stage (step, loss, tok/s, ETA) every S seconds "
                             "(default 10; 0: every update; ignored with --verbose)")
    parser.add_argument("--json", dest="json_out", metavar="PATH",
                        help="also write the run's stats + summary as JSON to PATH")
    from packtrain.commands.train import add_gpus_argument

    add_gpus_argument(parser)   # --gpus N = --set train.gpus=N: the train stage launches N ranks


def run(cfg, args: argparse.Namespace) -> int:
    from pathlib import Path

    from packtrain.commands.train import check_gpus
    from packtrain.errors import ConfigError
    from packtrain.pipeline.local import PROGRESS_S, RUNNERS, run_local
    from packtrain.publish import write_json

    check_gpus(args)
    if args.progress is not None and not args.progress >= 0:
        raise ConfigError(f"--progress {args.progress}: must be a number of seconds ≥ 0")
    assert args.runner in RUNNERS   # argparse's choices are the runners of packtrain.pipeline.local
    result = run_local(cfg, runner=args.runner, verbose=args.verbose, use_cache=False if args.no_cache else None,
                       progress_s=PROGRESS_S if args.progress is None else args.progress)
    if args.json_out:
        write_json(Path(args.json_out), result)
    return 0
