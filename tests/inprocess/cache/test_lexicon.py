"""The verifier's word lists and the tables derived from them at import: a slip in one (a spelling given to two
units, an opposite missing its partner, a negation listed as filler) lets a near-miss through as a cache hit."""

from __future__ import annotations

from collections import Counter

from gateway.cache import lexicon


def test_every_unit_spelling_names_one_unit() -> None:
    spellings = Counter(s for spellings in lexicon.UNITS.values() for s in spellings)
    assert [s for s, n in spellings.items() if n > 1] == [], "UNIT_OF would keep only the last unit"
    assert all(lexicon.UNIT_OF[s] == unit for unit, spellings in lexicon.UNITS.items() for s in spellings)


def test_korean_units_are_matched_longest_first() -> None:
    """A glued Korean unit is matched by prefix: 킬로미터 must be tried before 킬로, or kilometres read as kilos."""
    units = lexicon.KO_UNITS
    assert units.index("킬로미터") < units.index("킬로") and units.index("킬로그램") < units.index("킬로")
    assert [len(u) for u in units] == sorted((len(u) for u in units), reverse=True)
    assert all(len(u) > 1 and "\uac00" <= u[0] <= "\ud7a3" for u in units)


def test_opposites_go_both_ways_and_are_never_synonyms() -> None:
    for a, b in lexicon.ANTONYMS:
        assert b in lexicon.OPPOSITE[a] and a in lexicon.OPPOSITE[b], (a, b)
        assert b not in lexicon.SYNONYM_OF.get(a, set()), f"{a}/{b} both opposite and interchangeable"
    assert lexicon.OPPOSITE["buy"] == {"sell"} and lexicon.OPPOSITE["add"] == {"remove", "delete"}


def test_polar_words_leave_out_the_ambiguous_and_the_phrases() -> None:
    assert {"start", "stop", "encrypt", "decrypt"} <= lexicon.POLAR
    assert not {"to", "from", "in", "on", "right", "like", "day"} & lexicon.POLAR, "ordinary words are not polar"
    assert all(" " not in word for word in lexicon.POLAR)


def test_words_that_change_an_answer_are_not_filler() -> None:
    """FILLER may be dropped freely; a negation, a time word or a number word dropped would change the question."""
    assert not lexicon.NEGATIONS & lexicon.FILLER
    assert not lexicon.TIME_WORDS & lexicon.FILLER
    assert not (set(lexicon.NUMBER_WORDS) - {"one"}) & lexicon.FILLER  # "one" as in "which one"


def test_quantifiers_claim_one_of_seven_things() -> None:
    """Korean tells "each" (각 행의 합계) from "all" (전체 합계), and marks "only" (하나만) with a particle."""
    assert set(lexicon.QUANTIFIERS.values()) == {"some", "all", "none", "most", "few", "each", "only"}
    assert (lexicon.QUANTIFIERS["any"], lexicon.QUANTIFIERS["every"], lexicon.QUANTIFIERS["모든"]) == \
        ("some", "all", "all")


def test_synonyms_are_grouped_both_ways() -> None:
    assert "purchase" in lexicon.SYNONYM_OF["buy"] and "buy" in lexicon.SYNONYM_OF["purchase"]
    assert all(word in lexicon.SYNONYM_OF[word] for group in lexicon.SYNONYMS for word in group)
