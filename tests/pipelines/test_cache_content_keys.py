"""Stage cache keys come from content only: a stage's JSON stats are hashed without the run's measurements and
paths (packtrain.pipeline.cache.MEASURED), and ingest is keyed on its source's content, not where it lies. So
`packtrain run --no-cache` twice — the second time on a copy of the corpus in another directory — leaves one
cache entry per stage, each replaced by the fresher output. Before, ingest_result.json's absolute `output` and
`seconds` gave identical documents a new md5 and every downstream stage a new key (one more entry per stage per
run: ~255 MB of stale entries after a few runs of a real corpus)."""

from __future__ import annotations

import json
import shutil

from pipeline_helpers import as_args, run_main, tiny_corpus, tiny_settings

from packtrain.pipeline.cache import content_md5, dir_md5, without_measured
from packtrain.stages.table import STAGE_NAMES


def test_measurements_and_paths_do_not_change_the_content_md5(tmp_path):
    runs = []
    for i, (seconds, where) in enumerate(((0.31, "/a"), (0.29, "/b"))):
        d = tmp_path / f"run{i}"
        d.mkdir()
        (d / "documents.parquet").write_bytes(b"PAR1 same rows")
        (d / "ingest_result.json").write_text(json.dumps({"documents": 3, "seconds": seconds, "source": where,
                                                         "output": f"{where}/documents.parquet",
                                                         "lineage": {"input_md5": {"source": "f3b6.dir"}}}))
        runs.append(d)
    assert dir_md5(runs[0]) != dir_md5(runs[1])            # the bytes differ …
    assert content_md5(runs[0]) == content_md5(runs[1])    # … the content does not
    (runs[1] / "ingest_result.json").write_text(json.dumps({"documents": 4, "seconds": 0.3}))
    assert content_md5(runs[0]) != content_md5(runs[1])    # a real change still changes the key
    (runs[1] / "ingest_result.json").write_text(json.dumps({"documents": 3, "seconds": 0.3, "lineage": {
        "input_md5": {"source": "OTHER.dir"}}}))
    assert content_md5(runs[0]) != content_md5(runs[1])    # only the listed keys are dropped, not nested namesakes
    assert without_measured("train_result.json", {"final_loss": 5.1, "timings": {"train_s": 1.0},
                                                  "throughput": {"useful_mfu": 0.2}}) == {"final_loss": 5.1}


def test_no_cache_twice_from_another_directory_leaves_one_entry_per_stage(tmp_path):
    corpus = tiny_corpus(tmp_path / "a" / "corpus")
    wd = tmp_path / "wd"
    # the champion comparison is off: the second run's evaluation would otherwise (rightly) differ, as it scores
    # against the version the first run registered
    extra = ["evaluate.against=none"]
    entries = []
    for src in (corpus, shutil.copytree(corpus, tmp_path / "b" / "elsewhere")):
        r = run_main(["run", "--no-cache", *as_args([*tiny_settings(wd, src), *extra])], cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        entries.append({s.name: sorted(p.name for p in s.iterdir()) for s in (wd / "cache").iterdir()})
    assert {s: len(e) for s, e in entries[1].items()} == {s: 1 for s in STAGE_NAMES}, entries
    assert entries[0] == entries[1]   # the same keys: each entry was replaced by the second run's output
