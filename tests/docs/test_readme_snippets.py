"""The README's psql and Python client snippets run as written, taken from the README itself.

Each ```sql block runs through psql, stopping at its first error, on a database of its own;
the Python client's examples run with only the names the text around them gives (`pool`,
`dsn`, an `orders` table), and do what the README says they do.
"""

from __future__ import annotations

import asyncio
import re
import textwrap
from pathlib import Path

import psycopg_pool
import pytest

from harness import ROOT, Database, Server, psql_file, rows, scalar

README = (ROOT / "README.md").read_text()
SQL_BLOCKS = re.findall(r"^```sql\n(.*?)^```", README, flags=re.DOTALL | re.MULTILINE)
PYTHON_BLOCKS = re.findall(r"^```python\n(.*?)^```", README, flags=re.DOTALL | re.MULTILINE)


def _python_block_with(text: str) -> str:
    found = [block for block in PYTHON_BLOCKS if text in block]
    assert len(found) == 1, f"{len(found)} python blocks of the README hold {text!r}"
    return str(found[0])


def _label(i: int, block: str) -> str:
    found = re.search(r"\bjobs\.(\w+)", block)
    return f"{i:02d}-{found.group(1) if found else 'sql'}"


def test_the_readme_has_its_sql_blocks() -> None:
    assert len(SQL_BLOCKS) >= 5, f"found only {len(SQL_BLOCKS)} sql blocks in the README"


@pytest.mark.parametrize("block", SQL_BLOCKS, ids=[_label(i, b) for i, b in enumerate(SQL_BLOCKS)])
def test_readme_sql_block_runs_as_written(pg: Server, block: str, tmp_path: Path) -> None:
    db = pg.create_database()
    try:
        script = tmp_path / "block.sql"
        script.write_text(block)
        result = psql_file(db.dsn, script)
        assert result.returncode == 0 and "ERROR" not in result.stderr, (
            f"README sql block failed (exit {result.returncode}):\n{block}\n--- stderr:\n{result.stderr}"
        )
    finally:
        pg.drop_database(db)


def test_the_client_transaction_example_commits_the_run_with_its_order_and_rolls_back_both(
    db: Database,
) -> None:
    """'the run commits with your order, or rolls back with it'."""
    block = _python_block_with("conn.rollback()")
    with db.connect() as conn:
        conn.execute("CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, total int)")
    with psycopg_pool.ConnectionPool(db.dsn, min_size=1, max_size=2, open=True) as pool:
        exec(compile(block, "README.md", "exec"), {"pool": pool, "dsn": db.dsn})
    with db.connect() as conn:
        orders = rows(conn, "SELECT id, total FROM orders")
        runs = rows(conn, "SELECT kind, payload FROM jobs.runs")
    assert [o["total"] for o in orders] == [42], orders
    assert runs == [{"kind": "send-receipt", "payload": {"order": orders[0]["id"]}}], runs


def test_the_async_client_example_enqueues_and_reads_the_run_back(db: Database) -> None:
    block = _python_block_with("pgtick.AsyncClient(")
    source = block.replace('"postgresql://localhost/app"', "dsn")
    assert source != block, "the AsyncClient example connects to a conninfo given as a literal"
    body = "import pgtick\n\n\nasync def example(dsn):\n" + textwrap.indent(source, "    ")
    body += "    return run\n"
    namespace: dict[str, object] = {}
    exec(compile(body, "README.md", "exec"), namespace)
    run = asyncio.run(namespace["example"](db.dsn))  # type: ignore[operator]
    assert (run.kind, run.payload, run.priority, run.status) == ("send-receipt", {"order": 7}, 5, "QUEUED")
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 1


def test_the_schedule_the_readme_says_only_the_full_parse_refuses_is_taken_by_sql(db: Database) -> None:
    """The README's example of a rule SQL saves and the scheduler then marks in error: SQL takes
    it, and the driver's full parse refuses it."""
    from pgtick.definitions import validate_schedule
    from pgtick.errors import InvalidArgument

    found = re.search(
        r"What only the full parse finds \(a rule\s+with no\s+occurrence, such as `([^`]+)`", README
    )
    assert found, "the README gives no example of a rule only the full parse refuses"
    schedule = found.group(1)
    with db.connect() as conn:
        assert scalar(conn, "SELECT id FROM jobs.define('never', 'k', schedule => %s)", (schedule,))
    with pytest.raises(InvalidArgument, match="no occurrences"):
        validate_schedule(schedule, "UTC", "never")
