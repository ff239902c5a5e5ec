"""find_contamination: word n-gram overlap after normalisation, on literal tiny inputs."""

from __future__ import annotations

import pytest

from packtrain.data.contamination import find_contamination, normalize, read_eval_documents

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
