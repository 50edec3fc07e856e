from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from harness import Database, Server, server


@pytest.fixture(scope="session")
def pg() -> Iterator[Server]:
    """The PostgreSQL server for this test session, with a migrated template."""
    with server() as srv:
        yield srv


@pytest.fixture
def db(pg: Server) -> Iterator[Database]:
    """A fresh database cloned from the migrated template."""
    database = pg.create_database()
    try:
        yield database
    finally:
        pg.drop_database(database)


@pytest.fixture
def conn(db: Database) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to this test's database."""
    with db.connect() as connection:
        yield connection
