"""Wire times (api.md 1.3): UTC, milliseconds, ``Z``, whatever zone the datetime carries."""

from __future__ import annotations

import datetime as dt
import zoneinfo

from queen_mp.wire.times import iso_from_us, iso_ms, parse_iso


def test_iso_ms_is_utc_with_truncated_milliseconds() -> None:
    assert iso_ms(dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)) == \
        "2026-01-02T03:04:05.678Z"
    assert iso_ms(dt.datetime(2026, 1, 2, 3, 4, 5, 999999, tzinfo=dt.UTC)) == \
        "2026-01-02T03:04:05.999Z"
    assert iso_ms(dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)) == "2026-01-02T03:04:05.000Z"
    assert iso_ms(None) is None


def test_iso_ms_converts_other_zones() -> None:
    minus5 = dt.timezone(dt.timedelta(hours=-5))
    assert iso_ms(dt.datetime(2026, 1, 2, 22, 0, 0, 1000, tzinfo=minus5)) == \
        "2026-01-03T03:00:00.001Z"
    rome = zoneinfo.ZoneInfo("Europe/Rome")
    assert iso_ms(dt.datetime(2026, 7, 1, 12, 0, tzinfo=rome)) == "2026-07-01T10:00:00.000Z"


def test_equal_instants_in_different_zones_share_one_answer() -> None:
    """The cache keys on datetime equality, which is by instant: the answer is the same."""
    a = dt.datetime(2026, 3, 4, 5, 6, 7, 8000, tzinfo=dt.UTC)
    b = a.astimezone(dt.timezone(dt.timedelta(hours=9, minutes=30)))
    assert a == b and iso_ms(a) == iso_ms(b) == "2026-03-04T05:06:07.008Z"


def test_round_trips_through_parse_and_microseconds() -> None:
    t = parse_iso("2026-05-06T07:08:09.123+02:00")
    assert iso_ms(t) == "2026-05-06T05:08:09.123Z"
    assert iso_from_us(int(t.timestamp() * 1_000_000)) == "2026-05-06T05:08:09.123Z"
    assert iso_from_us(0) is None
