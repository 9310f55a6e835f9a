"""What a request may be cached under: eligibility, scope, the exact key and the lookup text.

The scope holds everything that must match before two answers are interchangeable: tenant, model,
system prompt, and the sampling parameters that change an answer. Nothing is ever looked up across
scopes, so one tenant never sees another's answers, nor an answer written for another system prompt.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.policy.loader import TenantView
from gateway.policy.schema import CachePolicy

# Parameters that change what the answer is (max_tokens is checked against each entry instead).
_ANSWER_PARAMS = ("top_p", "top_k", "min_p", "seed", "stop", "response_format", "presence_penalty",
                  "frequency_penalty", "repetition_penalty", "logit_bias", "guided_json", "guided_regex",
                  "guided_choice", "min_tokens", "ignore_eos")
_SPACE = re.compile(r"\s+")
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


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _norm(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def _temperature_bucket(value: object) -> str:
    if value is None:
        return "default"
    t = float(value)  # type: ignore[arg-type]
    return "0" if t == 0 else f"<={min(2.0, (int(t * 10) + 1) / 10):.1f}"


_EMBEDDING_PARAMS = ("encoding_format", "dimensions", "truncate_prompt_tokens", "normalize")


def _embedding_key(body: dict[str, Any], tenant: TenantView) -> CacheKey:
    """Embeddings are the same for the same input, model and parameters: an exact key only (there is no
    question to compare by meaning)."""
    params = {name: body[name] for name in _EMBEDDING_PARAMS if body.get(name) is not None}
    scope_doc = orjson.dumps({"t": tenant.name, "m": body["model"], "e": "embeddings", "p": params},
                             option=orjson.OPT_SORT_KEYS)
    scope = hashlib.sha256(scope_doc).hexdigest()[:32]
    exact = hashlib.sha256(scope.encode() + orjson.dumps(body["input"])).hexdigest()[:40]
    return CacheKey(tenant=tenant.name, model=body["model"], scope=scope, exact=exact, text="", language="",
                    semantic=False, max_tokens=0)


def cache_key(endpoint: str, body: dict[str, Any], tenant: TenantView, tenant_opted_in: bool,
              spec: CachePolicy, max_tokens: int) -> CacheKey | str:
    """The key for this request, or the reason it is not cached (a bypass)."""
    if not tenant_opted_in:
        return "tenant_opt_out"
    if endpoint == "embeddings":
        return _embedding_key(body, tenant)
    if endpoint not in ("chat", "completions"):
        return "endpoint"  # a Responses API answer may hold state on its worker: not cached
    if body.get("n", 1) != 1:
        return "n_gt_1"
    if body.get("logprobs") or body.get("echo"):
        return "logprobs"
    temperature = body.get("temperature")
    if temperature is not None and temperature > spec.max_temperature:
        return "temperature"
    if not spec.tools and (body.get("tools") or body.get("functions")):
        return "tools"
    if endpoint == "chat":
        messages = body["messages"]
        system = [_norm(_text(m.get("content"))) for m in messages if m.get("role") in ("system", "developer")]
        turns = [m for m in messages if m.get("role") not in ("system", "developer")]
        users = [m for m in turns if m.get("role") == "user"]
        if not users or turns[-1].get("role") != "user":
            return "not_a_question"
        if len(users) > 1 and not spec.multi_turn:
            return "multi_turn"
        if spec.lookup_text == "last_user":
            text = _norm(_text(users[-1].get("content")))
        else:
            text = _norm(" ".join(_text(m.get("content")) for m in users))
        history = [(m.get("role"), _norm(_text(m.get("content")))) for m in turns]
        earlier_turns = len(turns) > 1
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return "prompt_not_text"
        system, text, history, earlier_turns = [], _norm(prompt), [("prompt", _norm(prompt))], False
    if not text:
        return "empty"
    params = {name: body[name] for name in _ANSWER_PARAMS if body.get(name) is not None}
    params["temperature"] = _temperature_bucket(temperature)
    if body.get("tools"):
        params["tools"] = body["tools"]
    scope_doc = orjson.dumps({"t": tenant.name, "m": body["model"], "e": endpoint, "s": system, "p": params},
                             option=orjson.OPT_SORT_KEYS)
    scope = hashlib.sha256(scope_doc).hexdigest()[:32]
    # The semantic layer compares the last question only; earlier turns must match exactly for it to be safe.
    if earlier_turns:
        scope = hashlib.sha256(scope.encode() + orjson.dumps(history[:-1])).hexdigest()[:32]
    exact = hashlib.sha256(scope.encode() + orjson.dumps(history)).hexdigest()[:40]
    language = detect_language(text)
    return CacheKey(tenant=tenant.name, model=body["model"], scope=scope, exact=exact, text=text,
                    language=language, semantic=language in spec.semantic_languages, max_tokens=max_tokens)
