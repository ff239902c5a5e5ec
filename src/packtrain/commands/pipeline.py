"""`packtrain pipeline compile | submit | pytorchjob`: the KFP pipeline for a cluster.

    packtrain pipeline compile [--out FILE]      # default <workdir>/pipelines/packtrain_pipeline.yaml
    packtrain pipeline submit --host http://ml-pipeline-ui.kubeflow:80 [--schedule "0 0 3 * * 1"] --recipe 1b-h200
    packtrain pipeline pytorchjob --nodes 4 --gpus-per-node 8 [--kind trainjob] [--out job.yaml] --recipe 1b-h200
    packtrain pipeline export pack --recipe params.yaml     # dvc.yaml: metrics/pack.json (+ plots for train)

The IR depends on the recipe's `pipeline` section (images, requests, secret) and the train task's GPUs
(train.gpus; none when train.device is cpu) only; the whole RunConfig travels as the run-time parameter `config`
(submit passes it).

compile writes into the workdir unless --out names a file: the committed pipelines/packtrain_pipeline.yaml is
rewritten only on purpose (`--out pipelines/packtrain_pipeline.yaml --code-version 0.1.0`), never by a plain
compile in the checkout.
"""

from __future__ import annotations

import argparse
import sys

from packtrain.stages.table import STAGE_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from packtrain.commands import nested_common

    sub = parser.add_subparsers(dest="action", metavar="ACTION")

    def action(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text)

    c = action("compile", "compile the KFP pipeline of the recipe to IR YAML (upload it in the KFP UI)")
    c.add_argument("--out", default=None, metavar="FILE",
                   help="output YAML path (default <workdir>/pipelines/packtrain_pipeline.yaml; the committed IR is "
                        "refreshed with --out pipelines/packtrain_pipeline.yaml --code-version <package version>)")
    c.add_argument("--code-version", default=None, metavar="VERSION",
                   help="default of the code_version parameter (default: this checkout's, e.g. 0.1.0+g<sha>; "
                        "the committed pipelines/packtrain_pipeline.yaml pins the package version)")
    s = action("submit", "submit one run, or a recurring run with --schedule, to a KFP cluster")
    s.add_argument("--host", help="KFP API endpoint (default: pipeline.kfp_host of the recipe)")
    s.add_argument("--schedule", nargs="?", const="", default=None, metavar="CRON",
                   help="6-field cron, seconds first, e.g. '0 0 3 * * 1' (bare --schedule: pipeline.schedule)")
    s.add_argument("--experiment", help="KFP experiment (default: tracking.experiment)")
    s.add_argument("--data-version", default="", help="DVC md5 of the source data (part of the cache key)")
    s.add_argument("--namespace", default=None, help="Kubernetes namespace of the KFP profile")
    j = action("pytorchjob", "write a multi-node PyTorchJob / TrainJob YAML that runs packtrain train")
    j.add_argument("--nodes", type=int, default=None, help="nodes (default: pipeline.nodes)")
    j.add_argument("--gpus-per-node", type=int, default=None, help="GPUs (ranks) per node (default: train.gpus)")
    j.add_argument("--kind", choices=["pytorchjob", "trainjob"], default="pytorchjob",
                   help="kubeflow.org/v1 PyTorchJob or Kubeflow Trainer v2 TrainJob")
    j.add_argument("--namespace", default="kubeflow", help="Kubernetes namespace of the job (default: kubeflow)")
    j.add_argument("--out", default="-", help="output path ('-' = stdout)")
    e = action("export", "write metrics/<stage>.json (+ plots/train_steps.csv) of a stage's output for dvc.yaml")
    e.add_argument("stage", choices=list(STAGE_NAMES), help="the stage whose output to export")
    e.add_argument("--dir", default=None, help="the stage's output directory (default <workdir>/<stage>)")
    e.add_argument("--metrics-dir", default="metrics", help="where metrics/<stage>.json goes (default: metrics)")
    e.add_argument("--plots-dir", default="plots", help="where the plot CSVs go (default: plots)")
    for p in (c, s, j, e):
        nested_common(p)


def run(cfg, args: argparse.Namespace) -> int:
    from packtrain.errors import ConfigError

    if args.action in ("compile", "submit"):   # what would fail on the cluster only after training
        from packtrain.pipeline.preflight import refuse_before_stages

        refuse_before_stages(cfg, here=False)
    if args.action == "compile":
        from pathlib import Path

        from packtrain.pipeline.kfp_ops import compile_pipeline

        out = args.out or Path(cfg.workdir) / "pipelines" / "packtrain_pipeline.yaml"
        path = compile_pipeline(out, cfg, args.code_version)
        print(f"compiled {path}")
        return 0
    if args.action == "submit":
        from packtrain.pipeline.kfp_ops import submit

        schedule = (args.schedule or cfg.pipeline.schedule) if args.schedule is not None else None
        res = submit(args.host or cfg.pipeline.kfp_host or "", schedule, cfg=cfg, experiment=args.experiment,
                     data_version=args.data_version, namespace=args.namespace)
        for k, v in res.items():
            print(f"{k}: {v}")
        return 0
    if args.action == "pytorchjob":
        from pathlib import Path

        from packtrain.pipeline.multinode import build_job, dump_job
        from packtrain.publish import atomic_write_text

        nodes = args.nodes if args.nodes is not None else cfg.pipeline.nodes
        gpus = args.gpus_per_node if args.gpus_per_node is not None else cfg.train.gpus
        text = dump_job(build_job(cfg, nodes, gpus, args.kind, namespace=args.namespace))
        if args.out == "-":
            sys.stdout.write(text)
        else:
            atomic_write_text(Path(args.out), text)
            print(f"wrote {args.out}: {args.kind} with {nodes} node(s) × {gpus} GPU(s)", file=sys.stderr)
        return 0
    if args.action == "export":
        from pathlib import Path

        from packtrain.pipeline.dvc_export import export_stage

        stage_dir = args.dir or str(Path(cfg.workdir) / args.stage)
        for path in export_stage(args.stage, stage_dir, args.metrics_dir, args.plots_dir):
            print(f"wrote {path}")
        return 0
    raise ConfigError("packtrain pipeline: choose an action: compile, submit, pytorchjob or export")
