"""A deterministic stand-in tokenizer and text generator for the simulated worker.

Token counts must be exact and reproducible (billing, max-model-len checks and the
load tests all rely on them), but need not match any real vocabulary. A token is a
word with its leading whitespace, a punctuation mark, or a 10-character slice of a
longer word; chat messages are counted through a ChatML-like template. Whitespace
goes with what follows it, 16 characters at most (a longer run is tokens of its own,
as a real vocabulary's are): no token is longer than 26 characters, so a text's
size is bounded by its tokens (max_model_len bounds a prompt, max_tokens an answer).
"""

from __future__ import annotations

import hashlib
import random
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping

VOCAB_SIZE = 32_000
_PIECE = re.compile(r"\s{0,16}[^\W_]{1,10}|\s{0,16}[^\w\s]|\s{0,16}_|\s{1,16}")

# Special tokens a chat template adds: <|im_start|>role\n ... <|im_end|>\n
PER_MESSAGE_OVERHEAD = 4
GENERATION_PROMPT_TOKENS = 3

WORDS = (
    "the of and to in is that for it as with was on be at by this had not are but from or have an they which "
    "one you were her all she there would their we him been has when who will more no if out so said what up "
    "its about into than them can only other new some could time these two may then do first any my now such "
    "like our over man me even most made after also did many before must through back years where much your "
    "way well down should because each just those people how too little state good very make world still own "
    "see men work long get here between both life being under never day same another know while last might us "
    "great old year off come since against go came right used take three model token cache queue worker batch "
    "latency stream budget tenant policy route gateway prefill decode memory block kernel request answer"
).split()


def pieces(text: str) -> list[str]:
    """Split text into token pieces; ''.join(pieces(t)) == t."""
    return _PIECE.findall(text)


def stream_pieces(fragments: Iterable[str]) -> Iterator[str]:
    """The pieces of the text the fragments make, the same as ``pieces`` of their concatenation, given as the
    fragments come: a piece goes out once the next has begun (it can grow no more), so reading k pieces reads
    about k pieces of text, however much more the fragments would make."""
    carry = ""
    for fragment in fragments:
        held = None
        for match in _PIECE.finditer(carry + fragment):
            if held is not None:
                yield held
            held = match.group()
        carry = held or ""
    if carry:
        yield carry


def count_text(text: str) -> int:
    return len(_PIECE.findall(text))


def token_ids(text: str) -> list[int]:
    """Stable ids for /tokenize: crc32 of the piece, folded into the vocabulary."""
    return [zlib.crc32(p.encode()) % VOCAB_SIZE for p in _PIECE.findall(text)]


def decode_ids(ids: Iterable[int]) -> str:
    """Text for a prompt given as token ids: a vocabulary word per id, so it counts as exactly that many tokens
    (the ids are not the crc32 ids of /tokenize: those cannot be turned back into text)."""
    return "".join(" " + WORDS[i % len(WORDS)] for i in ids)


def chat_prompt_text(messages: Iterable[Mapping[str, object]]) -> str:
    """The text the engine sees for a chat request: what the seed of the output derives from."""
    return "\n".join(f"{m.get('role', '')}: {message_text(m.get('content'))}" for m in messages)


def count_chat(messages: Iterable[Mapping[str, object]]) -> int:
    total = GENERATION_PROMPT_TOKENS
    for message in messages:
        total += PER_MESSAGE_OVERHEAD + count_text(str(message.get("role", "")))
        total += count_text(message_text(message.get("content")))
    return total


def message_text(content: object) -> str:
    """Content is a string or a list of OpenAI content parts; only text parts count here."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def output_rng(seed: int, prompt_text: str) -> random.Random:
    """Output is a pure function of (seed, prompt): same request, same answer."""
    digest = hashlib.blake2b(prompt_text.encode(), digest_size=8, key=seed.to_bytes(8, "little", signed=True))
    return random.Random(int.from_bytes(digest.digest(), "little"))


COMMON = _COMMON = frozenset(WORDS)
TOPIC_SHARE = 1 / 3  # of an answer's tokens: a real model's answer repeats its question's words about this often


def topic(text: str) -> tuple[str, ...]:
    """The question's own words, as the answer may use them: each a single token (a word piece of up to 10
    letters, lower-cased, after one space), without the vocabulary's common words."""
    words = (piece.strip().lower() for piece in pieces(text))
    return tuple(dict.fromkeys(f" {w}" for w in words if w.isalpha() and w not in _COMMON
                               and len(w) >= (3 if w.isascii() else 2)))  # a Korean word is often two syllables


def meaning(prompt_text: str, asked: str, form: str) -> str:
    """What the answer is a function of: the prompt, with its question replaced by the question's canonical form
    (``workers.sim.canonical``), so that wordings of one question get one answer, as a model at temperature 0
    gives one; the rest of the prompt (a system message, earlier turns) as it is."""
    if not form or not asked:
        return prompt_text
    head, found, tail = prompt_text.rpartition(asked)
    return f"{head}{form}{tail}" if found else prompt_text


def next_piece(rng: random.Random, words: tuple[str, ...] = ()) -> str:
    """The next token: one of the question's words a third of the time (so an answer speaks of what was asked,
    and two answers to one question in other words share them), else a word of the vocabulary."""
    if words and rng.random() < TOPIC_SHARE:
        return words[int(rng.random() * len(words))]
    return " " + WORDS[int(rng.random() * len(WORDS))]
