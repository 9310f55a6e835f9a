"""Cost centres: the tags a request is recorded under in the ledger (``ctx.tags``, the ledger's ``tags``).

One canonical string, "key=value" pairs sorted by key and joined by ",": "cost_center=search,project=ranker,
user=u-17", read by ``derive`` from three places:

- the ``X-Tollgate-Tags`` header, "k=v, k2=v2" (the gateway's own; a batch line has none);
- the body's ``metadata``, as OpenAI's API takes it: an object of at most 16 string keys of up to 64
  characters, with string values of up to 512;
- the body's ``user`` (OpenAI's end-user id), as ``user=<value>``.

The rules, and what breaking them costs:

- At most ``MOST`` (8) pairs are kept. The header wins over metadata, metadata over user: the header's pairs
  first (all of them: a header of more than 8 pairs is refused), then metadata's in key order, then user,
  each only for a key not taken yet, while there is room. The rest are not recorded (metadata may carry more
  than cost centres).
- A key is lowercased and must then be 1-32 of [a-z0-9_.-], starting with a letter or a digit (a ledger
  CSV cell never starts with '-', the start of a spreadsheet formula).
- A value has surrounding spaces stripped and must then be non-empty and printable (no control, format or
  line-separator characters), with no "," or "=" (they would change the pairs read back). A value over 64
  characters is cut to its first 64, from any source: metadata values may be 512, and a cost centre is named
  in far fewer.
- In the header or metadata, anything else that breaks a rule is refused with a 400 ``invalid_request_error``
  naming the param (``X-Tollgate-Tags``, or ``metadata`` / ``metadata.<key>``): a pair with no "=", an empty or
  repeated key, a header over ``HEADER_BYTES`` (1 KiB) or not UTF-8, and, as OpenAI refuses them, metadata that
  is not an object of strings within its limits. A request whose tags are refused is recorded with none.
- ``user`` is any string OpenAI takes (a non-string is refused, as OpenAI does), so it is sanitised instead:
  a "," "=" or unprintable character becomes "_" (a base64 id's padding is no reason to fail a request), and
  an empty one is no tag.

The body is forwarded upstream unchanged: vLLM's request models take ``metadata`` and ``user`` (the Responses
API declares both; chat, completions and embeddings declare ``user`` and allow extra fields, which they
ignore), so neither can fail a request there.

A request with none of the three pays two dict lookups (this is on every request's path).
"""

from __future__ import annotations

import re
from typing import Any

from gateway.endpoints.checks import echo
from gateway.errors import InvalidRequest

MOST = 8  # pairs kept
VALUE_CHARS = 64  # a value's characters kept
HEADER_BYTES = 1024  # an X-Tollgate-Tags header's most (8 full pairs take under 800)
HEADER = "X-Tollgate-Tags"
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's limits

_KEY = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")
_UNSAFE = re.compile(r"[,=]")


def derive(body: dict[str, Any], header: bytes | None) -> str | None:
    """The request's cost centres as the canonical string, or None when it names none; raises InvalidRequest
    where the header or the body breaks the rules above."""
    metadata, user = body.get("metadata"), body.get("user")
    if header is None and metadata is None and user is None:
        return None
    pairs = _from_header(header) if header is not None else {}
    if metadata is not None:
        for key, value in sorted(_from_metadata(metadata).items()):
            if len(pairs) >= MOST:
                break
            pairs.setdefault(key, value)
    if user is not None:
        value = _user(user)
        if value and len(pairs) < MOST:
            pairs.setdefault("user", value)
    return ",".join(f"{key}={pairs[key]}" for key in sorted(pairs)) or None


def _from_header(raw: bytes) -> dict[str, str]:
    if len(raw) > HEADER_BYTES:
        raise _bad_header(f"The {HEADER} header is at most {HEADER_BYTES} bytes.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad_header(f"The {HEADER} header must be UTF-8.") from None
    pairs: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, eq, value = item.partition("=")
        if not eq:
            raise _bad_header(f"The {HEADER} header holds key=value pairs, got '{echo(item.strip())}'.")
        key = _key(name.strip(), HEADER)
        if key in pairs:
            raise _bad_header(f"The {HEADER} header names '{key}' twice.")
        pairs[key] = _value(value, HEADER, key)
        if len(pairs) > MOST:
            raise _bad_header(f"The {HEADER} header holds at most {MOST} pairs.")
    return pairs


def _from_metadata(metadata: object) -> dict[str, str]:
    if not isinstance(metadata, dict):
        raise InvalidRequest(f"Invalid type for 'metadata': expected an object, got {_json_type(metadata)}.",
                             "invalid_type", param="metadata")
    if len(metadata) > METADATA_PAIRS:
        raise InvalidRequest(f"'metadata' holds at most {METADATA_PAIRS} pairs, got {len(metadata)}.",
                             "invalid_metadata", param="metadata")
    pairs: dict[str, str] = {}
    for name, value in metadata.items():  # JSON object keys are strings
        if len(name) > METADATA_KEY_CHARS:
            raise InvalidRequest(f"A 'metadata' key is at most {METADATA_KEY_CHARS} characters: "
                                 f"'{echo(name)}'.", "invalid_metadata", param="metadata")
        param = f"metadata.{name}"
        if not isinstance(value, str):
            raise InvalidRequest(f"Invalid type for '{echo(param)}': expected a string, got {_json_type(value)}.",
                                 "invalid_type", param=param)
        if len(value) > METADATA_VALUE_CHARS:
            raise InvalidRequest(f"'{echo(param)}' is at most {METADATA_VALUE_CHARS} characters.",
                                 "invalid_metadata", param=param)
        key = _key(name, param)
        if key in pairs:
            raise InvalidRequest(f"'metadata' names '{key}' twice (keys are read lowercased).", "invalid_metadata",
                                 param=param)
        pairs[key] = _value(value, param, key)
    return pairs


def _key(name: str, param: str) -> str:
    key = name.lower()
    if not _KEY.fullmatch(key):
        raise _bad(param, f"The tag key '{echo(name)}' must be 1-32 of a-z, 0-9, '_', '.' and '-', starting "
                          "with a letter or a digit.")
    return key


def _value(text: str, param: str, key: str) -> str:
    value = text.strip()
    if not value:
        raise _bad(param, f"The tag '{key}' has an empty value.")
    if not value.isprintable() or _UNSAFE.search(value):
        raise _bad(param, f"The tag '{key}' has a value with a control character, ',' or '='.")
    return value[:VALUE_CHARS].rstrip()


def _user(user: object) -> str:
    if not isinstance(user, str):
        raise InvalidRequest(f"Invalid type for 'user': expected a string, got {_json_type(user)}.",
                             "invalid_type", param="user")
    value = user.strip()[:VALUE_CHARS].rstrip()
    if value.isprintable() and not _UNSAFE.search(value):
        return value
    return "".join(c if c.isprintable() and c not in ",=" else "_" for c in value)


def _json_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object"}
    return names.get(type(value), "null" if value is None else type(value).__name__)


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, "invalid_metadata" if param.startswith("metadata") else "invalid_tags",
                          param=param)


def _bad_header(message: str) -> InvalidRequest:
    return InvalidRequest(message, "invalid_tags", param=HEADER)
