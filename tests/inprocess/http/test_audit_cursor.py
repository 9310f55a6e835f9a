"""The audit log's cursor: every cursor the gateway hands out reads back as it was, and anything else is a 400,
including a time in another form, which the database would order in its own collation where the page's bounds
are compared in Python."""

from __future__ import annotations

import base64

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.http.admin import cursor_of, parse_cursor
from gateway.ledger.times import at


@given(moment=st.floats(0, 4_102_444_800), ident=st.text(max_size=64))
def test_a_cursor_handed_out_reads_back(moment: float, ident: str) -> None:
    row = {"time": at(moment), "id": ident}
    assert parse_cursor(cursor_of(row)) == (row["time"], ident)


@given(time_=st.text(max_size=40) | st.from_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{15}Z?", fullmatch=True))
def test_a_cursor_whose_time_is_not_an_entrys_is_refused(time_: str) -> None:
    forged = base64.urlsafe_b64encode(orjson.dumps([time_, "x"])).decode()
    try:
        at_ = parse_cursor(forged)
    except InvalidRequest as refused:
        assert refused.param == "cursor"
        return
    shape = at(0)  # accepted: the form at() writes, a digit where it has one and its punctuation elsewhere
    assert at_ is not None and len(at_[0]) == len(shape)
    assert all(c in "0123456789" if s.isdigit() else c == s for c, s in zip(at_[0], shape, strict=True))


def test_the_control_a_time_of_another_form_is_refused() -> None:
    forged = base64.urlsafe_b64encode(orjson.dumps(["2026-12-07 10:00:00", "x"])).decode()
    with pytest.raises(InvalidRequest):
        parse_cursor(forged)
