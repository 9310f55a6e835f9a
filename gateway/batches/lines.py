"""The batch JSONL formats: checking an input file's lines, and writing an output or error line.

Validation follows OpenAI's: every line a JSON object ``{custom_id, method: "POST", url, body}``, the
``custom_id`` a unique string, the ``url`` the batch's endpoint. The first problems are reported with the line
they are on, and the batch fails as a whole (no line runs). Runs on a thread: it parses the whole file.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.openai_api import PATHS

ENDPOINTS = tuple(PATHS.values())
MAX_REPORTED = 20  # errors listed on a failed batch; the rest are counted


@dataclass(frozen=True, slots=True)
class Line:
    line_no: int  # 1-based, as in the input file
    custom_id: str
    body: bytes  # the request body, re-serialised at validation


def validate(path: Path, endpoint: str, max_lines: int) -> tuple[list[Line], list[dict[str, Any]]]:
    """The lines of an input file, or the errors that fail it (each names its 1-based line)."""
    lines: list[Line] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    hidden = 0

    def problem(number: int | None, code: str, message: str, param: str | None = None) -> None:
        nonlocal hidden
        if len(errors) < MAX_REPORTED:
            errors.append({"code": code, "message": message, "param": param, "line": number})
        else:
            hidden += 1

    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            if len(lines) >= max_lines:
                problem(number, "too_many_requests", f"A batch holds at most {max_lines} requests.")
                break
            try:
                item = orjson.loads(raw)
            except orjson.JSONDecodeError:
                problem(number, "invalid_json_line", "This line is not valid JSON.")
                continue
            if not isinstance(item, dict):
                problem(number, "invalid_json_line", "Each line must be a JSON object.")
                continue
            custom_id, method, url, body = (item.get(k) for k in ("custom_id", "method", "url", "body"))
            if not isinstance(custom_id, str) or not custom_id:
                problem(number, "missing_required_parameter", "custom_id must be a non-empty string.", "custom_id")
            elif custom_id in seen:
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
                seen.add(custom_id)
                lines.append(Line(number, custom_id, orjson.dumps(body)))
    if hidden:
        errors.append({"code": "more_errors", "message": f"{hidden} more errors are not listed.", "param": None,
                       "line": None})
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "The input file has no requests.", "param": None,
                       "line": None})
    return lines, errors


def answered(custom_id: str, status: int, request_id: str, body: bytes) -> bytes:
    """The output (or error) line of a line the pipeline answered, with the answer's JSON body."""
    try:
        parsed: Any = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        parsed = body.decode("utf-8", "replace")
    return orjson.dumps({"id": new_request_line_id(), "custom_id": custom_id,
                         "response": {"status_code": status, "request_id": request_id, "body": parsed},
                         "error": None})


def unanswered(custom_id: str, code: str, message: str) -> bytes:
    """The error line of a line that never got an answer (the batch expired or was cancelled first)."""
    return orjson.dumps({"id": new_request_line_id(), "custom_id": custom_id, "response": None,
                         "error": {"code": code, "message": message}})


def new_request_line_id() -> str:
    return "batch_req_" + secrets.token_hex(12)
