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
    eos = _eos_said(d)
    rows = d.get("text_rows", 0) + d.get("record_rows", 0)
    docs = (f"{rows:,} rows → {d['documents']:,} documents" if d.get("loss_mask") and rows != d["documents"]
            else f"{d['documents']:,} documents")
    return (
        f"tokenize: {docs} → {d['tokens']:,} tokens ({d['chars_per_token']:.2f} chars/token; "
        f"train {d['train_documents']:,} docs / {d['train_tokens']:,} tokens, eval {d['eval_documents']:,} docs / "
        f"{d['eval_tokens']:,} tokens). Tokens per document: p50 {lt.get('p50', 0):,.0f}, p90 {lt.get('p90', 0):,.0f}, "
        f"p99 {lt.get('p99', 0):,.0f}, max {lt.get('max', 0):,}. {tok}; {eos}. {_records_said(d)}Store {d['output']}. "
        f"DVC md5 of the documents read: {d['lineage']['input_md5']['documents']}; {d['seconds']:.1f} s "
        f"({d['tokens_per_second']:,.0f} tokens/s encoding).")


def _eos_said(d: dict) -> str:
    """The EOS rule as applied, per row kind: text rows get it; a record unless its template wrote it."""
    records, own = d.get("record_rows", 0), d.get("eos_from_template_records", 0)
    own_said = f"; {own:,} record(s) end with their template's own EOS (none appended)" if own else ""
    if not d["append_eos"]:
        return "no EOS appended" + own_said
    if not d.get("loss_mask"):
        return f"EOS (id {d['eos_id']}) appended to every document"
    text = d.get("text_rows", 0)
    return (f"EOS (id {d['eos_id']}) appended to {text:,} text row(s) and {d.get('eos_appended_records', 0):,} of "
            f"{records:,} record(s)" + own_said)


def _records_said(d: dict) -> str:
    """What the record policies did (tokenize.long_records, tokenize.control_text), or nothing for plain text."""
    policy = d.get("long_records")
    if not policy:
        return ""
    n, budget = d.get("records_over_budget", 0), d.get("record_budget")
    if budget is None:
        said = "Records were not fitted to a pack budget"
    elif not n:
        said = f"No record is longer than pack.budget {budget:,} (tokenize.long_records={policy})"
    elif policy == "truncate":
        said = (f"{n:,} record(s) longer than pack.budget {budget:,} truncated to it (tokenize.long_records=truncate):"
                f" {d.get('record_truncated_tokens', 0):,} tokens dropped")
    else:
        said = (f"{n:,} record(s) longer than pack.budget {budget:,} split with their prompt "
                f"(tokenize.long_records=split_with_prompt) into {d.get('split_chunks', 0):,} documents, "
                f"{d.get('split_context_tokens', 0):,} masked prompt tokens repeated")
    typed = d.get("control_text_records", 0)
    if typed:
        said += (f"; control strings typed in the content of {typed:,} record(s) encoded as plain text "
                 "(tokenize.control_text=as_text)")
    return said + ". "


def run(cfg, args) -> int:
    from packtrain.stages.tokenize import run_tokenize

    print(summarize(run_tokenize(cfg, args.docs, args.out).to_dict()))
    return 0
