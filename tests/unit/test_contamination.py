"""find_contamination: word n-gram overlap after normalisation, on literal tiny inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from packtrain.data.contamination import find_contamination, normalize
from packtrain.data.contamination_sources import read_eval_documents
from packtrain.errors import InputDataError

EVAL = "the quick brown fox jumps over the lazy dog near the river bank today"   # 14 words


def _words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def test_normalize_lowercases_and_keeps_code_words_apart():
    assert normalize("The  Quick,\n\tBROWN fox's") == ["the", "quick", "brown", "fox", "s"]
    assert normalize("a_b -- c!") == ["a_b", "c"]
    assert normalize("def text(self, line): return self.text[0]") == [
        "def", "text", "self", "line", "return", "self", "text", "0"]   # merged before: "textself", "selftext0"
    assert normalize("- - - # # #") == [] and normalize("") == []
    assert normalize("Ça «marche»: très_bien") == ["ça", "marche", "très_bien"]


def test_an_item_quoted_as_an_escaped_string_is_found():
    """A code item with its real newlines, quoted in a training document as a string literal (JSON or Python
    source: `\\n` for each newline), holds the same words; before, `\\n    if` read as the word `n`."""
    item = "def fit(size):\n    if isinstance(size, str):\n        size = parse(size)\n    return size * 2 + offset"
    quoted = "cases = " + json.dumps([item]) + "  # fixtures"
    assert "\\n" in quoted and "\n" not in quoted
    r = find_contamination([(0, _words(40, "a")), (1, quoted)], [("task", item)], 13, min_coverage=0.5)
    assert r.doc_ids == [1] and r.overlaps[0].coverage == 1.0
    assert normalize("C:\\new\\table") == ["c", "ew", "able"]   # a backslash path reads alike on both sides


@pytest.mark.parametrize("n", [3, 13])
def test_a_planted_eval_passage_is_found_and_named(n):
    planted = _words(30, "x") + " " + EVAL.upper().replace(" ", ",  ") + ". " + _words(30, "y")
    train = [(0, _words(100, "a")), (1, planted), (2, _words(100, "b"))]
    r = find_contamination(train, [(("suite", "qa.jsonl", "qa.jsonl:1"), EVAL)], n)
    assert r.doc_ids == [1]
    (o,) = r.overlaps
    assert o.eval_id == ("suite", "qa.jsonl", "qa.jsonl:1")
    assert o.ngram == " ".join(EVAL.split()[:n]) and o.shared_ngrams == 14 - n + 1
    assert (r.ngram, r.train_documents, r.eval_documents, r.eval_too_short) == (n, 3, 1, 0)


def test_twelve_shared_words_are_not_a_13_gram():
    twelve = " ".join(EVAL.split()[:12])
    r = find_contamination([(0, _words(5, "a") + " " + twelve + " " + _words(5, "b"))], [("e", EVAL)], 13)
    assert r.overlaps == []
    assert find_contamination([(0, twelve)], [("e", EVAL)], 12).doc_ids == [0]


def test_no_ngram_spans_two_training_documents():
    words = EVAL.split()
    train = [(0, " ".join(words[:7])), (1, " ".join(words[7:]))]   # the passage split over two documents
    assert find_contamination(train, [("e", EVAL)], 8).overlaps == []   # 7 + 7 words


def test_short_eval_documents_contaminate_nothing():
    r = find_contamination([(0, "the answer is 42 and more words follow here")], [("e", "the answer is 42")], 13)
    assert r.overlaps == [] and r.eval_too_short == 1 and r.eval_ngrams == 0


def test_first_eval_document_listed_wins_and_batches_do_not_matter():
    evals = [("e0", _words(20, "p")), ("e1", _words(20, "p") + " tail")]
    train = [(i, _words(10, "z") + (" " + _words(20, "p") if i % 7 == 3 else "")) for i in range(40)]
    a = find_contamination(train, evals, 13, batch_docs=3)
    b = find_contamination(train, evals, 13, batch_docs=1000)
    assert a.doc_ids == b.doc_ids == [3, 10, 17, 24, 31, 38]
    assert {o.eval_id for o in a.overlaps} == {"e0"}


def test_read_eval_documents_locates_records(tmp_path):
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "qa.jsonl").write_text('{"text": "one"}\n\n{"text": "two"}\n')
    (tmp_path / "evals" / "notes.txt").write_text("para one\nline\n\npara two\n")
    got = read_eval_documents([tmp_path / "evals"])
    suite = str(tmp_path / "evals")
    assert got == [((suite, f"{suite}/notes.txt", "notes.txt:1"), "para one\nline"),
                   ((suite, f"{suite}/notes.txt", "notes.txt:4"), "para two"),
                   ((suite, f"{suite}/qa.jsonl", "qa.jsonl:1"), "one"),
                   ((suite, f"{suite}/qa.jsonl", "qa.jsonl:3"), "two")]


# --- what the default check reads: task suites, the held-out split, the hint (packtrain.data.contamination_sources)

WORDORDER = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "wordorder" / "wordorder.yaml"


def _table(path: Path, texts: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"doc_id": list(range(len(texts))), "text": texts,
                             "source": [f"train.jsonl:{i + 1}" for i in range(len(texts))]}), path)
    return path


def test_task_documents_are_prompt_plus_gold_choice():
    from packtrain.data.contamination_sources import task_documents

    docs = task_documents(WORDORDER, "suite 'wordorder'")
    items = [json.loads(x) for x in WORDORDER.with_suffix(".jsonl").read_text().splitlines()]
    assert len({loc for _, loc, _ in docs}) == len(items) == 200 and len(docs) == 3 * 200   # + its stored forms
    f, loc, text = docs[0]
    assert (f.name, loc) == ("wordorder.jsonl", "wordorder.jsonl:1")
    assert text == items[0]["context"] + "\n    " + items[0]["choices"][items[0]["label"]]   # target_delimiter
    assert min(len(normalize(t)) for _, _, t in docs) >= 8   # every item long enough to be matched (min_ngram)


def test_default_check_finds_a_planted_task_item_and_a_held_out_copy(tmp_path):
    from packtrain.config.data import ContaminationConfig
    from packtrain.config.evaluate import SuiteConfig
    from packtrain.data.contamination_check import check_table
    from packtrain.data.contamination_sources import HELD_OUT, EvalSources
    from packtrain.data.tokenize import split_eval

    rng = np.random.default_rng(0)
    texts = [" ".join(f"w{i}" for i in rng.integers(0, 5000, 80)) for _ in range(30)]
    item = json.loads(WORDORDER.with_suffix(".jsonl").read_text().splitlines()[4])
    texts[3] = texts[3][:40] + "\n" + item["context"] + "\n    " + item["choices"][item["label"]] + "\n" + texts[3][40:]
    held = np.flatnonzero(split_eval(np.arange(31), 0.1)).tolist()
    assert held and 30 not in held
    texts.append(texts[held[0]])   # doc 30: a verbatim copy of a held-out document, in the training split
    cfg = ContaminationConfig()    # the defaults: drop, min_coverage 0.5, 13-grams, matched whole from 8 words
    found = check_table(_table(tmp_path / "documents.parquet", texts), cfg,
                        EvalSources(suites=((0, SuiteConfig(name="wordorder", role="task", path=str(WORDORDER))),),
                                    held_out_fraction=0.1))
    got = {o["doc_id"]: (o["suite"], o["eval_record"], o["coverage"]) for o in found["overlaps"]}
    assert got == {3: ("wordorder", "wordorder.jsonl:5", 1.0), 30: (HELD_OUT, f"train.jsonl:{held[0] + 1}", 1.0)}
    assert found["policy"] == "drop" and found["held_out_documents"] == len(held)
    assert found["documents"] == 31 - len(held)                    # the held-out documents are not checked
    assert not set(got) & set(held)


def test_a_record_without_the_text_field_names_its_real_keys(tmp_path):
    from packtrain.data.contamination_sources import EvalSources, read_sources

    (tmp_path / "t.yaml").write_text(WORDORDER.read_text())
    (tmp_path / "wordorder.jsonl").write_text(WORDORDER.with_suffix(".jsonl").read_text())
    with pytest.raises(InputDataError) as e:
        read_sources(EvalSources(against=(str(tmp_path / "wordorder.jsonl"),)))
    msg = str(e.value)
    assert "no field 'text' (its string fields: context; lists: choices)" in msg
    assert "validate.contamination.text_field=context" in msg and str(tmp_path / "t.yaml") in msg
    assert "ingest.text_field" not in msg
    docs = read_sources(EvalSources(against=(str(tmp_path / "t.yaml"),)))   # the task YAML itself is supported
    assert len({d[0] for d in docs}) == 200 and docs[0][0] == (str(tmp_path / "t.yaml"), str(tmp_path / "wordorder.jsonl"),
                                               "wordorder.jsonl:1")


def test_a_repeated_ngram_counts_once_and_does_not_blow_up():
    """A table of zeros on both sides: one distinct 13-gram, one index entry — not 5,000 × 5,000 pairs."""
    zeros = " ".join(["0"] * 5000)
    evals = [("e", zeros), ("f", _words(30, "a") + " " + zeros)]   # f: 18 + 12 (boundary) + 1 distinct 13-grams
    r = find_contamination([(0, zeros), (1, _words(50, "a"))], evals, 13, min_coverage=0.5)
    assert [(o.doc_id, o.eval_id, o.shared_ngrams, o.coverage) for o in r.overlaps] == [
        (0, "e", 1, 1.0), (1, "f", 18, round(18 / 31, 4))]
    assert find_contamination([(1, _words(50, "a"))], evals, 13, min_coverage=0.6).overlaps == []


def test_a_copy_of_the_task_data_file_is_found_named_with_its_suite(tmp_path):
    """The item as its data file stores it (a corpus that swept up wordorder.jsonl, pasted as a Python dict, or
    as a CSV row, upper-cased): a key or the other choice stands between the prompt and the gold answer, which the
    rendered document alone never matched."""
    from packtrain.config.data import ContaminationConfig
    from packtrain.config.evaluate import SuiteConfig
    from packtrain.data.contamination_check import check_table
    from packtrain.data.contamination_sources import EvalSources

    lines = WORDORDER.with_suffix(".jsonl").read_text().splitlines()
    rng = np.random.default_rng(1)
    texts = [" ".join(f"w{i}" for i in rng.integers(0, 5000, 80)) for _ in range(8)]
    texts[1] += "\n" + lines[6] + "\n"                                     # the .jsonl line, verbatim
    texts[4] = repr(json.loads(lines[9])) + "\n" + texts[4]                 # a Python dict
    item = json.loads(lines[11])
    texts[6] += "\n" + f'{item["context"]},"{item["choices"]}",{item["label"]}'.upper()   # a CSV row
    found = check_table(_table(tmp_path / "documents.parquet", texts), ContaminationConfig(),
                        EvalSources(suites=((0, SuiteConfig(name="wordorder", role="task", path=str(WORDORDER))),)))
    got = {o["doc_id"]: (o["suite"], o["eval_record"], o["coverage"]) for o in found["overlaps"]}
    assert got == {1: ("wordorder", "wordorder.jsonl:7", 1.0), 4: ("wordorder", "wordorder.jsonl:10", 1.0),
                   6: ("wordorder", "wordorder.jsonl:12", 1.0)}
