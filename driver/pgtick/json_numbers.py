"""JSON whose numbers keep every digit, for what the CLI reads from jsonb and prints.

jsonb stores a number as a PostgreSQL ``numeric``: ``12345678901234567890.123456789`` or
``0.1000000000000000055511151231257827`` exactly, trailing zeros included (``1.50``).
``json.loads`` reads every number with a fraction or an exponent as a float, which keeps 17
significant digits: an amount printed back from a float is another amount. Here such a number
is read as a ``Decimal`` (an integer stays an ``int``, exact already) and a ``Decimal`` is
written back as the same digits, so a value goes from jsonb to the terminal, or from the
command line to jsonb, unchanged.

Only what prints a value reads this way (``read_exactly``: the CLI's connections, the
dashboard's queries of a run and a definition): job code and the client keep receiving
floats, which arithmetic with floats expects.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from psycopg.abc import AdaptContext
from psycopg.types.json import Jsonb, set_json_loads


def loads(text: str | bytes) -> Any:
    """JSON text as Python, numbers with a fraction or an exponent as ``Decimal``."""
    return json.loads(text, parse_float=Decimal)


def read_exactly(context: AdaptContext) -> None:
    """Make ``context`` (a connection or a cursor) read json and jsonb with ``loads``: every
    digit of a number kept."""
    set_json_loads(loads, context)


def jsonb(value: Any) -> Jsonb:
    """``value`` as a jsonb parameter, its ``Decimal`` numbers written with every digit."""
    return Jsonb(value, dumps=dumps)


class _HasDecimal(Exception):
    """Raised by the fast path of ``dumps`` on meeting a Decimal: write it the slow way."""


def _no_decimal(default: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    def fallback(value: Any) -> Any:
        if isinstance(value, Decimal):
            raise _HasDecimal
        if default is None:
            raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
        return default(value)

    return fallback


def dumps(
    value: Any,
    *,
    indent: int | None = None,
    ensure_ascii: bool = True,
    sort_keys: bool = False,
    default: Callable[[Any], Any] | None = None,
) -> str:
    """``json.dumps`` (same text for the same value), with each ``Decimal`` written as its
    exact number in plain notation (``Decimal('1.50')`` as ``1.50``, ``Decimal('1E+3')`` as
    ``1000``: as PostgreSQL writes a numeric). ``default`` is consulted for other types only."""
    try:  # most values hold no Decimal: json's own encoder, at its speed
        return json.dumps(
            value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys, default=_no_decimal(default)
        )
    except _HasDecimal:
        pass
    return _Writer(indent, ensure_ascii, sort_keys, default).write(value, 0)


class _Writer:
    """The JSON of a value holding ``Decimal`` numbers, laid out as ``json.dumps`` lays it out."""

    def __init__(
        self, indent: int | None, ensure_ascii: bool, sort_keys: bool, default: Callable[[Any], Any] | None
    ) -> None:
        self.indent = indent
        self.ensure_ascii = ensure_ascii
        self.sort_keys = sort_keys
        self.default = default

    def write(self, value: Any, level: int) -> str:
        if isinstance(value, Decimal):
            if value.is_finite():
                return format(value, "f")
            return json.dumps(float(value))  # NaN, Infinity: as json writes those floats
        if value is None or isinstance(value, str | int | float):
            return json.dumps(value, ensure_ascii=self.ensure_ascii)
        if isinstance(value, dict):
            items = sorted(value.items()) if self.sort_keys else list(value.items())
            parts = [f"{self._key(k)}: {self.write(v, level + 1)}" for k, v in items]
            return self._join("{", parts, "}", level)
        if isinstance(value, list | tuple):
            return self._join("[", [self.write(v, level + 1) for v in value], "]", level)
        if self.default is None:
            raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
        return self.write(self.default(value), level)

    def _key(self, key: Any) -> str:
        if isinstance(key, str):
            return json.dumps(key, ensure_ascii=self.ensure_ascii)
        if key is None or isinstance(key, int | float):  # as json.dumps turns them into strings
            return json.dumps(json.dumps(key))
        raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")

    def _join(self, opening: str, parts: list[str], closing: str, level: int) -> str:
        if not parts:
            return opening + closing
        if self.indent is None:
            return opening + ", ".join(parts) + closing
        inner = "\n" + " " * (self.indent * (level + 1))
        return opening + inner + ("," + inner).join(parts) + "\n" + " " * (self.indent * level) + closing
