"""Cost centres read from the X-Tollgate-Tags header, the body's metadata and its user (gateway.tags)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.tags import HEADER, MOST, derive


def refused(body: dict[str, Any], header: bytes | None = None) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        derive(body, header)
    return caught.value


def test_a_request_naming_none_has_no_tags() -> None:
    assert derive({"model": "m"}, None) is None
    assert derive({"metadata": None, "user": None}, None) is None, "null is OpenAI's 'not sent'"
    assert derive({"metadata": {}}, b"") is None
    assert derive({}, b" , ,") is None, "empty items of the header are no pairs"
    assert derive({"user": ""}, None) is None


def test_the_three_sources_make_one_canonical_string_sorted_by_key() -> None:
    body = {"metadata": {"project": "ranker"}, "user": "u-17"}
    assert derive(body, b"Cost_Center = search") == "cost_center=search,project=ranker,user=u-17"
    assert derive({}, b"b=2,a=1, c=3 ") == "a=1,b=2,c=3"
    assert derive({"metadata": {"Team": "Search Team"}}, None) == "team=Search Team", "inner spaces are kept"
    assert derive({}, "project=검색".encode()) == "project=검색", "a printable value in any script"


def test_the_header_wins_over_metadata_and_metadata_over_user() -> None:
    body = {"metadata": {"project": "from-metadata", "user": "meta-user"}, "user": "body-user"}
    assert derive(body, b"project=from-header") == "project=from-header,user=meta-user"
    assert derive({"metadata": {"project": "p"}, "user": "body-user"}, None) == "project=p,user=body-user"


def test_at_most_eight_pairs_are_kept_header_first_then_metadata_in_key_order() -> None:
    metadata = {f"m{i:02d}": "x" for i in range(16)}
    header = b",".join(f"h{i}=y".encode() for i in range(6))
    kept = derive({"metadata": metadata, "user": "u"}, header)
    assert kept is not None and kept.split(",") == sorted([f"h{i}=y" for i in range(6)] + ["m00=x", "m01=x"])
    assert len(kept.split(",")) == MOST
    only_metadata = derive({"metadata": metadata, "user": "u"}, None)
    assert only_metadata == ",".join(f"m{i:02d}=x" for i in range(8)), "user had no room"
    seven = derive({"metadata": {f"k{i}": "v" for i in range(7)}, "user": "u"}, None)
    assert seven is not None and seven.endswith(",user=u"), "an eighth place is user's"


def test_over_long_values_are_cut_to_64_characters() -> None:
    assert derive({}, b"project=" + b"p" * 200) == "project=" + "p" * 64
    assert derive({"metadata": {"project": "q" * 512}}, None) == "project=" + "q" * 64
    assert derive({"user": "u" * 300}, None) == "user=" + "u" * 64
    assert derive({}, b"a=" + b"x" * 63 + b" tail") == "a=" + "x" * 63, "no trailing space after the cut"


@pytest.mark.parametrize("header, says", [
    (b"project", "key=value"),
    (b"project=a=b", "','"),
    (b"=value", "tag key"),
    (b"-lead=x", "tag key"),
    (b"has space=x", "tag key"),
    (b"k" * 33 + b"=x", "tag key"),
    (b"project=", "empty value"),
    (b"project=a\x01b", "control character"),
    (b"project=a\tb", "control character"),
    (b"project=a\xe2\x80\xaeb", "control character"),  # U+202E, right-to-left override
    (b"a=1, A=2", "twice"),
    (b"project=\xff", "UTF-8"),
    (b",".join(f"k{i}=v".encode() for i in range(MOST + 1)), f"at most {MOST} pairs"),
    (b",".join(f"k{i}=v".encode() for i in range(100)), f"at most {MOST} pairs"),
    (b"project=" + b"x" * 10_240, "bytes"),
])
def test_a_header_that_breaks_the_rules_is_a_400_naming_it(header: bytes, says: str) -> None:
    error = refused({}, header)
    assert error.param == HEADER and error.code == "invalid_tags" and says in error.message, error.message
    assert len(error.message) < 200, "the client's value is echoed cut short"


@pytest.mark.parametrize("metadata, param, code", [
    ("team=a", "metadata", "invalid_type"),
    (["team", "a"], "metadata", "invalid_type"),
    ({"team": 7}, "metadata.team", "invalid_type"),
    ({"team": None}, "metadata.team", "invalid_type"),
    ({"team": {"nested": "x"}}, "metadata.team", "invalid_type"),
    ({f"k{i}": "v" for i in range(17)}, "metadata", "invalid_metadata"),
    ({"k" * 65: "v"}, "metadata", "invalid_metadata"),
    ({"team": "v" * 513}, "metadata.team", "invalid_metadata"),
    ({"Trace Id": "v"}, "metadata.Trace Id", "invalid_metadata"),
    ({"team": "a,b"}, "metadata.team", "invalid_metadata"),
    ({"team": "line\nbreak"}, "metadata.team", "invalid_metadata"),
    ({"team": "  "}, "metadata.team", "invalid_metadata"),
    ({"Team": "a", "team": "b"}, "metadata.team", "invalid_metadata"),
])
def test_metadata_that_breaks_the_rules_is_a_400_naming_the_param(metadata: Any, param: str, code: str) -> None:
    error = refused({"metadata": metadata})
    assert (error.param, error.code) == (param, code), error.message


def test_user_is_sanitised_not_refused_unless_it_is_no_string() -> None:
    assert derive({"user": "dXNlcg=="}, None) == "user=dXNlcg__", "a base64 id's padding"
    assert derive({"user": "Smith, John\n"}, None) == "user=Smith_ John"
    assert derive({"user": "a\x00b"}, None) == "user=a_b"
    for user in (17, ["u"], {"id": "u"}, True):
        error = refused({"user": user})
        assert (error.param, error.code) == ("user", "invalid_type")


def test_the_canonical_string_reads_back_as_its_pairs() -> None:
    """Whatever the sources held, the recorded string splits back into the pairs kept: no value carries a ','
    or '=' (which would make another pair), and no key starts a spreadsheet formula."""
    kept = derive({"metadata": {"a.b-c_d": "x + y @ z"}, "user": "=cmd|' /C calc'!A0,"}, b"Z9=ok")
    assert kept == "a.b-c_d=x + y @ z,user=_cmd|' /C calc'!A0_,z9=ok"
    assert all(len(pair.split("=")) == 2 for pair in kept.split(","))
