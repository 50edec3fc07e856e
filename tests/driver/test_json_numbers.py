"""json_numbers: a Decimal is written as its every digit, everything else as json.dumps writes it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from pgtick import json_numbers

#: A document with a Decimal in it, and the same with that number as a float of the same text.
WITH_DECIMAL: Any = {
    "b": [1, Decimal("0.5"), "\u62a5\u544a", None, True, {}, [], (2, 3)],
    "a": {"x": {"y": [Decimal("-2.25"), 1.5]}, 7: "seven", None: False},
    "\u00e9": "caf\u00e9 \u009b",
    "when": datetime(2026, 12, 6, tzinfo=UTC),
}
WITH_FLOAT: Any = json.loads(
    json.dumps(WITH_DECIMAL, default=lambda v: float(v) if isinstance(v, Decimal) else str(v))
)


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("ensure_ascii", [True, False])
@pytest.mark.parametrize("sort_keys", [False, True])
def test_a_document_with_a_decimal_is_laid_out_as_json_dumps_lays_it_out(
    indent: int | None, ensure_ascii: bool, sort_keys: bool
) -> None:
    options: dict[str, Any] = {"indent": indent, "ensure_ascii": ensure_ascii}
    value = WITH_DECIMAL if not sort_keys else {k: v for k, v in WITH_DECIMAL.items() if k != "a"}
    floats = WITH_FLOAT if not sort_keys else {k: v for k, v in WITH_FLOAT.items() if k != "a"}
    got = json_numbers.dumps(value, sort_keys=sort_keys, default=str, **options)
    assert got == json.dumps(floats, sort_keys=sort_keys, **options)


@pytest.mark.parametrize(
    "digits",
    [
        "12345678901234567890.123456789",
        "0.1000000000000000055511151231257827",
        "1.50",
        "0.0000001",
        "-0.000000000000000000012",
        "0.00",
        "-0.0",
    ],
)
def test_a_number_read_by_loads_is_written_back_digit_for_digit(digits: str) -> None:
    text = f'{{"n": {digits}, "i": 123456789012345678901234567890}}'
    value = json_numbers.loads(text)
    assert isinstance(value["n"], Decimal) and type(value["i"]) is int
    assert json_numbers.dumps(value) == text


def test_a_decimal_with_an_exponent_is_written_in_plain_notation_as_postgresql_writes_it() -> None:
    assert json_numbers.dumps([Decimal("1E+3"), Decimal("1.2E-5")]) == "[1000, 0.000012]"


def test_what_json_cannot_write_is_refused_as_json_dumps_refuses_it() -> None:
    with pytest.raises(TypeError, match="set"):
        json_numbers.dumps([Decimal("1.5"), {1, 2}])
    with pytest.raises(TypeError, match="set"):
        json_numbers.dumps([1.5, {1, 2}])
