"""`packtrain tokenize [--docs DIR] [--out DIR]`: train/load a BPE tokenizer, write the token store."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--docs", default=None, metavar="DIR",
                        help="directory with documents.parquet, or the file (default: <workdir>/ingest)")
    parser.add_argument("--out", default=None, metavar="DIR", help="output directory (default: <workdir>/tokenize)")


def summarize(d: dict) -> str:
    lt = d.get("length_tokens") or {}
    tok = (f"trained byte-level BPE, vocab {d['vocab_size']:,}, on {d['tokenizer_train_chars'] / 1e6:.1f} M chars"
           if d["tokenizer"] == "trained" else f"tokenizer from {d['tokenizer']}, vocab {d['vocab_size']:,}")
    eos = f"EOS (id {d['eos_id']}) appended to every document" if d["append_eos"] else "no EOS appended"
    return (
        f"tokenize: {d['documents']:,} documents → {d['tokens']:,} tokens ({d['chars_per_token']:.2f} chars/token; "
        f"train {d['train_documents']:,} docs / {d['train_tokens']:,} tokens, eval {d['eval_documents']:,} docs / "
        f"{d['eval_tokens']:,} tokens). Tokens per document: p50 {lt.get('p50', 0):,.0f}, p90 {lt.get('p90', 0):,.0f}, "
        f"p99 {lt.get('p99', 0):,.0f}, max {lt.get('max', 0):,}. {tok}; {eos}. Store {d['output']}. "
        f"DVC md5 of the documents read: {d['lineage']['input_md5']['documents']}; {d['seconds']:.1f} s "
        f"({d['tokens_per_second']:,.0f} tokens/s encoding).")


def run(cfg, args) -> int:
    from packtrain.stages.tokenize import run_tokenize

    print(summarize(run_tokenize(cfg, args.docs, args.out).to_dict()))
    return 0
