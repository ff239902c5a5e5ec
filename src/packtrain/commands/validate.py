"""`packtrain validate [--docs DIR] [--out DIR]`: the Great Expectations suite on the documents table."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--docs", default=None, metavar="DIR",
                        help="directory with documents.parquet, or the file (default: <workdir>/ingest)")
    parser.add_argument("--out", default=None, metavar="DIR", help="output directory (default: <workdir>/validate)")


def summarize(d: dict) -> str:
    dup = d.get("duplicate_ratio")
    dup_txt = f" Duplicate ratio {dup:.2%}." if dup is not None else ""
    return (
        f"validate: PASSED {d['passed']}/{d['expectations']} expectations on {d['documents']:,} documents.{dup_txt} "
        f"Report {d['report']}; Data Docs {d['data_docs']}. DVC md5 of the documents read: "
        f"{d['lineage']['input_md5']['documents']}.")


def run(cfg, args) -> int:
    from packtrain.stages.validate import run_validate

    print(summarize(run_validate(cfg, args.docs, args.out).to_dict()))
    return 0
