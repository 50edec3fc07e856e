"""Numbers in payloads and results go between jsonb and the terminal with every digit.

jsonb keeps a number as a PostgreSQL numeric, exactly (an amount of 20 digits and 9
decimals, the 34 digits of 0.1 as a double holds it, the trailing zero of 1.50); read as a
Python float it would keep 17 significant digits, and print another amount. Each test
compares what the CLI prints or stores with PostgreSQL's own text of the value.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from harness import Conn, Database, claim, enqueue, scalar
from pgtick import cli

#: Numbers a float cannot hold, as PostgreSQL writes them, and an integer past 64 bits.
PAYLOAD = (
    '{"amount": 12345678901234567890.123456789, "rate": 0.1000000000000000055511151231257827,'
    ' "price": 1.50, "tiny": 0.0000001, "count": 123456789012345678901234567890, "ratio": 0.5}'
)
RESULT = '{"total": [98765432109876543210.987654321, -0.000000000000000000012], "paid": true}'
DIGITS = [
    "12345678901234567890.123456789",
    "0.1000000000000000055511151231257827",
    "1.50",
    "0.0000001",
    "123456789012345678901234567890",
    "98765432109876543210.987654321",
    "-0.000000000000000000012",
]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, f"pgtick {' '.join(args)} exited {code}: {err}"
    return out


def exact(text: str) -> Any:
    """JSON text with each number that is not an integer as its digits, as written
    (``("number", "1.50")``), to compare digit for digit: Decimal("1.5") == Decimal("1.50")."""
    return json.loads(text, parse_float=lambda digits: ("number", digits))


def stored(conn: Conn, sql: str, params: Any = None) -> Any:
    """A jsonb value as PostgreSQL writes it, read exactly."""
    return exact(str(scalar(conn, sql, params)))


def test_show_prints_the_payload_and_result_of_a_run_with_every_digit(
    db: Database, conn: Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    run = enqueue(conn, "invoice", PAYLOAD)
    assert claim(conn, "w1", kinds=["invoice"]) == [run]
    assert scalar(conn, "SELECT jobs.complete(%s, 'w1', %s::jsonb)", (run, RESULT)) is True

    data = exact(run_cli(capsys, "show", str(run), "--json", "--dsn", db.dsn))
    assert data["payload"] == stored(conn, "SELECT payload::text FROM jobs.runs WHERE id = %s", (run,))
    assert data["result"] == stored(conn, "SELECT result::text FROM jobs.runs WHERE id = %s", (run,))
    assert data["payload"]["price"] == ("number", "1.50") and data["payload"]["ratio"] == ("number", "0.5")
    assert data["payload"]["count"] == 123456789012345678901234567890

    text = run_cli(capsys, "show", str(run), "--dsn", db.dsn)
    missing = [d for d in DIGITS if d not in text]
    assert not missing, f"pgtick show lost digits of {missing}:\n{text}"


def test_definitions_print_the_payload_with_every_digit_as_json_and_csv(
    db: Database, conn: Conn, capsys: pytest.CaptureFixture[str]
) -> None:
    conn.execute(
        "SELECT jobs.define('billing', 'invoice', schedule => '0 3 * * *', payload => %s::jsonb)", (PAYLOAD,)
    )
    want = stored(conn, "SELECT payload::text FROM jobs.definitions WHERE name = 'billing'")

    (listed,) = exact(run_cli(capsys, "definitions", "--json", "--dsn", db.dsn))
    assert listed["payload"] == want

    out = run_cli(capsys, "definitions", "--format", "csv", "--dsn", db.dsn)
    (row,) = list(csv.DictReader(io.StringIO(out)))
    assert exact(row["payload"]) == want


def test_enqueue_and_define_store_the_payload_given_with_every_digit(
    db: Database, conn: Conn, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    want = exact(PAYLOAD)

    printed = exact(run_cli(capsys, "enqueue", "invoice", "--payload", PAYLOAD, "--json", "--dsn", db.dsn))
    assert stored(conn, "SELECT payload::text FROM jobs.runs WHERE id = %s", (printed["id"],)) == want
    assert printed["payload"] == want

    printed = exact(
        run_cli(
            capsys, "define", "billing", "invoice", "--schedule", "0 3 * * *", "--payload", PAYLOAD, "--json",
            "--dsn", db.dsn,
        )
    )  # fmt: skip
    assert stored(conn, "SELECT payload::text FROM jobs.definitions WHERE name = 'billing'") == want
    assert printed["payload"] == want

    lines = tmp_path / "definitions.jsonl"
    lines.write_text(
        f'{{"name": "billing-2", "kind": "invoice", "schedule": "0 4 * * *", "payload": {PAYLOAD}}}\n'
    )
    run_cli(capsys, "define", "--from-file", str(lines), "--dsn", db.dsn)
    assert stored(conn, "SELECT payload::text FROM jobs.definitions WHERE name = 'billing-2'") == want
