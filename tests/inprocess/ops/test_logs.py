"""JSON log lines through one writer thread: request lines and tollgate's own records come out as one JSON
object a line, in order, with times in UTC milliseconds; nothing is kept while no writer runs, and one bad line
does not take the others with it."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import orjson
import pytest

from gateway.ops import logs


@pytest.fixture
def tollgate_logger() -> Iterator[logging.Logger]:
    """The "tollgate" logger as it was: start_logging takes it over, and other tests read its records."""
    logger = logging.getLogger("tollgate")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield logger
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]
    logs._pending.clear()


def test_times_are_utc_with_milliseconds() -> None:
    assert logs.iso(0.0) == "1970-01-01T00:00:00.000Z"
    assert logs.iso(1_767_225_600.1234) == "2026-01-01T00:00:00.123Z"


def test_a_record_renders_with_its_level_logger_and_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("tollgate.app", logging.ERROR, __file__, 1, "failed %s", ("x",), sys.exc_info())
    line = orjson.loads(logs.render(record))
    assert (line["level"], line["logger"], line["message"]) == ("error", "tollgate.app", "failed x")
    assert "ValueError: boom" in line["exception"] and line["time"].endswith("Z")


def test_lines_written_in_order_and_all_flushed_at_stop(tollgate_logger: logging.Logger) -> None:
    logs.emit({"time": 0.0, "request_id": "dropped"})  # no writer yet: not kept
    stream = io.StringIO()
    writer = logs.start_logging(stream)
    try:
        logs.emit({"time": 1.0, "request_id": "r1", "status": 200})
        logging.getLogger("tollgate.pipeline").warning("worker %s slow", "w1")
        logs.emit({"time": 2.0, "request_id": "r2", "status": 429})
    finally:
        writer.stop()
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert [line.get("request_id", line.get("message")) for line in lines] == ["r1", "worker w1 slow", "r2"]
    assert lines[0]["time"] == "1970-01-01T00:00:01.000Z" and lines[1]["level"] == "warning"
    logs.emit({"time": 3.0, "request_id": "after"})
    assert not logs._pending, "stopped: request lines are no longer kept"


def test_a_line_that_cannot_be_rendered_is_skipped_alone(tollgate_logger: logging.Logger) -> None:
    stream = io.StringIO()
    writer = logs.start_logging(stream)
    try:
        logs.emit({"time": 1.0, "request_id": "before"})
        logs.emit({"request_id": "no time"})  # a KeyError when rendered
        logs.emit({"time": 2.0, "request_id": "after"})
    finally:
        writer.stop()
    assert [orjson.loads(line)["request_id"] for line in stream.getvalue().splitlines()] == ["before", "after"]


def test_a_broken_stream_does_not_kill_the_writer(tollgate_logger: logging.Logger) -> None:
    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError("the reader went away")
    writer = logs.start_logging(Broken())
    logs.emit({"time": 1.0, "request_id": "lost"})
    writer.stop()  # flushes into the broken pipe: swallowed
    assert not logs._pending
