"""Query strings as docs/api.md 1.1 reads them: ``+`` is a space, a repeated key keeps its FIRST
value, booleans are ``true``/``1``/``false``/``0``, integers base 10; anything else is 400
(never a silent default)."""

from __future__ import annotations

import re
from datetime import datetime
from urllib.parse import parse_qsl

from queen_mp.http.errors import InvalidRequest
from queen_mp.wire.binary_push import check_name
from queen_mp.wire.times import parse_iso

__all__ = ["Query"]

_TRUE = {"true", "1"}
_INTEGER = re.compile(r"-?[0-9]+")
_INT8_MIN, _INT8_MAX = -(1 << 63), (1 << 63) - 1
_FALSE = {"false", "0"}


class Query:
    def __init__(self, query_string: str) -> None:
        self._values: dict[str, str] = {}
        if "%" in query_string or "+" in query_string:
            for name, value in parse_qsl(query_string, keep_blank_values=True):
                self._values.setdefault(name, value)
            return
        # PERF(http): nothing to unquote (a pop's ``batch=100&wait=false``): what parse_qsl
        # makes of it, at a fifth of its cost (tests/unit/test_query.py compares the two).
        for field in query_string.split("&"):
            if field:
                name, _, value = field.partition("=")
                self._values.setdefault(name, value)

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def text(self, name: str, default: str | None = None) -> str | None:
        return self._values.get(name, default)

    def name(self, key: str, *, slash_ok: bool = False) -> str | None:
        """An optional name filter (queue, group, partition...); absent or empty = none."""
        value = self._values.get(key)
        if not value:
            return None
        check_name(value, key, slash_ok=slash_ok)
        return value

    def flag(self, name: str, default: bool) -> bool:
        raw = self._values.get(name)
        if raw is None:
            return default
        low = raw.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise InvalidRequest(f"query parameter {name}={raw!r} is not a boolean "
                             "(true, 1, false or 0)", field=name)

    def integer(self, name: str, default: int, *, minimum: int | None = None,
                maximum: int | None = None) -> int:
        """Below ``minimum`` is 400; above ``maximum`` (default: int8's) is clamped
        (docs/api.md 1.7)."""
        raw = self._values.get(name)
        if raw is None:
            return default
        if _INTEGER.fullmatch(raw) is None:
            raise InvalidRequest(f"query parameter {name}={raw[:40]!r} is not an integer",
                                 field=name)
        # NOTE(queen): int() refuses over 4300 digits (a 500) and no parameter reaches
        # PostgreSQL beyond int8: a longer number reads as just beyond int8, then clamps
        if len(raw.lstrip("-").lstrip("0")) > 19:
            value = -(1 << 64) if raw[0] == "-" else 1 << 64
        else:
            value = int(raw)
        if (minimum is not None and value < minimum) or value < _INT8_MIN:
            raise InvalidRequest(f"query parameter {name}={raw[:40]} is below "
                                 f"{_INT8_MIN if minimum is None else minimum}", field=name)
        return min(value, _INT8_MAX if maximum is None else maximum)

    def time(self, name: str) -> datetime | None:
        raw = self._values.get(name)
        if raw is None:
            return None
        try:
            return parse_iso(raw)
        except ValueError as ex:
            raise InvalidRequest(f"query parameter {name}: {ex}", field=name) from None
