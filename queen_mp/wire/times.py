"""Time on the wire (docs/api.md 1.3): answers in UTC with milliseconds and ``Z``; requests take
any ISO-8601 with ``Z`` or an offset."""

from __future__ import annotations

import datetime as dt
import functools

__all__ = ["iso_from_us", "iso_ms", "parse_iso"]


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)
#: the text up to the seconds of each whole second rendered lately ("YYYY-MM-DDTHH:MM:SS")
_SECONDS: dict[int, str] = {}
_SECONDS_KEPT = 4096


def iso_ms(t: dt.datetime | None) -> str | None:
    """PERF(wire): a pop answer formats one per segment it reads, each a new datetime (the
    row's) in the session's zone, so a cache of datetimes mostly missed (25k instructions
    a miss, its hash and isoformat); the milliseconds since the epoch are one subtraction,
    and the text up to the second is kept per second (segments of a pop share seconds)."""
    if t is None:
        return None
    if t.tzinfo is None:  # NOTE(wire): naive is local time, as astimezone reads it
        return t.astimezone(dt.UTC).isoformat(timespec="milliseconds")[:23] + "Z"
    second, milli = divmod((t - _EPOCH) // _MS, 1000)
    head = _SECONDS.get(second) or _second_text(second)
    return f"{head}.{milli:03d}Z"


def _second_text(second: int) -> str:
    """The text of ``second`` since the epoch up to its seconds, kept for the next ones."""
    if len(_SECONDS) >= _SECONDS_KEPT:
        _SECONDS.clear()
    head = _SECONDS[second] = (_EPOCH + dt.timedelta(seconds=second)).isoformat()[:19]
    return head


@functools.lru_cache(maxsize=4096)
def iso_from_us(us: int) -> str | None:
    """Unix microseconds (the push procedure's ``ts``); 0 = unknown.

    PERF(wire): every item of a segment shares its bundle's timestamp, so a 1,000-item answer
    formats a handful of distinct values; formatting was a quarter of a binary push's CPU.
    A 1-item push's answer has a new bundle time each (a cache miss): integer division, not
    a datetime made and subtracted from the epoch.
    """
    if not us:
        return None
    second, milli = divmod(us // 1000, 1000)
    head = _SECONDS.get(second) or _second_text(second)
    return f"{head}.{milli:03d}Z"


MIN_YEAR, MAX_YEAR = 1970, 9998


def parse_iso(text: str) -> dt.datetime:
    """ISO-8601 with a zone; a naive time is refused (ValueError): it would be ambiguous.

    Years outside 1970..9998 are refused too: nothing is stored before 1970, and at the edges
    of Python's range a default window ("the hour before `to`") or a UTC conversion overflows.
    """
    value = dt.datetime.fromisoformat(text.strip().replace("z", "Z"))
    if value.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone (add Z or an offset)")
    if not MIN_YEAR <= value.year <= MAX_YEAR:
        raise ValueError(f"{text!r} is outside years {MIN_YEAR}..{MAX_YEAR}")
    return value.astimezone(dt.UTC)
