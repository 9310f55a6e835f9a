"""The finance pages' words: the language a request asks for, the Korean catalogue's fields matching the English
ones, the currency named where "USD" stands, and keys named as finance reads them (gateway.finance.labels)."""

from __future__ import annotations

import string
from dataclasses import replace
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.finance import labels, money, words


@pytest.mark.parametrize(("asked", "accept", "chosen"), [
    (None, None, "en"), (None, "ko-KR,ko;q=0.9,en-US;q=0.8,en;q=0.7", "ko"), (None, "en-GB,en;q=0.9,ko;q=0.5", "en"),
    (None, "fr-FR,ko;q=0.3", "ko"), (None, "ko;q=0.2,en;q=0.8", "en"), (None, "ko;q=abc", "en"),
    ("ko", "en", "ko"), ("en", "ko", "en")])
def test_the_language_is_the_query_s_then_the_best_accepted_then_english(asked: str | None, accept: str | None,
                                                                           chosen: str) -> None:
    assert words.choose(asked, accept) == chosen


@given(accept=st.text(max_size=300))
def test_any_accept_language_chooses_a_language_and_never_fails(accept: str) -> None:
    assert words.choose(None, accept) in words.LANGS


def test_a_language_it_does_not_speak_is_a_400_naming_lang() -> None:
    with pytest.raises(InvalidRequest) as refused:
        words.choose("fr", None)
    assert refused.value.param == "lang" and "en, ko" in refused.value.message


@pytest.mark.parametrize("english", sorted(words.KO))
def test_each_korean_text_takes_the_same_fields_as_its_english(english: str) -> None:
    def fields(text: str) -> set[str]:
        return {name for _, name, _, _ in string.Formatter().parse(text) if name}
    assert fields(words.KO[english]) == fields(english)


def test_the_currency_shown_is_named_where_usd_stands_but_not_in_a_field() -> None:
    won = replace(money.KRW, per_usd=Decimal("1385.5"))
    with words.speaking("ko"), money.shown_in(won):
        assert words.say("Spend (USD)") == "지출 (KRW)"
        assert "1 USD당" in words.say("Amounts in {code}, converted from the ledger's {usd} at {rate} {code} per "
                                      "{usd} (the rate in force on {day}).", code="KRW", rate="1,385.5",
                                      day="2020-01-01", usd="USD")
        assert money.amount(0.207766759) == "288"
    assert words.say("Spend (USD)") == "Spend (USD)" and money.amount(0.207766759) == "0.21", "reset after"


def test_keys_are_named_as_created_and_the_audit_key_as_the_cache_s_check() -> None:
    keys = {"key-0123456789ab": labels.Key("key-0123456789ab", "demo", "search-prod", "active", "month", 5.0),
            "key-ffffffffffff": labels.Key("key-ffffffffffff", "demo", "", "revoked", "day", 1.0)}
    assert labels.name_of("key-0123456789ab", keys) == "search-prod (key-0123456789ab)"
    assert labels.name_of("key-ffffffffffff", keys) == "(unnamed) key-ffffffffffff"
    assert labels.name_of("key-aaaaaaaaaaaa", keys) == "(a key of the policy file) key-aaaaaaaaaaaa"
    assert labels.name_of(labels.AUDIT_KEY, keys) == "Cache audit (cache-audit)"
    assert labels.name_of(None, keys) == "(no key)"
    assert [k.id for k in labels.budgeted(keys, None)] == ["key-0123456789ab"], "a revoked key's budget is gone"
    with words.speaking("ko"):
        assert labels.name_of(labels.AUDIT_KEY, keys) == "캐시 감사 (cache-audit)"
