"""The policy's YAML under hostile input, in-process: aliases that expand without bound or into themselves are
refused with a path, before anything is built; JSON takes the fast road; the watcher outlives a bad file."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import yaml

from gateway.policy import loader
from gateway.policy.loader import PolicyError, PolicyStore, load_yaml, parse_policy

DEFAULT = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


def bomb(depth: int) -> str:
    """The 2.7 KB billion-laughs shape, under a field the schema takes any mapping in."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, depth + 1):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + f"\nbomb: *a{depth}\n"


def test_an_alias_bomb_is_refused_before_it_expands() -> None:
    started = time.perf_counter()
    with pytest.raises(PolicyError) as refused:
        load_yaml(bomb(8))  # 9^9: 387 million values once expanded
    assert time.perf_counter() - started < 2.0
    assert "expands to over" in str(refused.value)
    assert load_yaml(bomb(3))["bomb"][0][0][0] == ["x"] * 9, "aliases within the bound still work"


def test_an_alias_that_refers_to_itself_is_refused() -> None:
    for text in ("a: &a [1, *a]\n", "a: &a {b: *a}\n"):
        with pytest.raises(PolicyError) as refused:
            parse_policy(text)
        assert "refers to the value that contains it" in str(refused.value)


def test_json_and_yaml_read_the_same(tmp_path: Path) -> None:
    import json
    data = yaml.safe_load(DEFAULT.read_text())
    assert parse_policy(json.dumps(data, default=str)) == parse_policy(DEFAULT.read_text())
    with pytest.raises(PolicyError):
        parse_policy("x" * (loader.MAX_POLICY_BYTES + 1))


def test_the_watcher_outlives_a_file_that_makes_the_reload_fail(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad file (even one that raised something no reload expected) is recorded; the next good file loads."""
    path = tmp_path / "policy.yaml"
    path.write_text(DEFAULT.read_text())
    store = PolicyStore.from_file(path)
    real = loader.parse_elsewhere

    async def exploding(text: str, source: str) -> object:
        if "EXPLODE" in text:
            raise RecursionError("deep")
        return await real(text, source)
    monkeypatch.setattr(loader, "parse_elsewhere", exploding)

    async def main() -> None:
        watch = asyncio.ensure_future(store.watch(interval=0.01))
        try:
            for bad in ("a: &a [1, *a]\n", DEFAULT.read_text() + "\n# EXPLODE\n"):
                failed = store.reloads_failed
                path.write_text(bad)
                while store.reloads_failed == failed:
                    await asyncio.sleep(0.01)
                assert store.last_error and not watch.done()
            path.write_text(DEFAULT.read_text().replace("tg-", "tg-", 1) + "\n# good again\n")
            ok = store.reloads_ok
            while store.reloads_ok == ok:
                await asyncio.sleep(0.01)
            assert store.last_error is None
        finally:
            watch.cancel()
    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_large_policy_is_parsed_in_a_child_process_with_the_same_result() -> None:
    """Over ELSEWHERE_OVER the parse runs in another process; the snapshot (and its errors) are the same."""
    text = DEFAULT.read_text() + "\n# " + "x" * (loader.ELSEWHERE_OVER + 10) + "\n"
    here = loader.PolicySnapshot.build(parse_policy(text), "here")
    there = asyncio.run(loader.parse_elsewhere(text, "there"))
    assert there.policy == here.policy and there.digest == here.digest
    with pytest.raises(PolicyError) as refused:
        asyncio.run(loader.parse_elsewhere(text.replace("tier: premium", "tier: platinum", 1), "bad"))
    assert "tier" in str(refused.value)


def with_second_tier(text: str) -> tuple[str, int, int]:
    """The policy with a second ``tier:`` line for tenant demo: (text, line of the first, line of the second)."""
    first = "    tier: standard\n"
    assert text.count(first) == 1
    text = text.replace(first, first + "    tier: premium\n")
    line = text.splitlines().index(first.rstrip("\n")) + 1
    return text, line, line + 1


def test_a_key_given_twice_is_an_error_naming_both_lines() -> None:
    from tests.conftest import policy_dict

    nested, first, second = with_second_tier(yaml.safe_dump(policy_dict(["http://127.0.0.1:9"])))
    with pytest.raises(PolicyError) as refused:
        parse_policy(nested)
    [(where, message)] = refused.value.errors
    assert where.startswith(f"line {second}, ") and "'tier' is given twice" in message
    assert f"on line {first} and line {second}" in message
    top = "version: 1\nallow_empty: true\nversion: 1\n"
    with pytest.raises(PolicyError, match="'version' is given twice in one mapping, on line 1 and line 3"):
        parse_policy(top)
    for text, key in [("a: {b: 1, b: 2}\n", "'b'"), ("a: {1: x, 0x1: y}\n", "'0x1'"),
                      ("a: {1: x, true: y}\n", "'true'"),
                      ('{"tenants": {"demo": {"tier": "standard",\n "tier": "premium"}}}', "'tier'"),
                      ("b: &b {x: 1}\nc: &c {y: 1}\nm: {<<: *b, <<: *c}\n", "'<<'")]:
        with pytest.raises(PolicyError, match=f"the key {key} is given twice"):
            load_yaml(text)
    merged = "base: &b {a: 1, c: 2}\nfirst: [{inner: &n {<<: *b, a: 5}}]\nlater: {<<: *n, c: 9}\n"
    assert load_yaml(merged)["first"] == [{"inner": {"a": 5, "c": 2}}], "overriding a merged key is no duplicate"
    assert load_yaml('{"a": {"b": 1}, "c": {"b": 2}}') == {"a": {"b": 1}, "c": {"b": 2}}, "one key per mapping"
    large = nested + "# " + "x" * (loader.ELSEWHERE_OVER + 10) + "\n"  # parsed in a child process
    with pytest.raises(PolicyError, match=f"on line {first} and line {second}"):
        asyncio.run(loader.parse_elsewhere(large, "large"))


def test_a_policy_nested_too_deeply_is_an_error_not_a_crash() -> None:
    for text in ("[" * 100_000 + "]" * 100_000, "{\"a\": " * 100_000, "a: " + "[" * 100_000):
        with pytest.raises(PolicyError, match="nested too deeply"):
            load_yaml(text)
