"""`packtrain ingest [--source PATH] [--out DIR]`: a source (default: the stdlib corpus) → documents.parquet."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", default=None, metavar="PATH",
                        help="a .txt/.jsonl/.parquet file or a folder of them (default: ingest.source of the "
                             "recipe; null → the Python standard library corpus)")
    parser.add_argument("--out", default=None, metavar="DIR", help="output directory (default: <workdir>/ingest)")


def summarize(d: dict) -> str:
    """One paragraph: documents, size, length percentiles, md5s, time."""
    lc = d.get("length_chars") or {}
    skipped = f" Skipped {len(d['skipped_files'])} unsupported file(s)." if d.get("skipped_files") else ""
    n_bad = len(d.get("skipped_entries") or ())
    if n_bad:
        skipped += f" Skipped {n_bad} entr{'y' if n_bad == 1 else 'ies'} that cannot be read (see ingest_result.json)."
    if d.get("linked_folders"):
        skipped += " Read linked folder(s) " + ", ".join(f"{x['name']} → {x['target']}"
                                                         for x in d["linked_folders"]) + "."
    if d.get("records_skipped"):
        skipped += (f" Skipped {d['records_skipped']:,} bad record(s) (ingest.on_bad_record=skip; each listed "
                    "with its reason in ingest_result.json).")
    capped = " Stopped at ingest.max_docs." if d.get("stopped_at_max_docs") else ""
    return (
        f"ingest: {d['documents']:,} documents ({d['bytes_utf8'] / 1e6:.1f} MB of UTF-8 text) from {d['files']:,} "
        f"file(s) of {d['source']} → {d['output']}. Characters per document: p50 {lc.get('p50', 0):,.0f}, "
        f"p90 {lc.get('p90', 0):,.0f}, p99 {lc.get('p99', 0):,.0f}, max {lc.get('max', 0):,}.{skipped}{capped} "
        f"DVC md5: source {d['lineage']['input_md5']['source']}, documents {d['output_md5']}; "
        f"git {(d['lineage']['git_sha'] or 'n/a')[:12]}; "
        f"{d['seconds']:.1f} s.")


def run(cfg, args) -> int:
    from packtrain.stages.ingest import run_ingest

    if args.source is not None:
        cfg = cfg.model_copy(update={"ingest": cfg.ingest.model_copy(update={"source": args.source})})
    print(summarize(run_ingest(cfg, args.out).to_dict()))
    return 0
