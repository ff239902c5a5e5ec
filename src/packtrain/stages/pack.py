"""Stage runner: pack. `run_pack(cfg, tokens_dir, out_dir)` → out_dir/train/, out_dir/eval/, pack_result.json
(`packtrain.stages.results.PackResult`, also returned).

Both pack stores and pack_result.json (with the lineage md5) are built in a staging directory next to
`out_dir`, checked (each store opens with its checksums verified) and published together
(packtrain.publish.staged_output): a failed or killed pack leaves the previous out_dir byte-identical, a
successful one replaces it whole.
"""

from __future__ import annotations

from pathlib import Path

from packtrain.config import RunConfig
from packtrain.paths import RunPaths
from packtrain.publish import staged_output
from packtrain.stages.lineage import make_lineage, upstream_lineage
from packtrain.stages.results import PackResult, TokenizeResult, from_library

STATS_FILE = PackResult.FILE


def run_pack(cfg: RunConfig, tokens_dir: str | Path | None = None, out_dir: str | Path | None = None
             ) -> PackResult:
    """Pack the token store `tokens_dir` (default <workdir>/tokenize) into `out_dir` (default <workdir>/pack).

    Logs the pack config as params, every numeric stat as a metric (`train.fill`, `eval.n_packs`, ...),
    pack_result.json and a document-length histogram as artifacts, the DVC md5 of tokens.bin as the input
    dataset (lineage `input_md5["tokens"]`, tag `dvc.md5.tokens`). Returns the PackResult (also in
    out_dir/pack_result.json, which replaces the library's stats file of the same name).
    """
    from packtrain.data.token_store import TokenStore
    from packtrain.data.tokenizer_files import tokenizer_hash
    from packtrain.packing.dataset import OUTPUTS, write_packs
    from packtrain.packing.store import PackStore
    from packtrain.tracking import stage_run
    from packtrain.versioning import data_md5

    paths = RunPaths(Path(cfg.workdir))
    src = Path(tokens_dir) if tokens_dir is not None else paths.tokenize_dir
    dst = Path(out_dir) if out_dir is not None else paths.pack_dir
    with stage_run("pack", cfg, section=cfg.pack) as run, staged_output(dst, OUTPUTS, "pack") as tmp:
        stats = write_packs(src, tmp, cfg.pack)
        for split in ("train", "eval"):
            PackStore.open(tmp / split)   # shapes, offsets, checksums (tokens.bin's up to 1 GiB) before publishing
        digest = data_md5(src / "tokens.bin")   # write_packs read it: it exists
        lineage = make_lineage({"tokens": digest}, upstream_lineage(src / TokenizeResult.FILE),
                               tokenizer_hash=tokenizer_hash(src / "tokenizer"))
        result = from_library(PackResult, stats.to_dict(), lineage, STATS_FILE, input=str(src), output=str(dst))
        result.write(tmp)
        run.set_tags({"dvc.md5.tokens": digest})
        run.log_dataset(src, "tokens", digest, context="input")
        run.log_stats({k: v for k, v in result.to_dict().items() if k not in ("input", "output")})
        run.log_artifact(tmp / STATS_FILE)
        if run.enabled:
            _log_length_histogram(run, TokenStore.open(src), stats.train.fill, cfg.pack.budget)
    return result


def _log_length_histogram(run, ts, fill: float, budget: int) -> None:
    """Log a PNG of the train documents' lengths (the telemetry room's plot) when plotting is available."""
    try:
        from packtrain.telemetry.plots import plot_length_histogram
    except ImportError:
        return
    import tempfile

    lengths = ts.lengths()[ts.select(0)]
    if len(lengths):
        with tempfile.TemporaryDirectory(prefix="pack-hist-") as tmp:
            run.log_artifact(plot_length_histogram(lengths, fill, Path(tmp) / "pack_length_histogram.png",
                                                   budget=budget))
