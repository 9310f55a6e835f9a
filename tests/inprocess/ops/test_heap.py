"""The C heap's large-block threshold: fixed at 256 KiB through glibc's mallopt(M_MMAP_THRESHOLD), and a quiet
no-op where the C library has no mallopt (the gateway starts the same)."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from gateway.ops import heap


class Libc:
    """A C library that records its mallopt calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1


def test_the_threshold_is_fixed_at_256_kib_through_m_mmap_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = Libc()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: libc)
    assert heap.configure() is True
    assert libc.calls == [(-3, 256 * 1024)], "glibc's M_MMAP_THRESHOLD is -3 in malloc.h"


@pytest.mark.parametrize("library", [OSError("no libc"), object()])
def test_without_mallopt_it_is_a_no_op(monkeypatch: pytest.MonkeyPatch, library: Any) -> None:
    def load(name: str) -> Any:
        if isinstance(library, Exception):
            raise library
        return library  # a C library without mallopt (musl has one; others may not)
    monkeypatch.setattr(ctypes, "CDLL", load)
    assert heap.configure() is False


def test_this_machines_glibc_takes_it() -> None:
    assert heap.configure() is True
