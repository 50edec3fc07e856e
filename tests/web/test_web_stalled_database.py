"""The dashboard while its database stops answering: a server whose processes are stopped
(SIGSTOP) keeps its sockets open and answers nothing, as a hung host or a network path that
drops packets looks to a client, and sends no error a server-side statement_timeout could
raise. Every request still ends within the dashboard's limit (``--db-timeout``) with a 504
that says so in one line, a page that needs no database still answers, and once the server
answers again the dashboard is back by itself, on fresh connections.

The server is this module's own (it is stopped and continued); every test continues it in a
``finally``, whatever happened.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient
from web_support import PASSWORD, login, post

from harness import PGTICK, free_port, migrated_server, scalar, terminate, wait_for
from pgtick.embedded import EmbeddedPostgres
from pgtick.web import Secret, create_app
from pgtick.web.db import Database as WebDatabase
from pgtick.web.db import DatabaseTimeout

#: The dashboards under test wait this many seconds for the database.
LIMIT = 3
TIMED_OUT = f"database did not answer within {LIMIT} s"
#: How long the test waits for an answer before it calls the request hung: far past LIMIT,
#: so a loaded machine is not mistaken for a hang, and finite, so a hang fails the test.
HUNG_AFTER = 90.0
_MESSAGE = re.compile(r'id="error-message">([^<]*)</p>')


@pytest.fixture(scope="module")
def own_server() -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A migrated server of this module's own, since it is stopped and continued."""
    with migrated_server() as own:
        yield own


def _server_processes(server: EmbeddedPostgres) -> list[int]:
    """The postmaster, then its children (backends and background processes)."""
    postmaster = int((server.data_dir / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
            children.append(int(entry.name))
    return [postmaster, *children]


def _state(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@contextmanager
def frozen(server: EmbeddedPostgres) -> Iterator[None]:
    """Every process of ``server`` stopped with SIGSTOP for the block, and continued with
    SIGCONT when it ends, whatever happened."""
    stopped: list[int] = []
    try:
        # The postmaster first: once it is stopped it starts no new process.
        for pid in _server_processes(server) + _server_processes(server):
            if pid not in stopped:
                with suppress(ProcessLookupError):  # a child that ended meanwhile
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
        wait_for(
            "every server process to be stopped",
            lambda: all(_state(pid) in ("T", "gone") for pid in stopped),
            60,
        )
        yield
    finally:
        for pid in stopped:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _fetch(url: str) -> tuple[int | None, str]:
    """The status and text of a GET; None and why when no answer came within HUNG_AFTER."""
    try:
        with urllib.request.urlopen(url, timeout=HUNG_AFTER) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return None, f"no answer within {HUNG_AFTER:.0f} s: {exc}"


def _error_line(text: str) -> str:
    found = _MESSAGE.search(text)
    return found.group(1) if found else f"(no error message on the page: {text[-300:]!r})"


def test_every_page_answers_504_within_the_limit_while_the_server_is_stopped_then_recovers(
    own_server: tuple[EmbeddedPostgres, str], tmp_path: Path
) -> None:
    server, dsn = own_server
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "web.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*PGTICK, "web", "--dsn", dsn, "--bind", f"127.0.0.1:{port}", "--db-timeout", f"{LIMIT}s"],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )

    def overview_ok() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"pgtick web exited {proc.returncode}: {log_path.read_text()}")
        try:
            with urllib.request.urlopen(f"{base}/", timeout=HUNG_AFTER) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_for("the dashboard to serve its overview", overview_ok, 120)
        with frozen(server):
            # More pages at once than the dashboard has connections (4): none waits for
            # another's stuck connection, each ends at the limit.
            paths = ["/", "/runs", "/definitions", "/running", "/audit", "/runs?status=FAILED", "/"]
            with ThreadPoolExecutor(len(paths)) as pool:
                answers = list(pool.map(_fetch, [base + path for path in paths]))
            for path, (status, text) in zip(paths, answers, strict=True):
                assert (status, _error_line(text)) == (504, TIMED_OUT), f"{path}: {status} {text[-300:]}"
            # Still stopped: a page that needs no database answers at once, and the next
            # database page ends at the limit again (the cut connections were let go).
            preview, text = _fetch(f"{base}/preview?schedule=0+3+*+*+*&tz=UTC")
            assert preview == 200, text[-300:]
            again, text = _fetch(f"{base}/runs")
            assert (again, _error_line(text)) == (504, TIMED_OUT), text[-300:]
        wait_for("the overview to answer 200 once the server continues", overview_ok, 120)
        assert f"dashboard database timeout on GET /runs: {TIMED_OUT}" in log_path.read_text()
    finally:
        terminate(proc, 60)


def test_an_action_cut_at_the_limit_answers_504_and_changes_nothing(
    own_server: tuple[EmbeddedPostgres, str],
) -> None:
    """The action's statements never reached a running server, so nothing was done; the
    answer says the outcome is to be checked, since a cut during the commit could not tell."""
    server, dsn = own_server
    with psycopg.connect(dsn, autocommit=True) as conn:
        run_id = int(scalar(conn, "SELECT id FROM jobs.enqueue('stalled-action')"))
        audited = int(scalar(conn, "SELECT count(*) FROM jobs.audit_log"))
    app = create_app(dsn, Secret.from_plain(PASSWORD), db_timeout=LIMIT)
    with TestClient(app, base_url="http://127.0.0.1:8080") as client:
        csrf = login(client)
        answer: list[Any] = []
        with frozen(server):
            request = threading.Thread(
                target=lambda: answer.append(post(client, f"/runs/{run_id}/cancel", csrf)), daemon=True
            )
            request.start()
            request.join(HUNG_AFTER)
        assert answer, f"the cancel got no answer within {HUNG_AFTER:.0f} s"
        assert answer[0].status_code == 504, answer[0].text[-300:]
        assert _error_line(answer[0].text) == (
            f"{TIMED_OUT}; the change may or may not have been made: look before trying again"
        )
        wait_for(
            "the run's page to answer 200 once the server continues",
            lambda: client.get(f"/runs/{run_id}").status_code == 200,
            120,
        )
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (run_id,)) == "QUEUED"
        assert scalar(conn, "SELECT count(*) FROM jobs.audit_log") == audited + 1, "only the login"


def test_a_statement_waiting_on_a_stopped_server_is_cut_at_the_limit_and_its_connection_replaced(
    own_server: tuple[EmbeddedPostgres, str],
) -> None:
    """A connection already handed to a page when the server stops: its statement is cut at
    the deadline, counted from when the page asked for a connection."""
    server, dsn = own_server

    async def check() -> None:
        web_db = WebDatabase(dsn, timeout=LIMIT)
        await web_db.open()
        try:
            with pytest.raises(DatabaseTimeout, match=f"^{TIMED_OUT}$"):
                async with web_db.reading() as conn:
                    cut = conn
                    with frozen(server):
                        await conn.execute("SELECT 1")
            assert cut.closed, "the cut connection is still open"
            deadline = time.monotonic() + 120
            while True:  # the pool reconnects in the background: the first pages may time out
                try:
                    async with web_db.reading() as conn:
                        row = await (await conn.execute("SELECT 1 AS one")).fetchone()
                    break
                except DatabaseTimeout:
                    if time.monotonic() > deadline:
                        raise
            assert row == {"one": 1} and conn is not cut
        finally:
            await web_db.close()

    asyncio.run(check())


def test_connecting_is_bounded_by_the_limit_unless_the_dsn_says_otherwise(
    own_server: tuple[EmbeddedPostgres, str],
) -> None:
    _, dsn = own_server

    def connect_kwargs(dsn: str, timeout: float) -> dict[str, Any]:
        kwargs = WebDatabase(dsn, timeout=timeout).pool.kwargs
        assert isinstance(kwargs, dict)
        return kwargs

    assert connect_kwargs(dsn, 2.5)["connect_timeout"] == 3
    assert connect_kwargs(dsn, 0.5)["connect_timeout"] == 2  # libpq's least
    assert "connect_timeout" not in connect_kwargs(f"{dsn}&connect_timeout=30", 2)
    with pytest.raises(ValueError, match="positive"):
        WebDatabase(dsn, timeout=0)
