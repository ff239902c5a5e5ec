"""The tracking buffer applies a `register_model` op through the handler the registry room registers (a plain
callable, no import by name); a process that has not registered it keeps the op pending, never rejects it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from packtrain.tracking import store_ops
from packtrain.tracking.transport import is_transient

OP = {"op": "register_model", "id": "op1", "run_id": "r1"}


def _client(tmp_path: Path):
    """The parts of a BufferedClient apply_op reads: the id map, the MLflow client handed to handlers, the buffer."""
    return SimpleNamespace(resolve=lambda rid: rid, _client="client", uri="sqlite:///x.db", buffer_dir=tmp_path)


def test_without_its_handler_the_op_stays_pending(tmp_path, monkeypatch):
    monkeypatch.setattr(store_ops, "HANDLERS", {})
    with pytest.raises(store_ops.Blocked, match="install_handlers") as e:
        store_ops.apply_op(_client(tmp_path), OP)
    assert is_transient(e.value)   # the replayer keeps it in the buffer (not rejected.jsonl)
    with pytest.raises(ValueError, match="unknown buffered op 'nope'"):
        store_ops.apply_op(_client(tmp_path), {**OP, "op": "nope"})


def test_the_registered_callable_applies_it(tmp_path, monkeypatch):
    monkeypatch.setattr(store_ops, "HANDLERS", {})
    calls = []
    store_ops.register_handler("register_model", lambda *a: calls.append(a) or {"version": "1"})
    assert store_ops.apply_op(_client(tmp_path), OP) == {"version": "1"}
    assert calls == [("client", "sqlite:///x.db", "r1", OP, None)]

    from packtrain.registry import install_handlers
    from packtrain.registry.apply import apply_registration

    install_handlers()
    assert store_ops.HANDLERS["register_model"] is apply_registration
