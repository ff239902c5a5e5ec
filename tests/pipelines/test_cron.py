"""The KFP recurring-run cron check: 6 fields, seconds first; a 5-field cron gets an explaining error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packtrain.errors import ConfigError
from packtrain.pipeline.cron import FIELDS, validate_cron


@pytest.mark.parametrize("expr, normalized", [
    ("0 0 3 * * 1", "0 0 3 * * 1"),                # Mondays 03:00:00
    ("  0 0   3 * * 1 ", "0 0 3 * * 1"),            # whitespace normalized
    ("0 */15 * * * *", "0 */15 * * * *"),
    ("0 0 3 ? * MON", "0 0 3 ? * MON"),
    ("30 5 1-5 1,15 JAN-MAR *", "30 5 1-5 1,15 JAN-MAR *"),
    ("@weekly", "@weekly"),
    ("@every 6h", "@every 6h"),
])
def test_valid(expr, normalized):
    assert validate_cron(expr) == normalized


@pytest.mark.parametrize("expr, fragment", [
    ("0 3 * * 1", "did you mean '0 0 3 * * 1'"),    # the classic 5-field cron
    ("0 3 * * 1", "SECONDS first"),
    ("* * * *", "has 4 fields"),
    ("", "has 0 fields"),
    ("0 0 24 * * *", "hour '24' is not allowed (allowed: 0-23"),
    ("60 0 3 * * 1", "second '60'"),
    ("0 0 3 0 * *", "day of month '0'"),
    ("0 0 3 * 13 *", "month '13'"),
    ("0 0 3 * * 8", "day of week '8'"),
    ("0 0 3 * * FUNDAY", "names SUN|MON"),
    ("0 */0 * * * *", "step '0'"),
    ("0 ? * * * *", "minute '?'"),                    # '?' only in day fields
    ("@fortnightly", "unknown descriptor"),
])
def test_invalid(expr, fragment):
    with pytest.raises(ConfigError) as e:
        validate_cron(expr)
    assert fragment in str(e.value)


_field = st.sampled_from(range(len(FIELDS))).flatmap(
    lambda i: st.tuples(st.just(i), st.integers(FIELDS[i][1], FIELDS[i][2])))


@given(st.lists(st.one_of(st.just("*"), st.integers(0, 100).map(str)), min_size=6, max_size=6))
def test_any_six_field_cron_is_accepted_iff_every_number_is_in_range(parts):
    in_range = all(p == "*" or FIELDS[i][1] <= int(p) <= FIELDS[i][2] for i, p in enumerate(parts))
    expr = " ".join(parts)
    if in_range:
        assert validate_cron(expr) == expr
    else:
        with pytest.raises(ConfigError):
            validate_cron(expr)


@given(st.lists(st.integers(0, 5).map(str), min_size=5, max_size=5))
def test_every_five_field_cron_is_rejected_with_the_six_field_suggestion(parts):
    expr = " ".join(parts)
    with pytest.raises(ConfigError, match="did you mean '0 " + expr + "'"):
        validate_cron(expr)
