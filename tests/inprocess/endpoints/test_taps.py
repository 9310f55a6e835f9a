"""The chat and completions stream tap: the usage read off every chunk, and the chunks shaped as the client
asked (usage on each only if it asked, the final usage event only if it asked)."""

from __future__ import annotations

from gateway.endpoints import CHAT, COMPLETIONS
from gateway.endpoints.taps import UsageTap
from gateway.upstream.relay import Relayed

TOKEN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":3,' \
        b'"completion_tokens":1,"total_tokens":4}}\n\n'
BARE = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
FINAL = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'


def test_one_chunk_a_read_loses_its_usage_unless_the_client_asked_for_it() -> None:
    relayed = Relayed()
    tap = CHAT.tap(relayed, False, False)
    assert tap(TOKEN) == BARE
    assert relayed.events == 1 and relayed.usage == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    kept = Relayed()
    assert COMPLETIONS.tap(kept, True, True)(TOKEN) == TOKEN


def test_several_events_in_one_read_take_the_general_path() -> None:
    relayed = Relayed()
    assert CHAT.tap(relayed, False, False)(TOKEN + TOKEN + FINAL) == BARE + BARE, "no final event unasked"
    assert relayed.events == 2 and relayed.usage == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    asked = Relayed()
    assert CHAT.tap(asked, True, False)(TOKEN + FINAL) == BARE + FINAL


def test_a_chunk_without_usage_is_counted_and_passed_as_it_is() -> None:
    relayed = Relayed()
    assert CHAT.tap(relayed, False, False)(BARE + BARE) == BARE + BARE
    assert relayed.events == 2 and relayed.usage is None


def test_chat_and_completions_share_the_one_usage_tap() -> None:
    """Both generation APIs stream the same chunk shape, so one tap reads both (a second copy could drift)."""
    assert type(CHAT.tap(Relayed(), False, False)) is type(COMPLETIONS.tap(Relayed(), False, False)) is UsageTap
