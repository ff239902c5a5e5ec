"""validate hands GX md5 digests instead of texts (memory O(documents)); for every expectation on the text
column the digests must give the answers the texts would: null, type, regex \\S (not empty), duplicates."""

from __future__ import annotations

import re

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from packtrain.data.documents_frame import text_surrogates

texts = st.lists(st.one_of(st.none(), st.integers(0, 3),
                           st.text(alphabet=st.sampled_from(["a", "b", " ", "\n", "\u00a0", "é", "\u2003"]),
                                   max_size=4)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(texts)
def test_surrogates_answer_every_text_expectation_like_the_texts(values):
    raw = pd.Series(values, dtype=object)
    sur = pd.Series(text_surrogates(values), dtype=object)
    assert (raw.isna() == sur.isna()).all()                                           # text_not_null
    assert [type(v) for v in raw] == [type(v) for v in sur]                           # text_type
    pat = re.compile(r"\S")
    assert [isinstance(v, str) and bool(pat.search(v)) for v in raw] == \
           [isinstance(v, str) and bool(pat.search(v)) for v in sur]                  # text_not_empty
    assert (raw.duplicated(keep="first") == sur.duplicated(keep="first")).all()       # duplicate ids
    assert raw.nunique() == sur.nunique()                                             # duplicate_ratio


def test_surrogates_are_short_for_long_texts():
    (s,) = text_surrogates(["word " * 100_000])
    assert s.startswith("md5:") and len(s) == 36
