"""What a request may be cached under: its API's question (eligibility and lookup text, read by the request's
endpoint) hashed into a scope and an exact key, and the lookup text's language.

The scope holds everything that must match before two answers are interchangeable: tenant, model,
system prompt, and the sampling parameters that change an answer. Nothing is ever looked up across
scopes, so one tenant never sees another's answers, nor an answer written for another system prompt.

Which requests may be cached is the tenant's cacheability (``TenantView.cache_answers``): ``any_temperature``
caches a request whatever its temperature, which then stays out of the scope (one answer per question);
``low_temperature`` only one at most ``cache.max_temperature``, under its temperature's tenth; ``off`` none.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.endpoints.base import Endpoint
from gateway.policy.loader import TenantView
from gateway.policy.schema import CacheAnswers, CachePolicy

_HANGUL = re.compile(r"[\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f]")
_CJK = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")
_LATIN = re.compile(r"[A-Za-z]")
_WORD = re.compile(r"[a-zà-ÿ]+")
_EN_HINTS = frozenset("the a an is are was what how why when where who which do does can i you to of in on for "
                      "with and or it this that my your be have".split())
_OTHER_LATIN_HINTS = {
    "fr": frozenset("le la les des est une un et que qui pour dans avec sur comment pourquoi quel quelle".split()),
    "de": frozenset("der die das ist ein eine und nicht wie warum was mit für auf ich du".split()),
    "es": frozenset("el la los las es un una y que por para con cómo como qué porque dónde".split()),
    "pt": frozenset("o a os as é um uma e que para com como por onde não você".split()),
    "it": frozenset("il lo la gli le è un una e che per con come perché dove non".split()),
}


@dataclass(frozen=True, slots=True)
class CacheKey:
    tenant: str
    model: str
    scope: str
    exact: str
    text: str
    language: str
    semantic: bool
    max_tokens: int


def detect_language(text: str) -> str:
    """Script first (Hangul, CJK), then common function words for Latin-script languages. (ASCII text, the
    common case, skips the script count: it is on every cacheable request's path.)"""
    if not text.isascii():
        letters = sum(ch.isalpha() for ch in text) or 1
        if len(_HANGUL.findall(text)) / letters > 0.2:
            return "ko"
        if len(_CJK.findall(text)) / letters > 0.2:
            return "zh-ja"
    if not _LATIN.search(text):
        return "other"
    words = set(_WORD.findall(text.lower()))
    scores = {"en": len(words & _EN_HINTS), **{lang: len(words & hints) for lang, hints in _OTHER_LATIN_HINTS.items()}}
    best = max(scores, key=lambda k: scores[k])
    return best if scores[best] > scores["en"] else "en"


def temperature_bucket(value: float) -> str:
    """The tenth a temperature falls in (0 apart): requests in one bucket share a scope."""
    return "0" if value == 0 else f"<={min(2.0, (int(value * 10) + 1) / 10):.1f}"


def cache_key(endpoint: Endpoint, body: dict[str, Any], tenant: TenantView, answers: CacheAnswers | bool,
              spec: CachePolicy, max_tokens: int) -> CacheKey | str:
    """The key for this request, or the reason it is not cached (a bypass). ``answers``: the tenant's
    cacheability for the body's model (``TenantView.cache_answers``; True reads as low_temperature, False as
    off). The request's API reads the question from the body (``Endpoint.question``); the scope and the exact key
    are its hashes, under the tenant, the model and the API's name."""
    if answers is True:
        answers = "low_temperature"
    if answers is False or answers == "off":
        return "tenant_opt_out"
    if answers == "low_temperature" and endpoint.samples:  # before the question is read: a hot one costs no parse
        sent = body.get("temperature")
        if (spec.default_temperature if sent is None else sent) > spec.max_temperature:
            return "temperature"
    question = endpoint.question(body, spec)
    if isinstance(question, str):
        return question
    params = question.params
    if question.temperature is not None and answers == "low_temperature":
        params = {**params, "temperature": temperature_bucket(question.temperature)}
    # the embedder's name too: vectors of two models are not comparable, and a policy that changes it starts afresh
    doc: dict[str, Any] = {"t": tenant.name, "m": body["model"], "e": endpoint.name, "p": params,
                           "v": spec.embedder.name}
    if question.system is not None:
        doc["s"] = question.system
    scope = hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]
    # The semantic layer compares the last question only; earlier turns must match exactly for it to be safe.
    if question.earlier is not None:
        scope = hashlib.sha256(scope.encode() + orjson.dumps(question.earlier)).hexdigest()[:32]
    exact = hashlib.sha256(scope.encode() + orjson.dumps(question.exact)).hexdigest()[:40]
    if not question.text:  # matched exactly only, and nothing generated to bound
        return CacheKey(tenant=tenant.name, model=body["model"], scope=scope, exact=exact, text="", language="",
                        semantic=False, max_tokens=0)
    language = detect_language(question.text)
    return CacheKey(tenant=tenant.name, model=body["model"], scope=scope, exact=exact, text=question.text,
                    language=language, semantic=language in spec.languages, max_tokens=max_tokens)
