"""Reading the usage off a stream's events on the way to the client, and the usage-event shapes they share."""

from __future__ import annotations

import re

from gateway import sse
from gateway.endpoints.base import Tapped

# A chunk's usage object (one level of nesting: prompt_tokens_details), with the comma that joins it to the rest.
_USAGE_VALUE = rb'(\{(?:[^{}]|\{[^{}]*\})*\}|null)'
USAGE = re.compile(rb',"usage":' + _USAGE_VALUE + rb'|"usage":' + _USAGE_VALUE + rb',?')
_LAST_MEMBER = b',"usage":'


class UsageTap:
    """Reads the usage off the events going by and shapes it as the client asked (chat and completions).

    The gateway always asks the worker for usage on every chunk (continuous usage), so a stream cut at any point
    still tells how many tokens it carried. A client that did not ask for that gets chunks without it, and the
    final usage-only event only if it asked for ``include_usage``.

    Cost per chunk matters (a stream has hundreds): in the shape vLLM writes, one event per read with the usage as
    the chunk's last member, a read costs two byte searches and a slice; the usage is parsed once, at the end.
    Anything else takes the general path (split the events, one regex each)."""

    __slots__ = ("keep_continuous", "keep_final", "relayed")

    def __init__(self, relayed: Tapped, keep_final: bool, keep_continuous: bool) -> None:
        self.relayed = relayed
        self.keep_final = keep_final
        self.keep_continuous = keep_continuous

    def __call__(self, events: bytes) -> bytes:
        relayed = self.relayed
        at = events.rfind(_LAST_MEMBER)
        if at < 0:
            if b'"usage"' in events:
                return self._general(events)
            relayed.events += events.count(b'"choices":[{')
            return events
        # one event (no boundary before the usage), a token chunk (not the final usage-only one), usage last
        if events.endswith(b"}\n\n") and events.find(b"\n\n", 0, at) < 0 and \
                events.find(b'"choices":[{', 0, at) > 0:
            raw = events[at + 9:-3]
            if raw[:1] == b"{" and b'},"' not in raw and b"\n" not in raw:
                relayed.usage_raw = raw
                relayed.events += 1
                return events if self.keep_continuous else events[:at] + b"}\n\n"
        return self._general(events)

    def _general(self, events: bytes) -> bytes:
        relayed = self.relayed
        kept = []
        for event in sse.split_events(events):
            matches = USAGE.findall(event) if b'"usage"' in event else None
            if not matches:
                kept.append(event + b"\n\n")
                relayed.events += event.count(b'"choices":[{')
                continue
            value = matches[-1][0] or matches[-1][1]
            if value != b"null":
                relayed.usage_raw = value
            if b'"choices":[]' in event:  # the final usage-only event
                if self.keep_final:
                    kept.append(event + b"\n\n")
                continue
            relayed.events += 1
            kept.append((event if self.keep_continuous else USAGE.sub(b"", event)) + b"\n\n")
        return b"".join(kept)
