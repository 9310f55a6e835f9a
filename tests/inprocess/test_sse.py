"""The SSE codec: boundaries across reads, line endings, comments, multi-line data."""

from __future__ import annotations

from gateway import sse


def feed_all(pieces: list[bytes]) -> tuple[bytes, bytes]:
    splitter = sse.EventSplitter()
    out = b"".join(splitter.feed(p) for p in pieces)
    return out, splitter.pending


def test_whole_events_pass_through_unchanged() -> None:
    block = b'data: {"a":1}\n\ndata: [DONE]\n\n'
    splitter = sse.EventSplitter()
    assert splitter.feed(block) is block, "the common case copies nothing"
    assert splitter.pending == b""


def test_events_split_at_every_byte_reassemble_exactly() -> None:
    stream = b'data: {"a":1}\n\ndata: {"b":2}\n\n: keep-alive\n\ndata: [DONE]\n\n'
    out, pending = feed_all([stream[i:i + 1] for i in range(len(stream))])
    assert out == stream and pending == b""
    assert list(sse.payloads(out)) == [b'{"a":1}', b'{"b":2}', b"[DONE]"], "comments carry no data"


def test_a_partial_event_waits_for_its_boundary() -> None:
    splitter = sse.EventSplitter()
    assert splitter.feed(b'data: {"a":1}\n\ndata: {"b"') == b'data: {"a":1}\n\n'
    assert splitter.pending == b'data: {"b"'
    assert splitter.feed(b':2}\n') == b""
    assert splitter.feed(b"\n") == b'data: {"b":2}\n\n'


def test_crlf_and_cr_line_endings() -> None:
    for nl in (b"\r\n", b"\r"):
        stream = b"data: one" + nl + nl + b"data: two" + nl + nl
        out, pending = feed_all([stream[:7], stream[7:13], stream[13:]])
        assert out == stream and pending == b""
        assert list(sse.payloads(out)) == [b"one", b"two"]


def test_data_lines_per_spec() -> None:
    assert sse.payload(b"data:no-space") == b"no-space"
    assert sse.payload(b"data:  two spaces") == b" two spaces", "only one space is dropped"
    assert sse.payload(b"event: x\ndata: a\ndata: b") == b"a\nb", "multi-line data joins with newlines"
    assert sse.payload(b": comment") is None
    assert sse.payload(b"id: 7") is None


def test_event_writer_round_trips() -> None:
    block = sse.event(b'{"x":"y"}') + sse.DONE_EVENT
    assert list(sse.payloads(block)) == [b'{"x":"y"}', sse.DONE]
