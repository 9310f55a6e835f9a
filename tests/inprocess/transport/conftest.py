"""The transport's tests run its state machine strict: a step that gateway.transport.http1.TRANSITIONS does not
allow raises (in production it fails its request and closes the connection, and the loop goes on)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.transport import http1


@pytest.fixture(autouse=True)
def strict_states(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(http1, "STRICT", True)
    yield
