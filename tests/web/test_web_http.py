"""The dashboard over HTTP against a real database: every route, its status codes, the
login and CSRF guards, escaping of hostile text, validation, and the audit log."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from html import unescape as html_unescape
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
from markupsafe import escape
from psycopg import sql
from starlette.testclient import TestClient
from starlette.types import Message, Scope
from web_seed import HOSTILE_ERROR, HOSTILE_NAME, HOSTILE_PAYLOAD, Seeded, history, pages, seed
from web_support import PASSWORD, bulk_form, csrf_of, form_of, login, post

from harness import PGTICK, Database, Server, free_port, scalar, terminate, wait_for
from pgtick.schedule import parse_schedule
from pgtick.web import Secret, create_app, timeview
from pgtick.web.db import Database as WebDatabase
from pgtick.web.serve import LOOPBACK_NAMES

Conn = psycopg.Connection[Any]


@pytest.fixture
def seeded(db: Database) -> Seeded:
    with db.connect() as conn:
        return seed(conn)


def _client(dsn: str, secret: Secret | None) -> TestClient:
    return TestClient(create_app(dsn, secret), base_url="http://127.0.0.1:8080")


@pytest.fixture
def client(db: Database, seeded: Seeded) -> Iterator[TestClient]:
    """The dashboard as the operator test login (a member of jobs_operator, not a superuser)."""
    with _client(db.dsn_as("pgtick_t_operator"), Secret.from_plain(PASSWORD)) as test_client:
        yield test_client


def status_of(conn: Conn, run_id: int) -> str | None:
    row = conn.execute("SELECT status::text FROM jobs.runs WHERE id = %s", (run_id,)).fetchone()
    return None if row is None else str(row[0])


def audit_rows(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT actor, action, target, detail FROM jobs.audit_log ORDER BY id").fetchall()


def test_every_page_answers_200_to_an_anonymous_reader_without_action_forms(
    client: TestClient, seeded: Seeded
) -> None:
    for path in pages(seeded):
        response = client.get(path)
        assert response.status_code == 200, f"{path}: {response.status_code} {response.text[-500:]}"
        if not path.startswith("/static"):
            assert "default-src 'none'" in response.headers["content-security-policy"], path
            assert 'action="/runs/' not in response.text, f"{path} offers an action to an anonymous reader"
            assert 'action="/definitions/' not in response.text, path


def test_a_run_moved_to_history_keeps_its_page_and_attempt_chain(
    db: Database, client: TestClient, seeded: Seeded
) -> None:
    first = seeded.chain[0]
    with db.connect() as conn:
        conn.execute(
            "UPDATE jobs.runs SET finished_at = finished_at - interval '3 days' WHERE id = %s", (first,)
        )
        assert conn.execute("SELECT jobs.archive()").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM jobs.run_history WHERE id = %s", (first,)).fetchone() == (
            1,
        )
    for run_id in (first, seeded.chain[-1]):
        page = client.get(f"/runs/{run_id}")
        assert page.status_code == 200, f"run {run_id}: {page.status_code}"
        for attempt in seeded.chain:
            assert f'href="/runs/{attempt}"' in page.text, f"the page of run {run_id} lacks attempt {attempt}"


def test_failed_runs_moved_to_history_are_listed_counted_and_reached_by_bulk_actions(
    db: Database, client: TestClient, seeded: Seeded
) -> None:
    """The leader moves runs finished more than a day ago to history: Monday's on-call must
    still find the weekend's failures, with the definition's last outcome and streak."""
    with db.connect() as conn:
        conn.execute(
            "SELECT jobs.define('weekend', 'wk', schedule => '0 3 * * *', timezone => 'Europe/Berlin')"
        )
        moved = []
        for _ in range(2):
            run_id = int(scalar(conn, "SELECT id FROM jobs.run_now('weekend')"))
            conn.execute("SELECT jobs.claim(1, 'w', ARRAY['wk'])")
            conn.execute("SELECT jobs.fail(%s, 'w', '{E}', 'disk full')", (run_id,))
            moved.append(run_id)
        conn.execute(
            "UPDATE jobs.runs SET finished_at = finished_at - interval '3 days' WHERE id = ANY(%s)", (moved,)
        )
        assert scalar(conn, "SELECT jobs.archive()") == 2
    listed = client.get("/runs?status=FAILED&kind=wk").text
    for run_id in moved:
        assert f'href="/runs/{run_id}"' in listed, f"run {run_id}, moved to history, is not listed"
    assert "2 failed runs match this filter" in listed
    row = next(r for r in client.get("/definitions").text.split("<tr") if ">weekend<" in r)
    assert "FAILED" in row, f"the last outcome from history is missing: {row}"
    assert '<span class="bad">2</span>' in row, f"the failure streak from history is missing: {row}"

    csrf = login(client)
    shown = bulk_form(client, "/runs?status=FAILED&kind=wk", "discard")
    assert (shown["expected"], shown["upto"]) == ("2", str(max(moved)))
    assert post(client, "/runs/bulk/discard", csrf, **shown).status_code == 303
    with db.connect() as conn:
        assert scalar(conn, "SELECT count(*) FROM jobs.runs_all WHERE id = ANY(%s)", (moved,)) == 0


def test_pages_show_what_the_database_holds(client: TestClient, seeded: Seeded) -> None:
    chain = client.get(f"/runs/{seeded.chain[2]}").text
    for run_id in seeded.chain:
        assert f'href="/runs/{run_id}"' in chain, f"attempt chain lacks run {run_id}"
    assert "upstream did not answer again" in chain
    capped = client.get("/definitions").text
    assert "at cap" in capped
    berlin = client.get("/definition?name=berlin-sunday-0230").text
    upcoming = berlin[berlin.index('id="upcoming"') :]
    marked = [row for row in upcoming.split("<tr")[2:] if 'class="badge dst"' in row]
    # The last Sunday of March (02:30 does not exist) and of October (02:30 happens twice).
    assert any("-03-2" in row for row in marked) and any("-10-" in row for row in marked), marked
    assert not any(day in row for row in marked for day in ("-03-14 ", "-10-10 ")), marked
    assert "CEST" in berlin and "CET" in berlin
    running = client.get("/running").text
    assert f'data-run="{seeded.running}"' in running and f'data-run="{seeded.capped_running}"' in running
    overview = client.get("/").text
    assert "<svg" in overview and "flaky" in overview and "long-import" in overview
    only_batch = client.get("/runs?kind=batch&status=FAILED").text
    for run_id in seeded.failed_batch:
        assert f'data-run="{run_id}"' in only_batch
    assert f'data-run="{seeded.hostile_run}"' not in only_batch
    assert "3 failed runs match this filter" in only_batch


def test_years_before_1000_show_with_four_digits(client: TestClient, db: Database) -> None:
    """The C library writes the year 1 as "1": a run's times and a preview keep four digits."""
    with db.connect() as conn:
        run_id = scalar(conn, "SELECT (jobs.enqueue('ancient', run_at => '0001-01-02 00:00+00')).id")
    page = client.get(f"/runs/{run_id}").text
    assert "0001-01-02 00:00:00Z" in page, page
    preview = client.get(
        "/preview", params={"schedule": "FREQ=DAILY", "tz": "Etc/GMT+12", "after": "0001-01-03T00:00"}
    )
    assert preview.status_code == 200, preview.text
    assert re.search(r"0001-01-0\d \d\d:\d\d:\d\d \w\w\w", preview.text), preview.text  # local
    assert re.search(r"0001-01-0\d \d\d:\d\d:\d\dZ", preview.text), preview.text  # UTC
    assert not re.search(r"(?<![\d-])1-01-0\d", page + preview.text)


def test_unknown_runs_definitions_and_routes_are_404(client: TestClient) -> None:
    for path in ["/runs/999999", "/definition?name=nope", "/nowhere", "/static/nope.js"]:
        assert client.get(path).status_code == 404, path
    assert "definition &#39;nope&#39; does not exist" in client.get("/definition?name=nope").text


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/runs?status=BOGUS", "status must be one of QUEUED, RUNNING, COMPLETED, FAILED, CANCELLED"),
        ("/runs?since=yesterday", "since must be an ISO 8601 time"),
        ("/runs?since=2026-01-02&until=2026-01-01", "until must be later than since"),
        ("/runs?before=abc", "before must be an integer"),
        ("/runs?kind=" + "k" * 201, "kind is 201 characters long; the limit is 200"),
        ("/runs?queue=a%00b", "queue must not contain a NUL character"),
        ("/definition?name=%00", "name must not contain a NUL character"),
        ("/preview?schedule=0+9+*+*+*&count=0", "count must be between 1 and 1000, got 0"),
        ("/preview?schedule=0+9+*+*+*&tz=Mars/Base", "timezone &#39;Mars/Base&#39; is not a known IANA"),
        ("/preview?schedule=0+9+*+*+*&tz=localtime", "timezone &#39;localtime&#39; is not a place&#39;s"),
        ("/runs?since=2026-01-02T00:00:00." + "1" * 10000, "since must be an ISO 8601 time"),
        ("/preview?schedule=FREQ%3DSOMETIMES", "FREQ"),
        ("/preview?schedule=FREQ%3DDAILY%3BINTERVAL%3D99999999999999999999", "INTERVAL must be at most"),
        ("/definition", "name must be a non-empty text"),
        ("/audit?before=0", "before must be between 1 and"),
    ],
)
def test_bad_input_is_400_naming_the_field(client: TestClient, path: str, message: str) -> None:
    response = client.get(path)
    assert response.status_code == 400, f"{path}: {response.status_code}"
    assert message in response.text, f"{path}: {message!r} not in the page"


def test_actions_without_a_valid_csrf_token_are_refused_and_change_nothing(
    client: TestClient, seeded: Seeded, conn: Conn
) -> None:
    csrf = login(client)
    for token in ["", "forged", csrf[:-1] + ("x" if csrf[-1] != "x" else "y")]:
        response = post(client, f"/runs/{seeded.queued}/cancel", token)
        assert response.status_code == 403, response.text
        assert "CSRF token missing or wrong" in response.text
    response = client.post(f"/runs/{seeded.queued}/cancel", data={}, follow_redirects=False)
    assert response.status_code == 403
    assert status_of(conn, seeded.queued) == "QUEUED"
    assert [r[1] for r in audit_rows(conn)] == ["login"]


def test_actions_from_another_origin_are_refused(client: TestClient, seeded: Seeded, conn: Conn) -> None:
    csrf = login(client)
    response = client.post(
        f"/runs/{seeded.queued}/cancel",
        data={"csrf": csrf},
        headers={"Origin": "http://evil.example"},
        follow_redirects=False,
    )
    assert response.status_code == 403
    assert status_of(conn, seeded.queued) == "QUEUED"


@pytest.mark.parametrize("origin", ["http://[", "http://[::1", "http://127.0.0.1:99999999", "http://a b"])
def test_an_action_with_a_malformed_origin_is_refused_as_cross_site(
    client: TestClient, seeded: Seeded, conn: Conn, origin: str
) -> None:
    """An Origin header that is not a URL (what no browser sends, but anything may) is
    refused like another site's, not answered with an internal error."""
    csrf = login(client)
    response = client.post(
        f"/runs/{seeded.queued}/cancel",
        data={"csrf": csrf},
        headers={"Origin": origin},
        follow_redirects=False,
    )
    assert response.status_code == 403, f"{origin!r}: {response.status_code} {response.text[-300:]}"
    assert "cross-site request refused" in response.text
    assert status_of(conn, seeded.queued) == "QUEUED"


def test_actions_need_an_operator_login(client: TestClient, seeded: Seeded, conn: Conn) -> None:
    csrf = csrf_of(client)  # a valid token of an anonymous session
    attempts = [
        (f"/runs/{seeded.queued}/cancel", {}),
        (f"/runs/{seeded.failed}/retry", {}),
        ("/definitions/pause", {"name": "capped"}),
        ("/definitions/resume", {"name": "capped"}),
        ("/definitions/run-now", {"name": "capped"}),
        ("/runs/bulk/retry", {"kind": "batch"}),
        ("/runs/bulk/discard", {"kind": "batch"}),
    ]
    for path, fields in attempts:
        response = post(client, path, csrf, **fields)
        assert response.status_code == 403, f"{path}: {response.status_code}"
        assert "log in as an operator" in response.text
    assert status_of(conn, seeded.queued) == "QUEUED"
    assert conn.execute(
        "SELECT count(*) FROM jobs.runs WHERE retry_of = ANY(%s)", (seeded.failed_batch,)
    ).fetchone() == (0,)
    assert conn.execute("SELECT enabled FROM jobs.definitions WHERE name = 'capped'").fetchone() == (True,)
    assert audit_rows(conn) == []


def test_the_pages_an_answer_to_an_action_links_go_back_to_where_the_action_was_sent_from(
    client: TestClient, seeded: Seeded
) -> None:
    """After a restart of the dashboard (sessions live in its memory) or 12 idle hours, an
    operator's next click is refused; the login that answer offers leads back to the page the
    action was sent from, not to the action's address (which answers a GET with 405), and so
    does the logout form on the answer to a refused action."""
    run_id = seeded.failed_batch[0]
    client.cookies.set("pgtick_session", "a session from before a restart")
    refused = client.post(f"/runs/{run_id}/retry", data={"csrf": "stale", "next": f"/runs/{run_id}"})
    assert refused.status_code == 403, refused.status_code
    found = re.search(r'href="(/login\?[^"]*)"', refused.text)
    assert found, refused.text[-800:]
    link = html_unescape(found.group(1))
    assert link == "/login?" + urlencode({"next": f"/runs/{run_id}"}), link
    login_page = client.get(link).text
    back = re.search(r'name="next" value="([^"]*)"', login_page)
    assert back and html_unescape(back.group(1)) == f"/runs/{run_id}", back
    token = re.search(r'name="csrf" value="([^"]+)"', login_page)
    assert token
    wrong = client.post(
        "/login",
        data={
            "csrf": token.group(1),
            "name": "alice",
            "password": "wrong password",
            "next": f"/runs/{run_id}",
        },
    )
    assert wrong.status_code == 401, wrong.status_code
    back = re.search(r'name="next" value="([^"]*)"', wrong.text[wrong.text.index('action="/login"') :])
    assert back and html_unescape(back.group(1)) == f"/runs/{run_id}", "a wrong password lost the way back"
    csrf = login(client)
    answer = post(client, "/definitions/pause", csrf, name="ghost", next="/definitions")
    assert answer.status_code == 404, answer.status_code
    logout = answer.text[answer.text.index('action="/logout"') :]
    back = re.search(r'name="next" value="([^"]*)"', logout)
    assert back and html_unescape(back.group(1)) == "/definitions", back


def test_a_wrong_password_is_refused(client: TestClient, conn: Conn) -> None:
    response = client.post("/login", data={"csrf": csrf_of(client), "name": "mallory", "password": "guess"})
    assert response.status_code == 401
    assert "wrong password" in response.text
    assert "operator: mallory" not in client.get("/").text
    assert audit_rows(conn) == []


def test_an_operator_secret_is_matched_whole_and_one_too_long_to_match_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A login's password is hashed up to 4096 bytes: a longer secret could never be matched
    (the right password refused for ever), so it is refused when the dashboard starts, with one
    readable line; and a password that only begins with the secret is not the secret."""
    from pgtick.errors import UsageError
    from pgtick.web.serve import PASSWORD_ENV, operator_secret

    monkeypatch.setenv(PASSWORD_ENV, "s" * 5000)
    with pytest.raises(UsageError, match="at most 4096 bytes"):
        operator_secret(None)
    longest = "é" * 2048  # 4096 bytes
    secret = Secret.from_plain(longest)
    assert secret.matches(longest)
    assert not secret.matches(longest + "x"), "a password that only begins with the secret passed"
    assert not secret.matches(longest[:-1])


def test_a_loopback_dashboard_answers_only_requests_addressed_to_the_loopback(db: Database) -> None:
    """A page elsewhere that makes its own name resolve to 127.0.0.1 (DNS rebinding) would
    otherwise read the dashboard from the operator's browser."""
    from pgtick.web.serve import LOOPBACK_NAMES

    def dashboard() -> Any:
        return create_app(db.dsn_as("pgtick_t_reader"), None, allowed_hosts=LOOPBACK_NAMES)

    with TestClient(dashboard(), base_url="http://attacker.example:8080") as foreign:
        assert foreign.get("/runs").status_code == 400
    for base in ("http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080"):
        with TestClient(dashboard(), base_url=base) as local:
            assert local.get("/runs").status_code == 200, base


@pytest.mark.parametrize(("bind", "address"), [("127.0.0.2", "127.0.0.2"), ("127.1", "127.0.0.1")])
def test_pgtick_web_bound_to_another_loopback_address_answers_requests_addressed_to_it(
    db: Database, bind: str, address: str
) -> None:
    """127.0.0.2 is the loopback too, and so is 127.1 (short for 127.0.0.1): bound there, the
    dashboard answers the address it is bound to and still no other name (DNS rebinding), and
    does not warn that other machines can reach it."""
    port = free_port()
    proc = subprocess.Popen(
        [*PGTICK, "web", "--dsn", db.dsn_as("pgtick_t_reader"), "--bind", f"{bind}:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def status(host: str | None) -> int | None:
        if proc.poll() is not None:
            raise AssertionError(
                f"pgtick web exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            )
        request = urllib.request.Request(f"http://{address}:{port}/runs")
        if host is not None:
            request.add_header("Host", host)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as refused:
            return refused.code
        except OSError:
            return None

    try:
        answered = wait_for("pgtick web to answer", lambda: status(None), 90)
        rebound = status(f"attacker.example:{port}")
    finally:
        terminate(proc, 60)
    assert answered == 200, answered
    assert rebound == 400, rebound
    stderr = proc.stderr.read() if proc.stderr else ""
    assert "reachable from other machines" not in stderr, stderr


def test_pages_answer_after_the_server_dropped_the_dashboards_connections(
    client: TestClient, conn: Conn, db: Database
) -> None:
    """A restart (or an idle timeout) drops the pooled connections: each is checked before a
    page gets it, so no page fails for a connection the server already closed."""
    assert client.get("/").status_code == 200
    dropped = conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name = 'pgtick-web' AND datname = current_database()"
    ).fetchone()
    assert dropped is not None and dropped[0] >= 1
    codes = [client.get(path).status_code for path in ("/", "/runs", "/definitions", "/running")]
    assert codes == [200, 200, 200, 200], codes


def test_wrong_passwords_sent_at_once_are_answered_one_after_another(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guessing in parallel gains nothing: each refused login holds the gate for the delay."""
    monkeypatch.setattr("pgtick.web.app.LOGIN_FAILURE_DELAY", 0.3)
    token = csrf_of(client)

    def guess(i: int) -> int:
        data = {"csrf": token, "name": "mallory", "password": f"guess-{i}"}
        return int(client.post("/login", data=data).status_code)

    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(guess, range(4)))
    assert codes == [401] * 4
    assert time.monotonic() - started >= 4 * 0.3, "refused logins overlapped"


def test_requests_without_a_cookie_do_not_end_an_operators_session(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pgtick.web.auth.MAX_SESSIONS", 20)
    login(client, "alice")
    stranger = TestClient(client.app, base_url="http://127.0.0.1:8080")  # the same dashboard, no cookie
    for _ in range(50):  # a health check or a flood: a new anonymous session each time
        stranger.cookies.clear()
        assert stranger.get("/login").status_code == 200
    assert "operator: alice" in client.get("/").text


def test_login_is_audited_and_logout_ends_the_operator_session(
    client: TestClient, seeded: Seeded, conn: Conn
) -> None:
    anonymous = csrf_of(client)
    csrf = login(client, "alice")
    assert csrf != anonymous, "the session id and token must change at login"
    assert "operator: alice" in client.get("/").text
    assert post(client, "/logout", csrf).status_code == 303
    assert "operator: alice" not in client.get("/").text
    assert post(client, f"/runs/{seeded.queued}/cancel", csrf).status_code == 403
    assert status_of(conn, seeded.queued) == "QUEUED"
    assert [(r[0], r[1]) for r in audit_rows(conn)] == [("alice (testclient)", "login")]


def test_a_login_or_logout_form_sent_again_goes_back_saying_so_rather_than_to_an_error_page(
    client: TestClient, conn: Conn
) -> None:
    """A login or logout changes the session's CSRF token, so the same form sent again (a
    double click, the back button and resend) carries the old one. It changes nothing and
    says why, as other actions sent twice do: the operator is logged in, or out, already. A
    wrong token still refuses a login to a session without an operator, and a logout of an
    operator's session (no other site may log an operator out)."""
    shown = csrf_of(client)
    fields = {"csrf": shown, "name": "alice", "password": PASSWORD, "next": "/runs"}
    assert client.post("/login", data=fields, follow_redirects=False).status_code == 303
    again = client.post("/login", data=fields, follow_redirects=False)
    assert again.status_code == 303, f"{again.status_code} {again.text[-300:]}"
    assert again.headers["location"] == "/runs"
    assert "logged in as alice already" in flash_of(client, "/runs")
    assert [r[1] for r in audit_rows(conn)] == ["login"], "the repeat logged in again"

    operator = csrf_of(client, "/")
    forged = post(client, "/logout", "forged")
    assert forged.status_code == 403 and "operator: alice" in client.get("/").text
    for _ in range(2):
        response = post(client, "/logout", operator, next="/running")
        assert response.status_code == 303, f"{response.status_code} {response.text[-300:]}"
        assert response.headers["location"] == "/running"
    page = client.get("/running").text
    assert "logged out already" in page and "operator: alice" not in page

    refused = client.post("/login", data={**fields, "csrf": "forged"}, follow_redirects=False)
    assert refused.status_code == 403 and "CSRF token missing or wrong" in refused.text
    assert "operator: alice" not in client.get("/").text


@pytest.mark.parametrize("name", ["a\nb", "a\x01b", "ops\u202eteam"])
def test_an_operator_name_that_would_forge_a_log_line_or_read_as_another_is_refused(
    client: TestClient, conn: Conn, name: str
) -> None:
    response = client.post(
        "/login", data={"csrf": csrf_of(client), "name": name, "password": PASSWORD}, follow_redirects=False
    )
    assert response.status_code == 400, response.text
    assert "name must not contain control, invisible or text-direction characters" in response.text
    assert audit_rows(conn) == [], "no login was recorded"


def test_cancel_and_retry_change_the_run_and_are_audited(
    client: TestClient, seeded: Seeded, conn: Conn
) -> None:
    csrf = login(client)
    response = post(client, f"/runs/{seeded.queued}/cancel", csrf, next=f"/runs/{seeded.queued}")
    assert response.status_code == 303 and response.headers["location"] == f"/runs/{seeded.queued}"
    assert status_of(conn, seeded.queued) == "CANCELLED"
    assert f"run {seeded.queued} cancelled" in client.get(f"/runs/{seeded.queued}").text

    assert post(client, f"/runs/{seeded.running}/cancel", csrf).status_code == 303
    row = conn.execute(
        "SELECT status::text, cancel_requested FROM jobs.runs WHERE id = %s", (seeded.running,)
    )
    assert row.fetchone() == ("RUNNING", True)

    assert post(client, f"/runs/{seeded.hostile_run}/retry", csrf).status_code == 303
    new_run = conn.execute(
        "SELECT id, status::text FROM jobs.runs WHERE retry_of = %s", (seeded.hostile_run,)
    )
    new_id, new_status = new_run.fetchone() or (None, None)
    assert new_status == "QUEUED"

    entries = audit_rows(conn)
    assert [(e[0], e[1], e[2]) for e in entries] == [
        ("alice (testclient)", "login", None),
        ("alice (testclient)", "cancel", f"run {seeded.queued}"),
        ("alice (testclient)", "cancel", f"run {seeded.running}"),
        ("alice (testclient)", "retry", f"run {seeded.hostile_run}"),
    ]
    assert entries[1][3] == {"status": "CANCELLED"} and entries[2][3] == {"status": "RUNNING"}
    assert entries[3][3] == {"new_run": new_id}
    audit_page = client.get("/audit").text
    assert f"run {seeded.hostile_run}" in audit_page and "alice (testclient)" in audit_page


def test_definition_pause_resume_and_run_now(client: TestClient, seeded: Seeded, conn: Conn) -> None:
    csrf = login(client)
    enabled = "SELECT enabled FROM jobs.definitions WHERE name = 'berlin-sunday-0230'"
    assert post(client, "/definitions/pause", csrf, name="berlin-sunday-0230").status_code == 303
    assert conn.execute(enabled).fetchone() == (False,)
    page = client.get("/definition?name=berlin-sunday-0230").text
    assert "paused" in page
    # Its next runs are listed as what a resume would run, not as runs to come.
    assert "Next runs once resumed" in page and 'id="upcoming-paused"' in page, page
    listing = client.get("/definitions")
    assert listing.status_code == 200 and "resume" in listing.text
    assert post(client, "/definitions/resume", csrf, name="berlin-sunday-0230").status_code == 303
    assert conn.execute(enabled).fetchone() == (True,)
    page = client.get("/definition?name=berlin-sunday-0230").text
    assert "<h2>Next runs</h2>" in page and 'id="upcoming-paused"' not in page
    before = conn.execute("SELECT count(*) FROM jobs.runs WHERE origin = 'manual'").fetchone()
    assert post(client, "/definitions/run-now", csrf, name="berlin-sunday-0230").status_code == 303
    after = conn.execute("SELECT count(*) FROM jobs.runs WHERE origin = 'manual'").fetchone()
    assert before is not None and after == (before[0] + 1,)
    actions = [(r[1], r[2]) for r in audit_rows(conn)][1:]
    assert actions == [
        ("pause", "definition berlin-sunday-0230"),
        ("resume", "definition berlin-sunday-0230"),
        ("run_now", "definition berlin-sunday-0230"),
    ]


def test_a_bulk_retry_sent_many_times_at_once_retries_each_run_once_and_says_so_once(
    client: TestClient, seeded: Seeded, conn: Conn
) -> None:
    """Six identical bulk retries at once (a double click, a resent form): one retries the
    runs and is audited; every other answers 409 and does nothing, whether it found the count
    changed or found the runs taken while it retried them."""
    csrf = login(client)
    shown = bulk_form(client, "/runs?status=FAILED&kind=batch", "retry")
    with ThreadPoolExecutor(6) as pool:
        codes = sorted(
            r.status_code
            for r in pool.map(lambda _: post(client, "/runs/bulk/retry", csrf, **shown), range(6))
        )
    assert codes == [303] + [409] * 5, codes
    retried = conn.execute(
        "SELECT retry_of, count(*) FROM jobs.runs WHERE retry_of = ANY(%s) GROUP BY retry_of",
        (seeded.failed_batch,),
    ).fetchall()
    assert sorted(retried) == sorted((run_id, 1) for run_id in seeded.failed_batch), retried
    assert [r[1] for r in audit_rows(conn)].count("bulk_retry") == 1


def test_a_run_now_form_sent_twice_queues_one_run_and_says_so(
    client: TestClient, seeded: Seeded, conn: Conn
) -> None:
    """ "Run now" is the one action that is not idempotent: the same form sent again (a double
    click, at once or one after another; the back button and resend) queues one run, and the
    repeat says it queued nothing more. The form the page shows after it queues the next."""
    csrf = login(client)
    name = "berlin-sunday-0230"
    manual = "SELECT count(*) FROM jobs.runs WHERE origin = 'manual'"
    before = scalar(conn, manual)

    def run_now_form() -> dict[str, str]:
        html = client.get("/definition?" + urlencode({"name": name})).text
        start = html.index('action="/definitions/run-now"')
        form = html[start : html.index("</form>", start)]
        fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form))
        fields.pop("csrf")
        return fields

    shown = run_now_form()
    with ThreadPoolExecutor(4) as pool:
        codes = list(
            pool.map(lambda _: post(client, "/definitions/run-now", csrf, **shown).status_code, range(4))
        )
    assert codes == [303] * 4, codes
    assert post(client, "/definitions/run-now", csrf, **shown).status_code == 303
    assert scalar(conn, manual) == before + 1, "one form queued more than one run"
    page = client.get("/definition?" + urlencode({"name": name})).text
    assert f"definition {name}: this run-now form was sent already" in page, page
    assert [r[1] for r in audit_rows(conn)].count("run_now") == 1
    assert post(client, "/definitions/run-now", csrf, **run_now_form()).status_code == 303
    assert scalar(conn, manual) == before + 2, "a form shown after the first did not queue a run"


def flash_of(client: TestClient, path: str) -> str:
    """The text and links of the messages the page at `path` shows once (after an action)."""
    return "\n".join(re.findall(r'<p class="flash ok">(.*?)</p>', client.get(path).text))


def test_an_action_whose_connection_is_lost_says_it_may_have_been_done_and_its_form_stays_sent(
    db: Database, client: TestClient, conn: Conn
) -> None:
    """A connection lost during an action (a server restart, a failover, a network cut) may have
    lost the answer to a COMMIT the server made: the dashboard cannot tell whether the action was
    done, so it says so, as for a timeout, and a run-now form sent again queues nothing more
    rather than perhaps a second run."""
    csrf = login(client)
    form = form_of(client, "/definition?name=capped", "/definitions/run-now")
    before = scalar(
        conn,
        "SELECT count(*) FROM jobs.runs AS r JOIN jobs.definitions AS d ON d.id = r.definition_id"
        " WHERE d.name = 'capped'",
    )
    with db.connect(autocommit=False) as holder, ThreadPoolExecutor(1) as pool:
        holder.execute("SELECT 1 FROM jobs.definitions WHERE name = 'capped' FOR UPDATE")
        sent = pool.submit(post, client, "/definitions/run-now", csrf, **form)

        def waiting() -> int | None:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgtick-web'"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            ).fetchone()
            return None if row is None else int(row[0])

        pid = wait_for("the run-now to wait for the definition's lock", waiting, 60)
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        response = sent.result(timeout=60)
        holder.rollback()
    assert response.status_code == 503, f"{response.status_code}: {response.text[-400:]}"
    assert "the change may or may not have been made" in response.text, response.text[-600:]
    again = post(client, "/definitions/run-now", csrf, **form)
    assert again.status_code == 303, again.status_code
    assert "this run-now form was sent already" in client.get(again.headers["location"]).text
    after = scalar(
        conn,
        "SELECT count(*) FROM jobs.runs AS r JOIN jobs.definitions AS d ON d.id = r.definition_id"
        " WHERE d.name = 'capped'",
    )
    assert after == before, f"the same form queued {after - before} runs"


def test_a_retry_sent_again_queues_nothing_and_links_the_retry_that_was_made(
    client: TestClient, seeded: Seeded, conn: Conn
) -> None:
    """A run has one next attempt. The same retry form sent again (a double click, a resend),
    another tab's form or a client without a form id finds the run retried: each goes back
    to the run saying which run retried it, with a link to that run, rather than to an error
    page; the repeat of the operator's own form says so."""
    csrf = login(client)
    run_id = seeded.hostile_run
    shown = form_of(client, f"/runs/{run_id}", f"/runs/{run_id}/retry")
    assert shown.get("once"), f"the retry form carries no form id: {shown}"
    first = post(client, f"/runs/{run_id}/retry", csrf, **shown)
    assert first.status_code == 303, first.text
    new_run = scalar(conn, "SELECT id FROM jobs.runs WHERE retry_of = %s", (run_id,))
    assert f"run {run_id} retried as run {new_run}" in flash_of(client, f"/runs/{run_id}")

    link = f'<a href="/runs/{new_run}">see run {new_run}</a>'
    said = f"run {run_id} was already retried as run {new_run}"
    for fields, mine in ((shown, True), ({**shown, "once": "another-tab"}, False), ({}, False)):
        again = post(client, f"/runs/{run_id}/retry", csrf, **fields)
        assert again.status_code == 303, f"{fields}: {again.status_code} {again.text[-300:]}"
        assert again.headers["location"] == f"/runs/{run_id}"
        flash = flash_of(client, again.headers["location"])
        assert said in flash and link in flash, f"{fields}: {flash!r}"
        assert ("(this retry form was sent already)" in flash) == mine, f"{fields}: {flash!r}"

    # A run another operator retried before this page was shown, sent from the list of runs.
    earlier = post(client, f"/runs/{seeded.chain[0]}/retry", csrf, once="old-page", next="/runs")
    assert earlier.status_code == 303 and earlier.headers["location"] == "/runs"
    flash = flash_of(client, "/runs")
    assert f"was already retried as run {seeded.chain[1]}" in flash, flash
    assert f'href="/runs/{seeded.chain[1]}"' in flash, flash

    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE retry_of = %s", (run_id,)) == 1
    assert [r[1] for r in audit_rows(conn)] == ["login", "retry"], "a retry that queued nothing was audited"


def test_a_retry_that_waited_for_a_retry_made_meanwhile_links_it(
    db: Database, client: TestClient, seeded: Seeded, conn: Conn
) -> None:
    """Two retries of one run at once (a double click, two operators): the second finds no
    next attempt, then waits in jobs.retry for the run's lock while the first commits; it
    queues nothing and links the first's retry rather than answering jobs.retry's refusal."""
    csrf = login(client)
    run_id = seeded.hostile_run
    shown = form_of(client, f"/runs/{run_id}", f"/runs/{run_id}/retry")
    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'pgtick-web' AND wait_event_type = 'Lock'"
    )
    with db.connect() as other, ThreadPoolExecutor(1) as pool:
        with other.transaction():
            first = scalar(other, "SELECT id FROM jobs.retry(%s)", (run_id,))
            sent = pool.submit(post, client, f"/runs/{run_id}/retry", csrf, **shown)
            wait_for("the dashboard's retry to wait for the run", lambda: scalar(conn, waiting) or None, 60)
        response = sent.result(timeout=60)
    assert response.status_code == 303, f"{response.status_code} {response.text[-300:]}"
    flash = flash_of(client, f"/runs/{run_id}")
    assert f"run {run_id} was already retried as run {first}: nothing more queued" in flash, flash
    assert f'href="/runs/{first}"' in flash, flash
    assert scalar(conn, "SELECT count(*) FROM jobs.runs WHERE retry_of = %s", (run_id,)) == 1


def test_two_cancels_of_a_queued_run_at_once_cancel_it_once_and_audit_it_once(
    db: Database, client: TestClient, seeded: Seeded, conn: Conn
) -> None:
    """A double click or two operators: the second cancel waits in jobs.cancel for the run's
    lock while the first commits, then finds the run cancelled. It says so, and only the first
    is audited."""
    csrf = login(client)
    run_id = seeded.queued
    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'pgtick-web' AND wait_event_type = 'Lock'"
    )
    with db.connect() as other, ThreadPoolExecutor(1) as pool:
        with other.transaction():
            assert scalar(other, "SELECT jobs.cancel(%s)::text", (run_id,)) == "CANCELLED"
            other.execute("SELECT jobs.audit('bob', 'cancel', %s, '{}')", (f"run {run_id}",))
            sent = pool.submit(post, client, f"/runs/{run_id}/cancel", csrf)
            wait_for("the dashboard's cancel to wait for the run", lambda: scalar(conn, waiting) or None, 60)
        response = sent.result(timeout=60)
    assert response.status_code == 303, f"{response.status_code} {response.text[-300:]}"
    flash = flash_of(client, f"/runs/{run_id}")
    assert f"run {run_id} was cancelled already: nothing to cancel" in flash, flash
    cancels = [(e[0], e[2]) for e in audit_rows(conn) if e[1] == "cancel"]
    assert cancels == [("bob", f"run {run_id}")], cancels


def test_an_auto_refresh_leaves_the_answer_to_an_action_to_the_page_it_goes_back_to(
    client: TestClient, seeded: Seeded
) -> None:
    """The overview refreshes itself in the background (app.js, with X-Refresh) and drops the
    messages of the page it fetched; one that fires between an action and the page the action
    goes back to (another tab) must leave that page its message."""
    csrf = login(client)
    response = post(client, f"/runs/{seeded.queued}/cancel", csrf, next=f"/runs/{seeded.queued}")
    assert response.status_code == 303, response.status_code
    assert client.get("/", headers={"X-Refresh": "1"}).status_code == 200
    assert f"run {seeded.queued} cancelled" in client.get(response.headers["location"]).text


def test_an_action_that_changes_nothing_says_so(client: TestClient, seeded: Seeded, conn: Conn) -> None:
    """Pausing a paused definition, resuming a running one and cancelling a cancelled run say
    that nothing changed, as the queue actions do, rather than that they did it."""
    csrf = login(client)
    name = "berlin-sunday-0230"
    for action, said in (
        ("pause", "paused"),
        ("pause", "was paused already: nothing changed"),
        ("resume", "resumed"),
        ("resume", "was not paused: nothing changed"),
    ):
        assert post(client, f"/definitions/{action}", csrf, name=name).status_code == 303
        assert f"definition {name} {said}" in client.get("/definition?name=" + name).text, (action, said)
    for said in ("cancelled", "was cancelled already: nothing to cancel"):
        assert post(client, f"/runs/{seeded.queued}/cancel", csrf).status_code == 303
        assert f"run {seeded.queued} {said}" in client.get(f"/runs/{seeded.queued}").text, said
    assert status_of(conn, seeded.queued) == "CANCELLED"


def test_names_are_taken_as_sent_so_a_trailing_space_names_another_definition_or_queue(
    client: TestClient, conn: Conn
) -> None:
    """ "nightly" and "nightly " are two definitions (and "q" and "q " two queues, "k" and "k "
    two kinds): the pages, filters and actions reach the one named, never its neighbour."""
    for name in ("nightly", "nightly "):
        conn.execute("SELECT jobs.define(%s, 'k', schedule => '0 3 * * *')", (name,))
    conn.execute("SELECT jobs.enqueue('k', queue => 'q')")
    spaced = scalar(conn, "SELECT id FROM jobs.enqueue('k ', queue => 'q ')")
    csrf = login(client)
    assert post(client, "/definitions/pause", csrf, name="nightly ").status_code == 303
    enabled = dict(
        conn.execute("SELECT name, enabled FROM jobs.definitions WHERE name LIKE 'nightly%'").fetchall()
    )
    assert enabled == {"nightly": True, "nightly ": False}, enabled
    assert post(client, "/queues/pause", csrf, name="q ").status_code == 303
    assert conn.execute("SELECT name FROM jobs.paused_queues").fetchall() == [("q ",)]
    page = client.get("/definition?" + urlencode({"name": "nightly "})).text
    assert "paused" in page, "the definition page of 'nightly ' shows that one"
    for field, value in (("kind", "k "), ("queue", "q ")):
        listed = client.get("/runs?" + urlencode({field: value})).text
        shown = sorted(int(i) for i in re.findall(r'data-run="(\d+)"', listed))
        assert shown == [spaced], f"/runs?{field}={value!r} listed {shown}, not only run {spaced}"
    assert post(client, "/definitions/pause", csrf, name="   ").status_code == 400


def test_bulk_retry_and_discard_touch_only_the_failed_runs_matching_the_filter(
    client: TestClient, seeded: Seeded, conn: Conn
) -> None:
    csrf = login(client)
    shown = bulk_form(client, "/runs?status=FAILED&kind=batch", "retry")
    response = post(client, "/runs/bulk/retry", csrf, **{**shown, "status": "COMPLETED"})
    assert response.status_code == 303
    retried = conn.execute(
        "SELECT retry_of, status::text, attempt FROM jobs.runs WHERE retry_of = ANY(%s) ORDER BY retry_of",
        (seeded.failed_batch,),
    ).fetchall()
    assert retried == [(run_id, "QUEUED", 2) for run_id in seeded.failed_batch]
    assert conn.execute(
        "SELECT count(*) FROM jobs.runs WHERE retry_of = %s", (seeded.hostile_run,)
    ).fetchone() == (0,)
    # A second bulk retry finds nothing left to retry: each run has one next attempt at most.
    again = bulk_form(client, "/runs?status=FAILED&kind=batch", "retry")
    assert again["expected"] == "0"
    assert post(client, "/runs/bulk/retry", csrf, **again).status_code == 303
    assert conn.execute(
        "SELECT count(*) FROM jobs.runs WHERE retry_of = ANY(%s)", (seeded.failed_batch,)
    ).fetchone() == (3,)

    discard = bulk_form(client, "/runs?status=FAILED&kind=batch", "discard")
    assert post(client, "/runs/bulk/discard", csrf, **discard).status_code == 303
    assert conn.execute(
        "SELECT count(*) FROM jobs.runs WHERE id = ANY(%s)", (seeded.failed_batch,)
    ).fetchone() == (0,)
    assert status_of(conn, seeded.hostile_run) == "FAILED"
    assert status_of(conn, seeded.chain[0]) == "FAILED"
    details = [(r[1], r[3]) for r in audit_rows(conn)][1:]
    assert details == [
        (
            "bulk_retry",
            {"filter": {"status": "FAILED", "kind": "batch"}, "retried": 3, "runs": seeded.failed_batch},
        ),
        ("bulk_retry", {"filter": {"status": "FAILED", "kind": "batch"}, "retried": 0, "runs": []}),
        (
            "bulk_discard",
            {"filter": {"status": "FAILED", "kind": "batch"}, "discarded": 3, "runs": seeded.failed_batch},
        ),
    ]


def test_a_bulk_action_does_what_the_page_showed_or_nothing(
    client: TestClient, seeded: Seeded, conn: Conn
) -> None:
    """The page offers to act on N runs; runs that failed after it was shown are not touched,
    and when fewer or more of the shown ones match by the time the operator confirms, nothing
    is done and the answer says so."""
    csrf = login(client)
    shown = bulk_form(client, "/runs?status=FAILED&kind=batch", "retry")
    assert shown["expected"] == "3"
    late = int(scalar(conn, "SELECT id FROM jobs.enqueue('batch')"))
    conn.execute("SELECT jobs.claim(1, 'w', ARRAY['batch'])")
    conn.execute("SELECT jobs.fail(%s, 'w', '{E}', 'failed after the page was shown')", (late,))
    assert post(client, "/runs/bulk/retry", csrf, **shown).status_code == 303
    assert conn.execute("SELECT count(*) FROM jobs.runs WHERE retry_of = %s", (late,)).fetchone() == (0,)

    discard = bulk_form(client, "/runs?status=FAILED&kind=batch", "discard")
    conn.execute("SELECT jobs.retry(%s)", (late,))  # one of those shown changes meanwhile...
    conn.execute("DELETE FROM jobs.runs WHERE id = %s", (seeded.failed_batch[0],))
    response = post(client, "/runs/bulk/discard", csrf, **discard)
    assert response.status_code == 409, response.status_code
    assert "nothing was done" in response.text
    assert conn.execute(
        "SELECT count(*) FROM jobs.runs WHERE id = ANY(%s)", (seeded.failed_batch[1:],)
    ).fetchone() == (2,)


def test_a_bulk_action_does_the_runs_it_may_and_names_those_the_sql_api_passes_over(
    client: TestClient, conn: Conn
) -> None:
    """jobs.retry_many retries one of several failed runs of one unique key, and jobs.discard
    keeps a failed attempt that a blocked run waits on: those are passed over on every click,
    not taken by another action, so the click does the rest and names them, rather than
    answering 409 "taken by another action meanwhile" for ever."""
    csrf = login(client)
    keyed = []
    for _ in range(2):  # two failed runs of one unique key: a retry of both would run it twice
        run_id = int(scalar(conn, "SELECT id FROM jobs.enqueue('keyed', unique_key => 'k1')"))
        conn.execute("SELECT jobs.claim(1, 'w', ARRAY['keyed'])")
        conn.execute("SELECT jobs.fail(%s, 'w', '{E}', 'keyed failed')", (run_id,))
        keyed.append(run_id)
    shown = bulk_form(client, "/runs?status=FAILED&kind=keyed", "retry")
    assert shown["expected"] == "2"
    response = post(client, "/runs/bulk/retry", csrf, **shown)
    assert response.status_code == 303, f"{response.status_code}: {response.text[-400:]}"
    assert (
        "retried 1 failed run; passed over run " + str(keyed[1])
        in client.get(response.headers["location"]).text
    )
    retried = conn.execute(
        "SELECT retry_of FROM jobs.runs WHERE retry_of = ANY(%s) ORDER BY retry_of", (keyed,)
    ).fetchall()
    assert retried == [(keyed[0],)], retried

    upstream = int(scalar(conn, "SELECT id FROM jobs.enqueue('upstream')"))
    conn.execute("SELECT jobs.claim(1, 'w', ARRAY['upstream'])")
    conn.execute("SELECT jobs.fail(%s, 'w', '{E}', 'upstream failed')", (upstream,))
    conn.execute("SELECT jobs.retry(%s)", (upstream,))
    conn.execute("SELECT jobs.enqueue('downstream', depends_on => ARRAY[%s]::bigint[])", (upstream,))
    shown = bulk_form(client, "/runs?status=FAILED&kind=upstream", "discard")
    assert shown["expected"] == "1"
    response = post(client, "/runs/bulk/discard", csrf, **shown)
    assert response.status_code == 303, f"{response.status_code}: {response.text[-400:]}"
    assert (
        f"discarded 0 failed runs; passed over run {upstream}"
        in client.get(response.headers["location"]).text
    )
    assert status_of(conn, upstream) == "FAILED"
    details = [r[3] for r in audit_rows(conn) if r[1].startswith("bulk_")]
    assert [d["passed_over"] for d in details] == [[keyed[1]], [upstream]], details
    assert [d.get("retried", d.get("discarded")) for d in details] == [1, 0], details


def test_bad_actions_answer_with_the_sql_apis_errors_and_change_nothing(
    client: TestClient, seeded: Seeded, conn: Conn
) -> None:
    csrf = login(client)
    cases = [
        (f"/runs/{seeded.completed}/retry", {}, 400, "only FAILED or CANCELLED runs can be retried"),
        ("/runs/999999/cancel", {}, 404, "run 999999 does not exist"),
        (f"/runs/{2**63}/cancel", {}, 404, f"run {2**63} does not exist"),
        ("/runs/1/explode", {}, 404, "no such action"),
        ("/definitions/pause", {"name": ""}, 400, "name must be a non-empty text"),
        ("/definitions/pause", {"name": "ghost"}, 404, "definition &#39;ghost&#39; does not exist"),
        ("/definitions/run-now", {"name": "x" * 201}, 400, "name is 201 characters long"),
        ("/runs/bulk/retry", {"since": "soon"}, 400, "since must be an ISO 8601 time"),
        ("/queues/pause", {"name": ""}, 400, "name must be a non-empty text"),
    ]
    for path, fields, status, message in cases:
        response = post(client, path, csrf, **fields)
        assert response.status_code == status, f"{path}: {response.status_code} {response.text[-300:]}"
        assert message in response.text, f"{path}: {message!r} missing"
    assert [r[1] for r in audit_rows(conn)] == ["login"]


def test_hostile_names_payloads_and_errors_are_escaped(client: TestClient, seeded: Seeded) -> None:
    csrf = login(client)  # logged in, so the action forms (with names in fields) render too
    assert csrf
    paths = [
        "/",
        "/definitions",
        "/definition?" + urlencode({"name": HOSTILE_NAME}),
        "/runs",
        "/runs?status=FAILED",
        f"/runs/{seeded.hostile_run}",
        "/runs?" + urlencode({"kind": "<b>bold</b>", "definition": HOSTILE_NAME}),
        "/preview?" + urlencode({"schedule": "<script>x</script>", "tz": "UTC"}),
    ]
    for path in paths:
        text = client.get(path).text
        for raw in (HOSTILE_NAME, HOSTILE_PAYLOAD, HOSTILE_ERROR, "<b>bold</b>", "<script>x</script>"):
            assert raw not in text, f"{path} contains unescaped {raw!r}"
    run_page = client.get(f"/runs/{seeded.hostile_run}").text
    assert escape(HOSTILE_ERROR) in run_page
    assert escape(HOSTILE_PAYLOAD) in run_page
    assert escape(HOSTILE_NAME) in client.get("/definitions").text


def test_a_run_and_a_definition_show_the_numbers_of_their_json_with_every_digit(
    client: TestClient, conn: Conn
) -> None:
    """jsonb keeps a number as a numeric, exactly; read as a float it would keep 17
    significant digits and the page would show another amount."""
    payload = '{"amount": 12345678901234567890.123456789, "rate": 0.1000000000000000055511151231257827}'
    result = '{"total": 98765432109876543210.987654321, "price": 1.50}'
    run = int(scalar(conn, "SELECT id FROM jobs.enqueue('invoice', %s::jsonb)", (payload,)))
    assert scalar(conn, "SELECT count(*) FROM jobs.claim(1, 'w1', kinds => '{invoice}')") == 1
    assert scalar(conn, "SELECT jobs.complete(%s, 'w1', %s::jsonb)", (run, result)) is True
    conn.execute(
        "SELECT jobs.define('billing', 'invoice', schedule => '0 3 * * *', payload => %s::jsonb)", (payload,)
    )
    run_page = client.get(f"/runs/{run}").text
    definition_page = client.get("/definition?" + urlencode({"name": "billing"})).text
    for digits in ("12345678901234567890.123456789", "0.1000000000000000055511151231257827"):
        assert digits in run_page and digits in definition_page, digits
    for digits in ("98765432109876543210.987654321", "1.50"):
        assert digits in run_page, digits


def test_a_login_without_the_operator_role_gets_a_read_only_dashboard(
    db: Database, seeded: Seeded, conn: Conn
) -> None:
    with _client(db.dsn_as("pgtick_t_reader"), Secret.from_plain(PASSWORD)) as reader:
        for path in pages(seeded):
            assert reader.get(path).status_code == 200, path
        response = reader.post("/login", data={"csrf": csrf_of(reader), "name": "bob", "password": PASSWORD})
        assert response.status_code == 403
        assert "not a member of jobs_operator" in response.text
        assert "operator: bob" not in reader.get("/").text, "a login that could not be audited took effect"
    assert status_of(conn, seeded.queued) == "QUEUED"


def test_a_grant_or_revoke_of_the_operator_role_takes_effect_at_the_next_request(
    db: Database, seeded: Seeded, conn: Conn
) -> None:
    """The dashboard reads the login's roles in each request's transaction, not once at
    start: granted jobs_operator while it runs, the login can act without a restart; revoked,
    an action is refused with the reason, nothing changed."""
    with db.login_without_grants("dash") as name:
        role = sql.Identifier(name)
        conn.execute(sql.SQL("GRANT jobs_reader TO {}").format(role))
        with _client(db.dsn_as(name), Secret.from_plain(PASSWORD)) as dashboard:
            refused = dashboard.post(
                "/login", data={"csrf": csrf_of(dashboard), "name": "bob", "password": PASSWORD}
            )
            assert refused.status_code == 403 and "not a member of jobs_operator" in refused.text
            conn.execute(sql.SQL("GRANT jobs_operator TO {}").format(role))
            csrf = login(dashboard, "bob")
            assert 'action="/runs/' in dashboard.get(f"/runs/{seeded.queued}").text, "no action offered"
            conn.execute(sql.SQL("REVOKE jobs_operator FROM {}").format(role))
            response = post(dashboard, f"/runs/{seeded.queued}/cancel", csrf)
            assert response.status_code == 403, response.text
            assert "not a member of jobs_operator" in response.text
            assert status_of(conn, seeded.queued) == "QUEUED"
            assert 'action="/runs/' not in dashboard.get(f"/runs/{seeded.queued}").text, "an action offered"


def test_without_an_operator_password_the_dashboard_is_read_only(db: Database, seeded: Seeded) -> None:
    with _client(db.dsn_as("pgtick_t_operator"), None) as anonymous:
        assert "started without an operator password" in anonymous.get("/login").text
        assert 'action="/login"' not in anonymous.get("/login").text
        response = anonymous.post("/login", data={"csrf": "any", "name": "x", "password": PASSWORD})
        assert response.status_code == 403


def test_pages_read_as_jobs_reader_in_a_read_only_transaction_and_act_as_jobs_operator(
    db: Database, seeded: Seeded
) -> None:
    async def check() -> None:
        web_db = WebDatabase(db.dsn_as("pgtick_t_operator"))
        await web_db.open()
        try:
            async with web_db.reading() as conn:
                row = await (await conn.execute("SELECT current_user AS who")).fetchone()
                assert row == {"who": "jobs_reader"}
                row = await (await conn.execute("SHOW transaction_read_only")).fetchone()
                assert row == {"transaction_read_only": "on"}
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    await conn.execute("SELECT jobs.cancel(%s)", (seeded.queued,))
            async with web_db.acting() as conn:
                row = await (await conn.execute("SELECT current_user AS who")).fetchone()
                assert row == {"who": "jobs_operator"}
        finally:
            await web_db.close()

    asyncio.run(check())


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--bind", "localhost"], {}, "--bind must be HOST:PORT"),
        (["--bind", "127.0.0.1:http"], {}, "--bind port must be a number"),
        (["--bind", "127.0.0.1:70000"], {}, "--bind port must be between 0 and 65535"),
        ([], {"PGTICK_WEB_PASSWORD": "short"}, "at least 8 characters"),
        (["--password-file", "/nonexistent/pgtick-password"], {}, "cannot read --password-file"),
        (["--db-timeout", "0"], {}, "--db-timeout: duration must be positive"),
        (["--db-timeout", "2h"], {}, "--db-timeout: must be at most 1h"),
    ],
)
def test_pgtick_web_refuses_bad_options_with_one_line_and_exit_2(
    db: Database, args: list[str], env: dict[str, str], message: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pgtick.cli", "web", "--dsn", db.dsn, *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def _web(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgtick.cli", "web", *args], capture_output=True, text=True, timeout=120
    )


def test_pgtick_web_that_cannot_start_says_why_in_one_line_and_exits_1(pg: Server, db: Database) -> None:
    """A server it cannot reach, a database without the jobs schema, an address that is taken
    or does not resolve: one line at once, exit 1, before anything is announced as served."""
    empty = pg.create_empty_database()
    try:
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            taken = f"127.0.0.1:{held.getsockname()[1]}"
            cases = [
                (["--dsn", "postgresql://nobody@127.0.0.1:1/none"], "cannot connect to PostgreSQL"),
                (["--dsn", empty.dsn, "--bind", "127.0.0.1:0"], "the jobs schema is not installed"),
                (["--dsn", db.dsn, "--bind", taken], f"--bind {taken}: cannot listen: "),
                (["--dsn", db.dsn, "--bind", "256.1.1.1:8080"], "--bind 256.1.1.1:8080: cannot listen: "),
            ]
            for args, message in cases:
                proc = _web(*args)
                assert proc.returncode == 1, (args, proc.stderr)
                lines = proc.stderr.strip().splitlines()
                assert len(lines) == 1 and message in lines[0], (args, proc.stderr)
    finally:
        pg.drop_database(empty)


# Queues, limits and dependencies as the flow-control schema names them (jobs.queues,
# jobs.pause_queue/resume_queue, jobs.limits, runs.queue, runs.depends_on): created here by
# hand, so this test shows the dashboard picks them up when a database has them.
FLOW_LIMITS = """
SELECT jobs.set_limit('queue', 'default', max_running => 1);
SELECT jobs.set_limit('queue', '<b>bulk</b>', max_running => 5);
"""


def test_queues_limits_and_dependencies_are_shown_and_queues_paused(
    db: Database, seeded: Seeded, conn: Conn
) -> None:
    conn.execute(FLOW_LIMITS)
    conn.execute("UPDATE jobs.runs SET depends_on = %s WHERE id = %s", ([seeded.chain[0]], seeded.queued))
    with _client(db.dsn_as("pgtick_t_operator"), Secret.from_plain(PASSWORD)) as flow:
        overview = flow.get("/").text
        assert 'id="queues"' in overview and 'id="limits"' in overview
        assert "at limit" in overview and "&lt;b&gt;bulk&lt;/b&gt;" in overview
        assert f'data-run="{seeded.queued}"' in flow.get("/runs?queue=default").text
        assert "No runs match" in flow.get("/runs?queue=other").text
        run_page = flow.get(f"/runs/{seeded.queued}").text
        assert 'id="dependencies"' in run_page and f'href="/runs/{seeded.chain[0]}"' in run_page
        assert f'href="/runs/{seeded.queued}"' in flow.get(f"/runs/{seeded.chain[0]}").text
        csrf = login(flow)
        assert post(flow, "/queues/pause", csrf, name="default").status_code == 303
        assert conn.execute("SELECT name FROM jobs.paused_queues").fetchall() == [("default",)]
        assert post(flow, "/queues/resume", csrf, name="default").status_code == 303
        assert conn.execute("SELECT count(*) FROM jobs.paused_queues").fetchone() == (0,)
        # Resumed again: nothing changes, and the page and the audit log say so.
        again = post(flow, "/queues/resume", csrf, name="default")
        assert again.status_code == 303
        assert "queue default was not paused" in flow.get(again.headers["location"]).text
    assert [(r[1], r[2], r[3]) for r in audit_rows(conn)][1:] == [
        ("pause_queue", "queue default", {"changed": True}),
        ("resume_queue", "queue default", {"changed": True}),
        ("resume_queue", "queue default", {"changed": False}),
    ]


def test_the_charts_are_in_utc_and_a_per_key_limit_is_not_at_limit_by_its_total(
    db: Database, conn: Conn
) -> None:
    """The charts say UTC and are in UTC whatever zone the database gives its sessions; a
    queue whose limit holds per key is not "at limit" because its keys together reach it."""
    conn.execute(sql.SQL("ALTER DATABASE {} SET timezone = 'Asia/Kolkata'").format(sql.Identifier(db.name)))
    conn.execute("SELECT jobs.set_limit('queue', 'mail', max_running => 2, per_key => true)")
    for key in ("a", "b", "a"):
        conn.execute("SELECT jobs.enqueue('send', queue => 'mail', concurrency_key => %s)", (key,))
    claimed = conn.execute("SELECT id FROM jobs.claim(10, 'w')").fetchall()
    assert len(claimed) == 3, "two runs of key a and one of b start: key a has room for two"
    with _client(db.dsn_as("pgtick_t_operator"), Secret.from_plain(PASSWORD)) as client:
        before = datetime.now(UTC)
        overview = client.get("/").text
        after = datetime.now(UTC)
    chart = re.search(r'<svg class="chart".*?</svg>', overview, re.S)
    assert chart is not None and "(UTC)" in chart.group(0)
    first = re.findall(r'class="axis">(\d\d:\d\d)</text>', chart.group(0))[0]
    starts = {
        (t.replace(second=0, microsecond=0) - timedelta(minutes=59)).strftime("%H:%M")
        for t in (before, after)
    }
    assert first in starts, f"the chart's first minute is {first}; in UTC the last hour began at {starts}"
    queues = re.search(r'<section id="queues">.*?</section>', overview, re.S)
    assert queues is not None, "the overview lists the queues"
    (mail_row,) = [row for row in queues.group(0).split("<tr>") if ">mail</td>" in row]
    assert "at limit" not in mail_row, "3 RUNNING under a limit of 2 per key, no key at its limit"
    conn.execute("SELECT jobs.enqueue('send', queue => 'mail', concurrency_key => 'a')")
    assert conn.execute("SELECT id FROM jobs.claim(10, 'w')").fetchall() == [], "key a is at its limit"


def cookie_attributes(set_cookie: str) -> set[str]:
    """The attributes of a Set-Cookie header after its name=value, lower case, without values
    but SameSite's (``{"httponly", "path", "samesite=strict", "secure"}``)."""
    parts = [p.strip().lower() for p in set_cookie.split(";")[1:]]
    return {p if p.startswith("samesite") else p.split("=")[0] for p in parts}


HTTP, HTTPS = "http://127.0.0.1:8080", "https://127.0.0.1:8080"


@pytest.mark.parametrize(
    ("option", "base_url", "forwarded", "secure"),
    [
        ("", HTTP, None, False),
        ("", HTTP, "https", False),  # any client can send the header: not trusted by default
        ("cookie_secure", HTTP, None, True),  # (the proxy in front speaks HTTPS)
        ("", HTTPS, None, True),  # the server speaks TLS itself
        ("trust_proxy", HTTP, "https", True),
        ("trust_proxy", HTTP, "HTTPS", True),
        ("trust_proxy", HTTP, "http", False),
        ("trust_proxy", HTTP, None, False),
        ("trust_proxy", HTTP, "https, http", False),  # the client's, then the proxy's
    ],
)
def test_the_session_cookie_is_secure_when_the_browser_reaches_the_dashboard_over_https(
    db: Database, option: str, base_url: str, forwarded: str | None, secure: bool
) -> None:
    """Secure when told so, when served over TLS, or when a trusted proxy says the request
    came over https; HttpOnly and SameSite=Strict always."""
    app = create_app(
        db.dsn_as("pgtick_t_operator"),
        Secret.from_plain(PASSWORD),
        cookie_secure=option == "cookie_secure",
        trust_proxy=option == "trust_proxy",
    )
    headers = {} if forwarded is None else {"X-Forwarded-Proto": forwarded}
    with TestClient(app, base_url=base_url) as client:
        response = client.get("/login", headers=headers)
    assert response.status_code == 200, response.text
    attributes = cookie_attributes(response.headers["set-cookie"])
    assert {"httponly", "samesite=strict"} <= attributes, attributes
    assert ("secure" in attributes) == secure, attributes


def test_the_session_cookie_a_login_sets_behind_a_trusted_proxy_is_secure(db: Database) -> None:
    """The new session of a login (and of a logout) is marked as the first one was."""
    app = create_app(db.dsn_as("pgtick_t_operator"), Secret.from_plain(PASSWORD), trust_proxy=True)
    proxied = {"X-Forwarded-Proto": "https"}
    with TestClient(app, base_url=HTTP) as client:  # (sends back no Secure cookie over http)
        first = client.get("/login", headers=proxied)
        session = first.headers["set-cookie"].split(";")[0]
        token = re.search(r'name="csrf" value="([^"]+)"', first.text)
        assert token is not None
        response = client.post(
            "/login",
            data={"csrf": token.group(1), "name": "alice", "password": PASSWORD},
            headers={**proxied, "Cookie": session},
            follow_redirects=False,
        )
    assert response.status_code == 303, response.text
    rotated = response.headers["set-cookie"]
    assert rotated.split(";")[0] != session, "the login kept the session id"
    assert {"secure", "httponly", "samesite=strict"} <= cookie_attributes(rotated), rotated


def test_behind_a_trusted_proxy_an_operator_logs_in_and_acts_from_the_proxys_site(
    db: Database, seeded: Seeded, conn: Conn
) -> None:
    """Bound to the loopback behind a proxy that terminates TLS (what --trust-proxy is for), the
    browser's Origin names the proxy's site, not the loopback address the proxy connects to:
    the site is the X-Forwarded-Host the proxy sets. Another site stays refused, and without
    --trust-proxy the header is a client's and ignored."""
    proxied = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "dash.example.com"}
    site = {"Origin": "https://dash.example.com"}
    dsn, secret = db.dsn_as("pgtick_t_operator"), Secret.from_plain(PASSWORD)
    app = create_app(dsn, secret, allowed_hosts=LOOPBACK_NAMES, trust_proxy=True)
    with TestClient(app, base_url="https://127.0.0.1:8080", headers=proxied) as client:
        response = client.post(
            "/login",
            data={"csrf": csrf_of(client), "name": "alice", "password": PASSWORD},
            headers=site,
            follow_redirects=False,
        )
        assert response.status_code == 303, f"{response.status_code}: {response.text[-300:]}"
        csrf = csrf_of(client, "/")
        other = client.post(
            f"/runs/{seeded.queued}/cancel", data={"csrf": csrf}, headers={"Origin": "https://evil.example"}
        )
        assert other.status_code == 403, other.status_code
        assert status_of(conn, seeded.queued) == "QUEUED"
        response = client.post(
            f"/runs/{seeded.queued}/cancel", data={"csrf": csrf}, headers=site, follow_redirects=False
        )
        assert response.status_code == 303, f"{response.status_code}: {response.text[-300:]}"
        assert status_of(conn, seeded.queued) == "CANCELLED"
    with TestClient(create_app(dsn, secret), base_url="http://127.0.0.1:8080") as client:
        forged = {"X-Forwarded-Host": "evil.example", "Origin": "http://evil.example"}
        response = client.post(
            "/login", data={"csrf": csrf_of(client), "name": "eve", "password": PASSWORD}, headers=forged
        )
        assert response.status_code == 403, response.status_code


def test_a_client_gone_while_sending_its_form_is_no_fault_of_the_dashboard(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A browser closed, or a network cut, while a POST's body was on its way: nobody waits
    for an answer and nothing is wrong with the dashboard, so nothing is logged as an error
    and nothing reaches the server as an exception (uvicorn logged a traceback for each)."""
    app = create_app(db.dsn_as("pgtick_t_operator"), Secret.from_plain(PASSWORD))
    messages: list[Message] = [
        {"type": "http.request", "body": b"csrf=abc&name=al", "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        pass

    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/login",
        "raw_path": b"/login",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:8080"),
            (b"content-type", b"application/x-www-form-urlencoded"),
            (b"content-length", b"100"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }
    with TestClient(app, base_url=HTTP) as client, caplog.at_level(logging.INFO):
        assert client.portal is not None
        client.portal.call(app, scope, receive, send)
        assert client.get("/login").status_code == 200
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


@pytest.mark.parametrize(
    ("options", "forwarded", "secure"),
    [([], "https", False), (["--cookie-secure"], None, True), (["--trust-proxy"], "https", True)],
)
def test_pgtick_web_marks_the_session_cookie_secure_as_its_options_say(
    db: Database, options: list[str], forwarded: str | None, secure: bool
) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*PGTICK, "web", "--dsn", db.dsn, "--bind", f"127.0.0.1:{port}", *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    request = urllib.request.Request(f"http://127.0.0.1:{port}/")
    if forwarded is not None:
        request.add_header("X-Forwarded-Proto", forwarded)

    def set_cookie() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(
                f"pgtick web exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return str(response.headers["set-cookie"])
        except OSError:
            return None

    try:
        attributes = cookie_attributes(wait_for("pgtick web to answer", set_cookie, 90))
    finally:
        terminate(proc, 60)
    assert {"httponly", "samesite=strict"} <= attributes, attributes
    assert ("secure" in attributes) == secure, attributes


def test_pgtick_run_serves_the_dashboard_beside_its_worker(db: Database, seeded: Seeded) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    app = Path(__file__).resolve().parents[2] / "examples" / "app.py"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgtick.cli",
            "run",
            str(app),
            "--dsn",
            db.dsn,
            "--no-scheduler",
            "--web",
            f"127.0.0.1:{port}",
        ],
        env={**os.environ, "PGTICK_WEB_PASSWORD": PASSWORD},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def running_page() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(
                f"pgtick run exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/running", timeout=5) as response:
                return str(response.read().decode())
        except OSError:
            return None

    try:
        page = wait_for("the dashboard beside pgtick run", running_page, 90)
        assert f'data-run="{seeded.running}"' in page
    finally:
        terminate(proc, 60)


def test_pgtick_run_refuses_a_bad_web_address_with_one_line_and_exit_2(db: Database) -> None:
    app = Path(__file__).resolve().parents[2] / "examples" / "app.py"
    proc = subprocess.run(
        [sys.executable, "-m", "pgtick.cli", "run", str(app), "--dsn", db.dsn, "--web", "nowhere"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip()
        == "pgtick run: error: --web must be HOST:PORT such as 127.0.0.1:8080, got 'nowhere'"
    )


def test_definitions_show_their_effective_dst_policy_and_next_runs_follow_it(
    client: TestClient, conn: Conn
) -> None:
    # 02:30 on Sundays in March in New York: the second Sunday's is in the spring-forward gap.
    conn.execute(
        "SELECT jobs.define(name => 'ny-gap-skip', kind => 'report', schedule => '30 2 * 3 0',"
        " timezone => 'America/New_York', dst_gap => 'skip')"
    )
    listing = client.get("/definitions").text
    skip_row = listing[listing.index('data-name="ny-gap-skip"') :].split("</tr>")[0]
    assert "gap skip · repeat first (auto)" in skip_row, skip_row
    auto_row = listing[listing.index('data-name="berlin-sunday-0230"') :].split("</tr>")[0]
    assert "gap end (auto) · repeat first (auto)" in auto_row, auto_row
    health = conn.execute(
        "SELECT dst_gap, dst_repeat FROM jobs.definition_health WHERE name = 'ny-gap-skip'"
    ).fetchone()
    assert health == ("skip", "first")
    page = client.get("/definition?name=ny-gap-skip").text
    policies = page[page.index('id="policies"') :].split("</dl>")[0]
    assert "<dd>skip</dd>" in policies and "first" in policies, policies
    upcoming = page[page.index('id="upcoming"') :].split("</table>")[0]
    rows = upcoming.split("<tr")[2:]
    skipped = [row for row in rows if "DST gap: skipped" in row]
    assert skipped and all("<td>skipped</td>" in row for row in skipped), rows
    assert all("DST gap: moved" not in row for row in rows), rows


def test_a_next_run_at_a_dst_change_carries_the_mark_its_upcoming_runs_give_it(
    client: TestClient, conn: Conn
) -> None:
    """The next run in the list of definitions is marked as the schedule module marks that
    occurrence on the definition's page: 03:00 EDT on the spring-forward day is no moved run
    for a job at 03:00 nor for an hourly one whose gap hour is skipped, while 02:30 read with
    the offset before the gap (03:30 EDT) is moved, and 01:30 EST on the fall-back day is the
    second of two readings."""
    spring_end = datetime(2027, 3, 14, 7, tzinfo=UTC)  # 03:00 EDT, where the gap ends
    cases = {
        "ny-at-three": ("0 3 * * *", None, None, spring_end),
        "ny-hourly": ("0 * * * *", None, None, spring_end),
        "ny-shifted": ("30 2 * * *", "shift", None, spring_end + timedelta(minutes=30)),
        "ny-second": ("30 1 * * *", None, "second", datetime(2027, 11, 7, 6, 30, tzinfo=UTC)),
    }
    for name, (schedule, gap, repeat, next_start) in cases.items():
        conn.execute(
            "SELECT jobs.define(name => %s, kind => 'report', schedule => %s,"
            " timezone => 'America/New_York', dst_gap => %s, dst_repeat => %s)",
            (name, schedule, gap, repeat),
        )
        conn.execute("UPDATE jobs.definitions SET next_run_at = %s WHERE name = %s", (next_start, name))
    listing = client.get("/definitions").text
    marks = {}
    for name, (*_, next_start) in cases.items():
        row = listing[listing.index(f'data-name="{name}"') :].split("</tr>")[0]
        assert next_start.strftime("%Y-%m-%d %H:%M") in row, row
        titles = re.findall(r'<span class="badge dst" title="([^"]*)"', row)
        marks[name] = [html_unescape(t) for t in titles if not t.startswith("UTC offset")]
        schedule, gap, repeat, _ = cases[name]
        # What the definition's page lists for that occurrence (its upcoming runs, computed
        # from the second before it).
        created = scalar(conn, "SELECT created_at FROM jobs.definitions WHERE name = %s", (name,))
        upcoming = timeview.occurrences(
            schedule,
            "America/New_York",
            after=next_start - timedelta(seconds=1),
            count=1,
            created_at=created,
            policy=(gap, repeat),
        )
        runs = [o for o in upcoming if o.utc is not None]
        assert runs[0].utc == next_start, upcoming
        assert marks[name] == [m for m in runs[0].marks if not m.startswith("UTC offset")], (name, upcoming)
    assert marks == {
        "ny-at-three": [],
        "ny-hourly": [],
        "ny-shifted": ["DST gap: moved (shift)"],
        "ny-second": ["DST repeat: second of two"],
    }, marks


def test_a_definitions_next_runs_show_consecutive_skipped_wall_times_as_one_row(
    client: TestClient, conn: Conn
) -> None:
    """Every ten minutes from 01:00 to 02:50 on the second Sunday of March in New York, the
    gap skipped: each year's six wall times in the gap are one row from the first to the last,
    with how many, not six rows."""
    conn.execute(
        "SELECT jobs.define(name => 'ny-gap-minutes', kind => 'report', timezone => 'America/New_York',"
        " schedule => 'FREQ=YEARLY;BYMONTH=3;BYDAY=2SU;BYHOUR=1,2;BYMINUTE=0,10,20,30,40,50',"
        " dst_gap => 'skip')"
    )
    page = client.get("/definition?name=ny-gap-minutes").text
    upcoming = page[page.index('id="upcoming"') :].split("</table>")[0]
    rows = upcoming.split("<tr")[2:]
    skipped = [row for row in rows if "DST gap: skipped" in row]
    # Ten runs: 2027's six at 01:xx, then 2028's first four; 2027's gap between them.
    assert len(rows) == 11 and len(skipped) == 1, rows
    assert re.search(r"<td>2027-03-14 02:00:00 Sun \w* to 02:50:00 \(6 wall times\)</td>", skipped[0]), (
        skipped
    )


def test_a_definition_without_a_next_run_has_its_page(client: TestClient, conn: Conn) -> None:
    """A one-shot, a schedule that has ended and one paused show their page: no next run
    where there is none, never an error."""
    conn.execute("SELECT jobs.define('once', 'report', run_at => now() + interval '2 days')")
    conn.execute(
        "SELECT jobs.define('ended', 'report',"
        " schedule => 'DTSTART:20200101T000000Z\nRRULE:FREQ=DAILY;COUNT=2')"
    )
    conn.execute("UPDATE jobs.definitions SET finished_at = now() WHERE name = 'ended'")
    for name in ("once", "ended"):
        page = client.get(f"/definition?name={name}")
        assert page.status_code == 200, (name, page.status_code, page.text[:300])
        assert "next run</dt>" not in page.text, name
    assert "runs at</dt>" in client.get("/definition?name=once").text


def test_a_preview_of_a_schedule_slow_to_expand_shows_what_it_found_in_its_time(client: TestClient) -> None:
    """A second of each leap day, stepped 7 seconds at a time, is seconds of work between two
    occurrences: the page answers after its budget with the occurrences found and says why
    there are not more."""
    rule = "FREQ=SECONDLY;INTERVAL=7;BYMONTH=2;BYMONTHDAY=29;BYHOUR=23;BYMINUTE=59;BYSECOND=59"
    started = time.monotonic()
    page = client.get("/preview", params={"schedule": rule, "count": "1000"})
    took = time.monotonic() - started
    assert page.status_code == 200, page.text[:300]
    assert 'id="preview-note"' in page.text and "took more than 2 s to expand" in page.text, page.text[-800:]
    assert page.text.count("<tr") - 1 < 1000
    assert took < 60, f"{took:.1f} s"


def test_a_fault_of_the_dashboard_is_its_error_page_with_its_headers(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception the dashboard does not expect answers 500 with the error page and the
    headers every page carries (the server's bare text has none); static files are nosniff."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a fault")

    monkeypatch.setattr(timeview, "occurrences", broken)
    app = create_app(db.dsn_as("pgtick_t_operator"), Secret.from_plain(PASSWORD))
    with TestClient(app, base_url="http://127.0.0.1:8080", raise_server_exceptions=False) as client:
        page = client.get("/preview?schedule=0+9+*+*+*")
        assert page.status_code == 500, page.text[:300]
        assert "internal error of the dashboard" in page.text
        assert page.headers["content-security-policy"] and page.headers["cache-control"] == "no-store"
        assert client.get("/static/style.css").headers["x-content-type-options"] == "nosniff"


def test_preview_marks_what_the_schedule_module_did_to_each_occurrence() -> None:
    from datetime import UTC, datetime

    from pgtick.web import timeview

    after = datetime(2027, 3, 1, tzinfo=UTC)
    shifted = timeview.occurrences("30 2 * * *", "America/New_York", after=after, count=20)
    gap_day = next(o for o in shifted if o.local.day == 14)
    assert gap_day.utc is not None and any("DST gap: moved" in m for m in gap_day.marks), gap_day
    skipped = timeview.occurrences(
        "30 2 * * *", "America/New_York", after=after, count=20, policy=("skip", None)
    )
    assert [o.utc for o in skipped if o.local.day == 14 and o.local.month == 3] == [None], skipped
    assert len([o for o in skipped if o.utc is not None]) == 20


def test_the_preview_form_reads_a_dst_policy_as_pgtick_preview_does(client: TestClient) -> None:
    """The form's DST gap and repeat are --dst-gap and --dst-repeat: a daily 01:30 in New York
    told to run both readings runs twice on the fall-back day, an hour apart, and the page names
    the effective policy as the command heads its list; a value of neither is refused by name."""
    params = {
        "schedule": "30 1 * * *",
        "tz": "America/New_York",
        "after": "2027-11-06T12:00",
        "count": "3",
        "dst_repeat": "both",
    }
    page = client.get("/preview", params=params)
    assert page.status_code == 200, page.text[-500:]
    table = page.text[page.text.index('id="preview"') :].split("</table>")[0]
    rows = table.split("<tr")[2:]
    fall = [row for row in rows if "2027-11-07" in row]
    assert len(fall) == 2 and all("DST repeat: runs at both readings" in row for row in fall), rows
    expected = parse_schedule(
        "30 1 * * *", "America/New_York", anchor=datetime(2027, 11, 6, tzinfo=UTC), dst_repeat="both"
    ).between(datetime(2027, 11, 6, 17, tzinfo=UTC), datetime(2027, 11, 8, 17, tzinfo=UTC), limit=3)
    assert [t.strftime("%H:%M") for t in expected[:2]] == ["05:30", "06:30"]
    for row, at in zip(fall, expected[:2], strict=True):
        assert at.strftime("%Y-%m-%d %H:%M") in row, (row, at)
    policy = page.text[page.text.index('id="preview-policy"') :].split("</p>")[0]
    assert "dst_gap=end (auto) dst_repeat=both" in policy and "(auto)" not in policy.split("dst_repeat")[1]
    assert "<option selected>both</option>" in page.text
    bad = client.get("/preview", params={**params, "dst_gap": "later"})
    assert bad.status_code == 400
    assert "dst_gap must be shift, end or skip (or auto), got &#39;later&#39;" in bad.text, bad.text[-800:]


def _scans(conn: Conn, query: str, params: Any) -> list[str]:
    """The scans of a statement's plan, as "Seq Scan runs" or "Index Scan runs runs_pkey"."""
    plan = conn.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()
    assert plan is not None
    found: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if "Scan" in node["Node Type"]:
            found.append(
                " ".join(filter(None, (node["Node Type"], node.get("Relation Name"), node.get("Index Name"))))
            )
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0][0]["Plan"])
    return found


def test_a_page_of_runs_reads_as_many_runs_as_it_shows(
    db: Database, client: TestClient, seeded: Seeded, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of 50 runs says of each whether it was retried: 50 probes of the retry_of
    index, not a read of every run (which a plan hashing the retried runs does, and which
    grows with the history)."""
    history(conn, 20_000)
    conn.execute("ANALYZE jobs.runs")
    sent: list[tuple[str, Any]] = []
    execute = psycopg.AsyncConnection.execute

    async def record(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        sent.append((query if isinstance(query, str) else query.as_string(self), params))
        return await execute(self, query, params, **kw)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", record)
    for path in ["/runs", "/runs?status=FAILED", "/runs?kind=report", f"/runs?before={seeded.queued}"]:
        sent.clear()
        assert client.get(path).status_code == 200, path
        listing = [(q, p) for q, p in sent if "ORDER BY r.id DESC" in q]
        assert len(listing) == 1, f"{path}: {[q for q, _ in sent]}"
        scans = _scans(conn, *listing[0])
        assert not [s for s in scans if s.startswith("Seq Scan runs")], f"{path}: {scans}"


def test_pages_and_actions_run_without_jit_compilation(db: Database, seeded: Seeded, conn: Conn) -> None:
    """The dashboard's statements are short, but the planner's estimates for some (every
    definition with its streaks, over a large history) pass jit_above_cost: compiling them
    took over half a second of each /definitions page on a server with JIT, for a statement
    that runs in milliseconds. The dashboard's transactions turn JIT off, whatever the
    server, database or login sets."""
    conn.execute(sql.SQL("ALTER DATABASE {} SET jit = on").format(sql.Identifier(db.name)))

    async def check() -> None:
        web_db = WebDatabase(db.dsn_as("pgtick_t_operator"))
        await web_db.open()
        try:
            async with web_db.reading() as page:
                assert await (await page.execute("SHOW jit")).fetchone() == {"jit": "off"}
            async with web_db.acting() as action:
                assert await (await action.execute("SHOW jit")).fetchone() == {"jit": "off"}
            async with web_db.reading() as page:  # (and only for its own transactions)
                await page.execute("SELECT 1")
            async with web_db.pool.connection() as idle:
                assert await (await idle.execute("SHOW jit")).fetchone() == {"jit": "on"}
        finally:
            await web_db.close()

    asyncio.run(check())


def _definitions_row(client: TestClient, name: str) -> str:
    listing = client.get("/definitions").text
    return listing[listing.index(f'data-name="{name}"') :].split("</tr>")[0]


def test_the_next_run_on_the_definitions_page_is_the_next_start_the_cli_shows(
    db: Database, client: TestClient, conn: Conn
) -> None:
    """The dashboard and `pgtick definitions` / `pgtick status` show one next start per
    definition: a run waiting on dependencies does not start at its time, a run queued by
    hand starts before the next occurrence, and a paused definition's queued run still
    starts (with nothing queued, a paused definition starts nothing)."""
    start = scalar(conn, "SELECT date_trunc('hour', now()) + interval '1 day'")
    at = [start + timedelta(minutes=m) for m in (0, 10, 20)]

    def define(name: str, times: list[datetime]) -> list[int]:
        def_id = scalar(conn, "SELECT id FROM jobs.define(%s, 'report', schedule => '*/10 * * * *')", (name,))
        conn.execute("SELECT jobs.materialize(%s, NULL, '{}', %s)", (def_id, start))
        conn.execute("SELECT jobs.materialize(%s, %s, %s::timestamptz[], %s)", (def_id, start, times, at[-1]))
        return [
            r[0]
            for r in conn.execute("SELECT id FROM jobs.runs WHERE definition_id = %s ORDER BY id", (def_id,))
        ]

    blocked = define("next-blocked", at[:2])
    conn.execute("UPDATE jobs.runs SET blocked = TRUE WHERE id = %s", (blocked[0],))
    define("next-by-hand", at[:1])
    by_hand = scalar(conn, "SELECT scheduled_for FROM jobs.run_now('next-by-hand')")
    define("next-paused", at[1:2])
    conn.execute("SELECT jobs.pause('next-paused')")
    define("next-paused-empty", [])
    conn.execute("SELECT jobs.pause('next-paused-empty')")
    expected = {
        "next-blocked": at[1],
        "next-by-hand": by_hand,
        "next-paused": at[1],
        "next-paused-empty": None,
    }

    listed = {d["name"]: d for d in json.loads(_cli("definitions", "--json", "--dsn", db.dsn))}
    health = {d["name"]: d for d in json.loads(_cli("status", "--json", "--dsn", db.dsn))["definitions"]}
    for name, when in expected.items():
        for source, rows in (("pgtick definitions", listed), ("pgtick status", health)):
            shown = rows[name]["next_start_at"]
            assert (shown and datetime.fromisoformat(shown)) == when, f"{source} {name}: {shown}, not {when}"
        row = _definitions_row(client, name)
        if when is None:
            assert '<td class="muted">paused</td>' in row, f"{name}: {row}"
        else:
            utc = when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
            assert f'<td class="t">{utc}</td>' in row, f"{name} shows another next run than {utc}: {row}"
        page = client.get("/definition", params={"name": name}).text
        if when is None:
            assert "next run</dt>" not in page, name
        else:
            assert f"{utc}</dd>" in page.split("next run</dt>")[1].split("</dd>")[0] + "</dd>", name


def _cli(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "pgtick.cli", *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_one_failed_run_is_counted_in_the_singular(client: TestClient, conn: Conn) -> None:
    run_id = scalar(conn, "SELECT id FROM jobs.enqueue('lonely', '{}')")
    conn.execute("SELECT jobs.claim(1, 'w', ARRAY['lonely'])")
    conn.execute("SELECT jobs.fail(%s, 'w', '{E}', 'gone')", (run_id,))
    listed = client.get("/runs?status=FAILED&kind=lonely").text
    assert "1 failed run matches this filter" in listed, listed[listed.find('id="bulk"') :][:400]
    login(client)
    form = client.get("/runs?status=FAILED&kind=lonely").text
    assert "Retry 1 failed run?" in form and "Delete 1 failed run from the history?" in form


def test_a_jittered_definitions_next_runs_are_its_starts_as_the_cli_preview_shows_them(
    db: Database, client: TestClient, conn: Conn
) -> None:
    """With jitter, each occurrence starts later by its definition's jobs.jitter_offset: the next
    runs on the definition's page are those starts, as `pgtick preview --definition` lists them
    and as the scheduler queues them, not the occurrences before their jitter."""
    conn.execute(
        "SELECT jobs.define('jittered', 'report', schedule => '0 3 * * *', jitter => interval '30 minutes')"
    )
    page = client.get("/definition?name=jittered").text
    upcoming = page[page.index('id="upcoming"') :].split("</table>")[0]
    shown = re.findall(r"<td>(\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ)</td>", upcoming)
    preview = _cli("preview", "--definition", "jittered", "--count", "10", "--dsn", db.dsn)
    starts = [
        datetime.fromisoformat(m.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M:%SZ")
        for m in re.findall(r"\s(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)", preview)
    ]
    assert len(shown) == 10 and shown == starts, f"page {shown}\npreview\n{preview}"
    assert any(not start.endswith("03:00:00Z") for start in starts), preview
