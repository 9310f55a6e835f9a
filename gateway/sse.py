"""Server-sent events, the one codec: split a byte stream at event boundaries, read `data:` payloads, write events.

The relay forwards upstream bytes unchanged, so splitting never re-frames: `EventSplitter.feed` returns the
complete events it has (as the bytes that arrived) and keeps a partial one for the next read. Boundaries follow
the SSE spec: a blank line, with LF, CRLF or CR line endings. vLLM writes `data: {json}\\n\\n`, one event per
write, so on the hot path a chunk normally ends on a boundary and is returned as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"
_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r|\r\n\n|\n\r\n")
_LINE = re.compile(rb"\r\n|\n|\r")


def event(data: bytes) -> bytes:
    """One `data:` event (the payload must be a single line, as JSON is)."""
    return b"data: " + data + b"\n\n"


def _last_boundary_end(data: bytes) -> int:
    """The index just past the last blank line in ``data``, or -1."""
    end = data.rfind(b"\n\n")
    if end >= 0:
        end += 2
    if b"\r" in data:  # rare: CR or CRLF line endings
        for match in _BOUNDARY.finditer(data):
            end = max(end, match.end())
    return end


class EventSplitter:
    """Feed bytes as they arrive; get back the complete events among them."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """The complete events in ``pending + chunk`` (possibly b""); the rest stays pending."""
        if self.pending:
            chunk = self.pending + chunk
            self.pending = b""
        elif chunk.endswith(b"\n\n") and b"\r" not in chunk:
            return chunk  # the common case: whole events, nothing to keep
        end = _last_boundary_end(chunk)
        if end < 0:
            self.pending = chunk
            return b""
        if end < len(chunk):
            self.pending = chunk[end:]
            return chunk[:end]
        return chunk


def split_events(block: bytes) -> list[bytes]:
    """Complete events (without their blank line) in a block that ends on a boundary."""
    if b"\r" in block:
        block = _LINE.sub(b"\n", block)
    return [e for e in block.split(b"\n\n") if e]


def payload(event_bytes: bytes) -> bytes | None:
    """The data of one event: its `data:` lines joined by newlines (one optional space after the colon is
    dropped, as the spec says); None for an event with no data (a comment or keep-alive)."""
    if event_bytes.startswith(b"data: ") and b"\n" not in event_bytes:
        return event_bytes[6:]  # the common case
    lines = [line for line in event_bytes.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[6:] if line.startswith(b"data: ") else line[5:] for line in lines)


def payloads(block: bytes) -> Iterator[bytes]:
    """Each event's data in a block of complete events, [DONE] included."""
    for event_bytes in split_events(block):
        data = payload(event_bytes)
        if data is not None:
            yield data
