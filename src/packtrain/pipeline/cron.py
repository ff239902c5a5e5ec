"""KFP recurring-run cron expressions: 6 fields, seconds first (robfig/cron), checked before submitting.

    ┌ second (0-59)  ┌ minute (0-59)  ┌ hour (0-23)  ┌ day of month (1-31)  ┌ month (1-12|JAN-DEC)  ┌ day of week (0-6|SUN-SAT)
    0                0                3              *                      *                       1        → Mondays 03:00:00

A standard 5-field cron (`0 3 * * 1`) is the common mistake: KFP would read `0` as seconds and `3` as the
minute, so the error says so and suggests the 6-field form. Descriptors (`@weekly`, `@every 1h`) pass.
"""

from __future__ import annotations

import re

from packtrain.errors import ConfigError

FIELDS = (("second", 0, 59), ("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31),
          ("month", 1, 12), ("day of week", 0, 6))
NAMES = {
    "month": {m: i + 1 for i, m in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())},
    "day of week": {d: i for i, d in enumerate("SUN MON TUE WED THU FRI SAT".split())},
}
DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_EVERY = re.compile(r"^@every\s+(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")


def validate_cron(expr: str) -> str:
    """Return the normalized expression or raise ConfigError naming the field, the value and the range.

    >>> validate_cron("0 0 3 * * 1")
    '0 0 3 * * 1'
    >>> validate_cron("0 3 * * 1")
    Traceback (most recent call last):
    packtrain.errors.ConfigError: schedule '0 3 * * 1' has 5 fields; KFP cron has 6 ...
    """
    text = " ".join(str(expr).split())
    if text.startswith("@"):
        if text in DESCRIPTORS or _EVERY.match(text):
            return text
        raise ConfigError(f"schedule {expr!r}: unknown descriptor (allowed: {', '.join(DESCRIPTORS)}, "
                          "'@every <duration>' like '@every 6h')")
    parts = text.split(" ") if text else []
    if len(parts) == 5:
        raise ConfigError(
            f"schedule {expr!r} has 5 fields; KFP cron has 6 with SECONDS first "
            f"(second minute hour day-of-month month day-of-week): did you mean '0 {text}'?")
    if len(parts) != 6:
        raise ConfigError(f"schedule {expr!r} has {len(parts)} fields; KFP cron has 6: "
                          "second minute hour day-of-month month day-of-week, e.g. '0 0 3 * * 1' (Mondays 03:00)")
    for value, (name, lo, hi) in zip(parts, FIELDS, strict=True):
        _check_field(expr, value, name, lo, hi)
    return text


def _check_field(expr: str, value: str, name: str, lo: int, hi: int) -> None:
    allowed_q = name in ("day of month", "day of week")
    for item in value.split(","):
        base, _, step = item.partition("/")
        if step and (not step.isdigit() or int(step) == 0):
            raise ConfigError(f"schedule {expr!r}: {name} step {step!r} must be a positive integer")
        if base == "*" or (base == "?" and allowed_q):
            continue
        for bound in base.split("-", 1):
            n = _number(bound, name)
            if n is None or not lo <= n <= hi:
                raise ConfigError(f"schedule {expr!r}: {name} {bound!r} is not allowed "
                                  f"(allowed: {lo}-{hi}, '*', lists a,b, ranges a-b, steps */n"
                                  + (", '?'" if allowed_q else "")
                                  + (", names " + "|".join(NAMES[name]) if name in NAMES else "") + ")")


def _number(text: str, name: str) -> int | None:
    if text.isdigit():
        return int(text)
    return NAMES.get(name, {}).get(text.upper())
