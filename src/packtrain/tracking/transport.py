"""Talking to the tracking store: which failures mean "unreachable, buffer and retry later", and HTTP calls
bounded so a dead server costs milliseconds, not MLflow's default retries with backoff (minutes).

    is_transient(err)          connection refused / timeout / HTTP 5xx, 429 / sqlite "database is locked" → True
    short_http(uri, timeout)   MLFLOW_HTTP_REQUEST_MAX_RETRIES=0 (+ a short timeout) inside the block
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class Blocked(Exception):
    """The op refers to a run created while the store was down whose real id is not known yet."""


def is_transient(err: BaseException) -> bool:
    """True for 'the store is unreachable' errors (buffer and retry), False for bad requests (raise)."""
    if isinstance(err, Blocked):
        return True
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        name = type(e).__name__
        if isinstance(e, (ConnectionError, TimeoutError)) or name in ("ConnectionError", "Timeout",
                                                                     "ReadTimeout", "ConnectTimeout",
                                                                     "MaxRetryError", "NewConnectionError"):
            return True
        msg = str(e)
        if "database is locked" in msg or "failed with exception" in msg and "API request to" in msg:
            return True
        status = getattr(e, "get_http_status_code", None)
        if callable(status):
            try:
                code = int(status())
            except (TypeError, ValueError):
                code = 0
            if code >= 500 or code == 429:
                return True
        e = e.__cause__ or e.__context__
    return False


@contextlib.contextmanager
def short_http(uri: str, timeout_s: float | None) -> Iterator[None]:
    """No MLflow HTTP retries (and a short timeout) for the calls inside; restores the environment."""
    if not uri.startswith(("http://", "https://")):
        yield
        return
    new = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    if timeout_s is not None:
        new["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(int(max(1, timeout_s)))
    from packtrain.paths import patched_env

    with patched_env(**new):
        yield
