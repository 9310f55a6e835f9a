"""The ledger's time text: ``times.at`` formats the date and time of day once a second and must still give, for
any Unix time and in any order of calls, exactly what formatting the whole ``datetime`` gives; the log lines' time
is the same text to the millisecond."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from gateway.ledger import times
from gateway.ops import logs

# 1970 to 2100, and times just around whole seconds and half microseconds, where rounding decides the second
moments = st.one_of(
    st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False),
    st.builds(lambda s, d: s + d, st.integers(0, 4_102_444_800).map(float),
              st.sampled_from([-5e-7, -1e-7, 0.0, 1e-7, 4.999e-7, 5e-7, 0.9999995, 0.99999951, 0.4999995])),
)


def whole(timestamp: float) -> str:
    return times.sortable(datetime.fromtimestamp(timestamp, UTC))


@given(st.lists(moments, min_size=1, max_size=20))
def test_each_time_reads_as_the_whole_datetime_formatted(stamps: list[float]) -> None:
    for stamp in stamps + sorted(stamps) + [stamps[0]]:  # a second met again after others: no stale text
        assert times.at(stamp) == whole(stamp)


@given(moments)
def test_a_log_line_time_is_the_same_text_to_the_millisecond(stamp: float) -> None:
    reference = datetime.fromtimestamp(stamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert logs.iso(stamp) == reference


def test_a_stale_second_would_be_caught() -> None:
    """The positive control: text kept from another second is not what the whole datetime gives."""
    times.at(1_767_225_600.5)
    saved = times._second
    try:
        times._second = (1_767_225_601, saved[1])  # a later second, holding the earlier one's text
        assert times.at(1_767_225_601.25) != whole(1_767_225_601.25)
    finally:
        times._second = saved
