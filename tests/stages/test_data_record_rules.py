"""Bad documents through the real CLI (in-process `packtrain.cli.main`, real GX, real MLflow on sqlite):
documents with no visible text, file names that are not UTF-8, chat roles out of order, prompts over the pack
budget caught at validate, and ingest.on_bad_record=skip dropping and listing them. Inputs stay byte-identical."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from packtrain.cli import main
from packtrain.data.synthetic_chat import synthetic_conversations

NO_TRACK = ["--set", "tracking.enabled=false"]
# validate.contamination.suites=false: the overlap with the recipe's eval suites (rendering the wordorder task's 200
# items at every validate: ~0.3 CPU-s of each, 1/4 of this module) is not what these rules are about
SMALL = ["--set", "validate.min_rows=4", "--set", "tokenize.vocab_size=300", "--set", "tokenize.eval_fraction=0",
         "--set", "pack.budget=256", "--set", "validate.contamination.suites=false"]


def _snapshot(folder: Path) -> dict[bytes, str]:
    """{bytes path: md5} of every file under `folder` (bytes paths: names need not be UTF-8)."""
    out = {}
    for root, _, files in os.walk(os.fsencode(folder)):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[p] = hashlib.md5(fh.read()).hexdigest()
    return out


def _good_txt(folder: Path, n: int = 11) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"g{i:02d}.txt").write_text(f"good document {i}: some words to read.\n", encoding="utf-8")


def _jsonl(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")


def _common(tmp_path: Path) -> list[str]:
    return ["--set", f"workdir={tmp_path / 'wd'}", *NO_TRACK, *SMALL]


# -- documents with no visible text -------------------------------------------------------------------------

def test_txt_without_visible_text_is_refused_at_ingest(tmp_path, capsys):
    """A .txt of 1,000 NUL bytes, or of U+FFFD only, among good documents: exit 3 naming the file."""
    for name, data in (("nul.txt", b"\x00" * 1000), ("fffd.txt", "\ufffd".encode() * 40)):
        src = tmp_path / name.split(".")[0]
        _good_txt(src)
        (src / name).write_bytes(data)
        before = _snapshot(src)
        code = main(["ingest", "--source", str(src), *_common(tmp_path)])
        err = capsys.readouterr().err
        assert code == 3, err
        assert name in err and "no visible text" in err, err
        assert ("1,000 NUL/control" if name == "nul.txt" else "40 U+FFFD replacement") in err, err
        assert _snapshot(src) == before
        assert not (tmp_path / "wd" / "ingest").exists(), "a failed ingest published something"


def test_records_without_visible_text_fail_validate_by_name(tmp_path, capsys):
    """.jsonl texts and chat turns of NUL/control or U+FFFD only pass ingest (they are records) and fail the
    has_visible_text expectation, which names file:line and the field."""
    src = tmp_path / "in"
    _jsonl(src / "t.jsonl", [{"text": f"fine text {i}"} for i in range(5)]
           + [{"text": "\x00\x01\x02" * 10}, {"text": "\ufffd\ufffd \ufffd"}])
    chat = synthetic_conversations(4)
    chat.insert(1, {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\x00" * 8}]})
    _jsonl(src / "c.jsonl", chat)
    before = _snapshot(src)
    common = _common(tmp_path)
    assert main(["ingest", "--source", str(src), *common]) == 0
    code = main(["validate", *common])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "has_visible_text (3 unexpected" in err, err
    assert "t.jsonl:6 no visible text (30 characters: 30 NUL/control)" in err, err
    assert "t.jsonl:7 no visible text (4 characters: 3 U+FFFD replacement, 1 whitespace)" in err, err
    assert "c.jsonl:2 messages[1].content has no visible text" in err, err
    report = json.loads((tmp_path / "wd" / "validate.failed" / "report.json").read_text())
    res = next(r for r in report["results"] if r["name"] == "has_visible_text")
    assert res["expectation"] == "expect_column_values_to_be_null" and not res["success"]
    assert {r["source"] for r in res["offending_rows"]} == {"t.jsonl:6", "t.jsonl:7", "c.jsonl:2"}
    assert _snapshot(src) == before


# -- file names that are not UTF-8 --------------------------------------------------------------------------

def test_non_utf8_file_names_are_refused_naming_the_bytes(tmp_path, capsys):
    """A name with a latin-1 byte (made through a bytes path) in the folder, in a subfolder, or as the source
    itself: exit 3 naming the name's bytes and its folder, no traceback; with unsupported=skip it is skipped
    and listed."""
    src = tmp_path / "in"
    _good_txt(src)
    bad = os.path.join(os.fsencode(src), b"caf\xe9.txt")
    with open(bad, "wb") as fh:
        fh.write(b"caf\xc3\xa9 au lait\n")
    before = _snapshot(src)
    common = _common(tmp_path)
    assert main(["ingest", "--source", str(src), *common]) == 3
    err = capsys.readouterr().err
    assert "file name b'caf\\xe9.txt' in folder" in err and str(src) in err and "not valid UTF-8" in err, err
    assert "Traceback" not in err
    assert main(["ingest", "--source", os.fsdecode(bad), *common]) == 3     # the file itself as the source
    err = capsys.readouterr().err
    assert "file name b'caf\\xe9.txt'" in err, err

    os.rename(bad, os.path.join(os.fsencode(src), b"g00.txt.keep"))          # now a folder with a bad name
    sub = os.path.join(os.fsencode(src), b"d\xfcr")
    os.mkdir(sub)
    with open(os.path.join(sub, b"x.txt"), "wb") as fh:
        fh.write(b"inside\n")
    assert main(["ingest", "--source", str(src), *common, "--set", "ingest.unsupported=skip"]) == 0
    stats = json.loads((tmp_path / "wd" / "ingest" / "ingest_result.json").read_text(encoding="utf-8"))
    assert {"name": "d\\xfcr", "target": None, "problem": f"file name b'd\\xfcr' in folder '{src}' is not valid "
            "UTF-8 (byte 0xfc at offset 1)"} in stats["skipped_entries"], stats["skipped_entries"]
    assert stats["documents"] == 11
    assert set(_snapshot(src)) >= set(before) - {bad}


# -- chat roles out of order --------------------------------------------------------------------------------

def _turns(*roles: str) -> dict:
    return {"messages": [{"role": r, "content": f"{r} says {i}"} for i, r in enumerate(roles)]}


ROLE_CASES = [   # (record, the problem validate names)
    (_turns("assistant", "user", "assistant"), 'messages[0].role is "assistant" (the first turn), expected system or user'),
    (_turns("user", "user", "assistant"), 'messages[1].role is "user" (after "user"), expected assistant'),
    (_turns("user", "assistant", "user"), 'messages[2].role is "user" (the last turn), expected assistant'),
    (_turns("user", "system", "assistant"), 'messages[1].role is "system" (after "user"), expected assistant'),
    (_turns("user", "tool", "assistant"), 'messages[1].role is "tool" (after "user"), expected assistant'),
]


def test_roles_out_of_order_fail_validate_naming_the_turn(tmp_path, capsys):
    src = tmp_path / "in"
    good = [*synthetic_conversations(4), _turns("system", "user", "assistant", "user", "assistant"),
            _turns("user", "assistant", "tool", "tool", "assistant")]
    _jsonl(src / "chat.jsonl", good + [case for case, _ in ROLE_CASES])
    common = _common(tmp_path)
    assert main(["ingest", "--source", str(src), *common]) == 0
    code = main(["validate", *common])
    err = capsys.readouterr().err
    assert code == 4, err
    assert f"role_order ({len(ROLE_CASES)} unexpected" in err, err
    for i, (_, problem) in enumerate(ROLE_CASES):
        assert f"chat.jsonl:{len(good) + 1 + i} {problem}" in err, (problem, err)
    report = json.loads((tmp_path / "wd" / "validate.failed" / "report.json").read_text())
    assert report["failed"] == ["role_order"], report["failed"]      # the good orders (system, tool) pass
    # the documented opt-out: roles in any order (only roles_allowed applies)
    assert main(["validate", *common, "--set", "validate.role_order=any"]) == 0


# -- a prompt longer than the pack budget, at validate ------------------------------------------------------

def _long_prompt_source(tmp_path: Path) -> Path:
    src = tmp_path / "in"
    rows = synthetic_conversations(6)
    rows.insert(2, {"messages": [{"role": "user", "content": "why " * 200}, {"role": "assistant", "content": "ok"}]})
    _jsonl(src / "c.jsonl", rows)
    _jsonl(src / "p.jsonl", [{"prompt": "2+2=", "completion": "4"}, {"prompt": "say " * 150, "completion": "said"}])
    return src


def _counts(err: str, where: str) -> int:
    m = re.search(re.escape(where) + r"[^:]*: prompt of (?:at least )?([\d,]+) tokens", err) or \
        re.search(re.escape(where) + r" prompt of (?:at least )?([\d,]+) tokens", err)
    assert m, (where, err)
    return int(m.group(1).replace(",", ""))


def test_prompt_over_budget_fails_validate_with_a_lower_bound(tmp_path, capsys):
    """The trained-BPE case: validate refuses with a count that never exceeds tokenize's exact one."""
    src = _long_prompt_source(tmp_path)
    common = [*_common(tmp_path), "--set", "pack.budget=128"]
    assert main(["ingest", "--source", str(src), *common]) == 0
    code = main(["validate", *common])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "prompt_fits_budget (2 unexpected" in err and "does not fit the pack budget 128" in err, err
    bound = {w: _counts(err, w) for w in ("c.jsonl:3", "p.jsonl:2")}
    assert "at least" in err and all(n >= 128 for n in bound.values()), bound
    assert main(["tokenize", *common]) == 3                   # tokenize, which knows the tokens, agrees
    err = capsys.readouterr().err
    exact = {w: _counts(err, w) for w in bound}
    assert all(exact[w] >= bound[w] for w in bound), (exact, bound)


def test_prompt_over_budget_at_validate_is_exact_with_a_tokenizer_dir(tmp_path, capsys):
    """tokenize.tokenizer_dir set: validate counts with that tokenizer through tokenize's own code, so it
    names the same number of tokens tokenize does."""
    from packtrain.data.tokenizer_setup import train_tokenizer

    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    train_tokenizer([f"why say ok {i} " * 20 for i in range(50)], 300, tok_dir)
    src = _long_prompt_source(tmp_path)
    common = [*_common(tmp_path), "--set", "pack.budget=128", "--set", f"tokenize.tokenizer_dir={tok_dir}"]
    assert main(["ingest", "--source", str(src), *common]) == 0
    assert main(["validate", *common]) == 4
    err = capsys.readouterr().err
    at_validate = {w: _counts(err, w) for w in ("c.jsonl:3", "p.jsonl:2")}
    assert "at least" not in err, err
    assert main(["tokenize", *common]) == 3
    err = capsys.readouterr().err
    at_tokenize = {w: _counts(err, w) for w in at_validate}
    assert at_validate == at_tokenize
    # a budget both fit: validate passes
    assert main(["validate", *common, "--set", "pack.budget=4096"]) == 0


# -- ingest.on_bad_record -----------------------------------------------------------------------------------

def _mixed_bad_source(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder of good documents and one of every kind of bad one; {source locator: reason fragment}."""
    src = tmp_path / "in"
    _good_txt(src, 4)
    (src / "nul.txt").write_bytes(b"\x00" * 100)
    _jsonl(src / "t.jsonl", ['{"text": "one"}', '{"text": "two",,}', '{"text": 42}', '{"body": "x"}',
                             '{"text": ""}', '{"text": "three"}'])
    chat = synthetic_conversations(3)
    chat += [_turns("assistant", "user", "assistant"),
             {"messages": [{"role": "bot", "content": "x"}, {"role": "assistant", "content": "y"}]},
             {"messages": [{"role": "user", "content": "why " * 300}, {"role": "assistant", "content": "ok"}]}]
    _jsonl(src / "c.jsonl", chat)
    (src / "l.jsonl").write_bytes(b'{"text": "caf\xe9"}\n{"text": "fine"}\n')
    return src, {"nul.txt": "no visible text", "t.jsonl:2": "malformed JSON", "t.jsonl:3": "is a number",
                 "t.jsonl:4": "no field 'text'", "t.jsonl:5": "text_not_empty", "c.jsonl:4": "role_order: messages[0]",
                 "c.jsonl:5": 'roles_allowed: messages[0].role is "bot"', "c.jsonl:6": "prompt_fits_budget: prompt of",
                 "l.jsonl:1": "not valid UTF-8"}


def test_on_bad_record_fail_stops_at_the_first_bad_record(tmp_path, capsys):
    """fail (the default, today's behaviour): exit 3 naming the first bad record; nothing published."""
    src, _ = _mixed_bad_source(tmp_path)
    before = _snapshot(src)
    for extra in ([], ["--set", "ingest.on_bad_record=fail"]):
        assert main(["ingest", "--source", str(src), *_common(tmp_path), *extra]) == 3
        err = capsys.readouterr().err
        assert "l.jsonl: line 1: not valid UTF-8" in err, err      # files in sorted order: l.jsonl is read first
        assert not (tmp_path / "wd" / "ingest").exists() and _snapshot(src) == before


def test_on_bad_record_skip_lists_every_skipped_record_and_the_run_continues(tmp_path, capsys):
    """skip: each bad record is dropped and listed with its reason in ingest_result.json, the count is an MLflow
    metric of the ingest run (and on_bad_record its param), and validate → tokenize pass on the rest."""
    import mlflow

    src, expected = _mixed_bad_source(tmp_path)
    before = _snapshot(src)
    wd = tmp_path / "wd"
    common = ["--set", f"workdir={wd}", "--set", "tracking.system_metrics=false", *SMALL,
              "--set", "pack.budget=200", "--set", "ingest.on_bad_record=skip"]
    assert main(["ingest", "--source", str(src), *common]) == 0
    err = capsys.readouterr().err
    assert f"warning: ingest skipped {len(expected)} bad record(s)" in err, err
    stats = json.loads((wd / "ingest" / "ingest_result.json").read_text())
    assert stats["records_skipped"] == len(expected) == len(stats["skipped_records"])
    listed = {r["source"]: r["reason"] for r in stats["skipped_records"]}
    assert set(listed) == set(expected), listed
    for where, fragment in expected.items():
        assert fragment in listed[where], (where, listed[where])
    assert stats["documents"] == 4 + 2 + 3 + 1              # good txt, t.jsonl one/three, 3 chats, l.jsonl "fine"
    assert main(["validate", *common]) == 0                 # the run continues on what is left
    assert main(["tokenize", *common]) == 0
    client = mlflow.MlflowClient(f"sqlite:///{wd / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="attributes.run_name = 'ingest'")
    assert runs and runs[0].data.metrics["records_skipped"] == len(expected)
    assert runs[0].data.params["ingest.on_bad_record"] == "skip"
    assert _snapshot(src) == before
