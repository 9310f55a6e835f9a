"""The batch JSONL formats: checking an input file's lines, and writing an output or error line.

Validation follows OpenAI's: every line a JSON object ``{custom_id, method: "POST", url, body}``, the
``custom_id`` a unique string, the ``url`` the batch's endpoint. The first problems are reported with the line
they are on, and the batch fails as a whole (no line runs).

Memory stays bounded whatever the file holds: it is read in blocks, a line longer than ``max_line_bytes`` (the
gateway's ``server.max_body_bytes``, the bound a live request's body has) is refused without being held, so
the parser only ever sees one bounded line (a line of nested ``{}`` grows about 30x when parsed: 1 MiB
becomes ~30 MB, never the whole file's 20-30x), and custom_ids are remembered by a 16-byte digest. The caller
runs it on a thread of its own: it holds no store connection, and every line releases the GIL between parses.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from gateway.endpoints import BY_PATH

ENDPOINTS = tuple(BY_PATH)
MAX_REPORTED = 20  # errors listed on a failed batch; the rest are counted
BLOCK = 1024 * 1024  # read size


@dataclass(frozen=True, slots=True)
class Line:
    line_no: int  # 1-based, as in the input file
    custom_id: str
    body: bytes  # the request body, re-serialised at validation


def raw_lines(f: IO[bytes], max_line_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(1-based number, the line without its newline) for each line; None in place of a line longer than
    ``max_line_bytes``, which is skipped block by block without ever being held whole."""
    number, pending, too_long = 0, bytearray(), False
    while block := f.read(BLOCK):
        start = 0
        while (end := block.find(b"\n", start)) >= 0:
            number += 1
            if too_long or len(pending) + end - start > max_line_bytes:
                yield number, None
            else:
                yield number, bytes(pending) + block[start:end]
            pending.clear()
            too_long = False
            start = end + 1
        if not too_long:
            pending += block[start:]
            if len(pending) > max_line_bytes:
                pending.clear()
                too_long = True
    if pending or too_long:
        yield number + 1, None if too_long else bytes(pending)


def check(path: Path, endpoint: str, max_lines: int, max_line_bytes: int
          ) -> tuple[int, list[dict[str, Any]]]:
    """Count the requests in an input file, or find the errors that fail it (each names its 1-based line)."""
    errors: list[dict[str, Any]] = []
    hidden = 0

    def problem(number: int | None, code: str, message: str, param: str | None = None) -> None:
        nonlocal hidden
        if len(errors) < MAX_REPORTED:
            errors.append({"code": code, "message": message, "param": param, "line": number})
        else:
            hidden += 1

    count = 0
    for _, line in lines(path, endpoint, max_line_bytes, max_lines, problem):
        count += line is not None
    if hidden:
        errors.append({"code": "more_errors", "message": f"{hidden} more errors are not listed.", "param": None,
                       "line": None})
    if not count and not errors:
        errors.append({"code": "empty_file", "message": "The input file has no requests.", "param": None,
                       "line": None})
    return count, errors


def valid_lines(path: Path, endpoint: str, max_lines: int, max_line_bytes: int) -> Iterator[Line]:
    """The lines of a file ``check`` passed, one at a time."""
    def never(*_: Any) -> None:
        raise ValueError("the file changed since it was checked")
    for _, line in lines(path, endpoint, max_line_bytes, max_lines, never):
        if line is not None:
            yield line


def lines(path: Path, endpoint: str, max_line_bytes: int, max_lines: int, problem: Any
          ) -> Iterator[tuple[int, Line | None]]:
    seen: set[bytes] = set()
    count = 0
    with path.open("rb") as f:
        for number, raw in raw_lines(f, max_line_bytes):
            if raw is None:
                problem(number, "line_too_large", f"A line is at most {max_line_bytes} bytes.")
                continue
            if not raw.strip():
                continue
            if count >= max_lines:
                problem(number, "too_many_requests", f"A batch holds at most {max_lines} requests.")
                return
            try:
                item = orjson.loads(raw)
            except orjson.JSONDecodeError:
                problem(number, "invalid_json_line", "This line is not valid JSON.")
                continue
            if not isinstance(item, dict):
                problem(number, "invalid_json_line", "Each line must be a JSON object.")
                continue
            custom_id, method, url, body = (item.get(k) for k in ("custom_id", "method", "url", "body"))
            digest = hashlib.blake2b(custom_id.encode(), digest_size=16).digest() \
                if isinstance(custom_id, str) else b""
            if not isinstance(custom_id, str) or not custom_id:
                problem(number, "missing_required_parameter", "custom_id must be a non-empty string.", "custom_id")
            elif digest in seen:
                problem(number, "duplicate_custom_id", f"custom_id '{custom_id[:64]}' appears more than once.",
                        "custom_id")
            elif method != "POST":
                problem(number, "invalid_method", "method must be POST.", "method")
            elif url != endpoint:
                problem(number, "mismatched_url", f"url must be the batch's endpoint, {endpoint}.", "url")
            elif not isinstance(body, dict):
                problem(number, "invalid_body", "body must be a JSON object.", "body")
            elif body.get("stream"):
                problem(number, "invalid_body", "Streaming is not supported in a batch.", "body.stream")
            else:
                try:
                    forwarded = orjson.dumps(body)
                except orjson.JSONEncodeError:  # nested deeper than a request may be (255 levels)
                    problem(number, "invalid_body", "body is nested too deeply.", "body")
                    continue
                seen.add(digest)
                count += 1
                yield number, Line(number, custom_id, forwarded)
                continue
            yield number, None


@dataclass(frozen=True, slots=True)
class Usage:
    """A line's tokens, which the batch object's ``usage`` sums: its request's counts as the ledger has them
    (input, of which cached, and output), and the reasoning tokens the worker reported among the output."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    @classmethod
    def of(cls, prompt: int | None, cached: int | None, completion: int | None, answer: Any) -> Usage:
        """From a line's counted tokens (None: none counted) and its parsed answer; a detail is never more than
        the count it is part of (the worker is not trusted)."""
        inputs, outputs = prompt or 0, completion or 0
        return cls(inputs, min(cached or 0, inputs), outputs, min(_reasoning(answer), outputs))


def _reasoning(answer: Any) -> int:
    """The reasoning tokens in an answer's usage (completion_tokens_details, or the Responses API's
    output_tokens_details); 0 where it names none."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return 0
    details = usage.get("completion_tokens_details") or usage.get("output_tokens_details")
    value = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def parse_answer(body: bytes) -> Any:
    """An answer's body as an output line holds it: its JSON, or as text if it is not JSON; None if empty."""
    try:
        return orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")


def answered(custom_id: str, status: int, request_id: str, answer: Any) -> bytes:
    """The output (or error) line of a line the pipeline answered, with the answer's body (``parse_answer``)."""
    return orjson.dumps({"id": new_request_line_id(), "custom_id": custom_id,
                         "response": {"status_code": status, "request_id": request_id, "body": answer},
                         "error": None})


def unanswered(custom_id: str, code: str, message: str) -> bytes:
    """The error line of a line that never got an answer (the batch expired or was cancelled first)."""
    return orjson.dumps({"id": new_request_line_id(), "custom_id": custom_id, "response": None,
                         "error": {"code": code, "message": message}})


def new_request_line_id() -> str:
    return "batch_req_" + secrets.token_hex(12)
