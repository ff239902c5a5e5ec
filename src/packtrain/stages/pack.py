"""Stage runner: pack. `run_pack(cfg, tokens_dir, out_dir)` → out_dir/train/, out_dir/eval/, pack_stats.json.

Both pack stores and pack_stats.json (with the lineage md5) are built in a staging directory next to
`out_dir`, checked (each store opens with its checksums verified) and published together
(packtrain.paths.staged_output): a failed or killed pack leaves the previous out_dir byte-identical, a
successful one replaces it whole.
"""

from __future__ import annotations

from pathlib import Path

from packtrain.config import RunConfig
from packtrain.paths import RunPaths, staged_output

STATS_FILE = "pack_stats.json"


def run_pack(cfg: RunConfig, tokens_dir: str | Path | None = None, out_dir: str | Path | None = None) -> dict:
    """Pack the token store `tokens_dir` (default <workdir>/tokenize) into `out_dir` (default <workdir>/pack).

    Logs the pack config as params, every numeric stat as a metric (`train.fill`, `eval.n_packs`, ...),
    pack_stats.json and a document-length histogram as artifacts, the DVC md5 of the token store as the input
    dataset. Returns the stats dict (also in out_dir/pack_stats.json).
    """
    from packtrain.data.token_store import TokenStore
    from packtrain.packing.dataset import OUTPUTS, write_packs
    from packtrain.packing.store import PackStore
    from packtrain.tracking import stage_run

    paths = RunPaths(Path(cfg.workdir))
    src = Path(tokens_dir) if tokens_dir is not None else paths.tokenize_dir
    dst = Path(out_dir) if out_dir is not None else paths.pack_dir
    with stage_run("pack", cfg, section=cfg.pack) as run, staged_output(dst, OUTPUTS, "pack") as tmp:
        stats = write_packs(src, tmp, cfg.pack)
        for split in ("train", "eval"):
            PackStore.open(tmp / split)   # shapes, offsets, checksums (tokens.bin's up to 1 GiB) before publishing
        d = stats.to_dict()
        d.update(input=str(src), output=str(dst))
        digest = _md5(src / "tokens.bin")
        if digest:
            d["input_md5"] = digest
            run.set_tags({"dvc.md5.tokens": digest})
            run.log_dataset(src, "tokens", digest, context="input")
            _add_to_stats_file(tmp / STATS_FILE, {"input_md5": digest})
        run.log_stats({k: v for k, v in d.items() if k not in ("input", "output")})
        run.log_artifact(tmp / STATS_FILE)
        if run.enabled:
            _log_length_histogram(run, TokenStore.open(src), stats.train.fill, cfg.pack.budget)
    return d


def _add_to_stats_file(path: Path, extra: dict) -> None:
    """Record lineage (the md5 of the tokens read) in pack_stats.json for register's version tags."""
    import json

    from packtrain.paths import write_json

    if path.exists():
        write_json(path, {**json.loads(path.read_text()), **extra})


def _md5(path: Path) -> str | None:
    try:
        from packtrain.versioning import data_md5
    except ImportError:      # the data room's module is optional for this stage
        return None
    return data_md5(path) if path.exists() else None


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
