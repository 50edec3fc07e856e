"""The dashboard in a real browser: headless Chromium (Debian's package, driven by
Playwright) against ``pgtick web`` served by uvicorn on a free port, on a database with
schedules across DST changes, runs of every status, a retry chain and a definition at its
cap. Clicks pause, resume, run now, cancel, retry and bulk retry, then checks the database.

Screenshots of every page go to $PGTICK_SCREENSHOTS (default tests/web/screenshots/).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
from playwright.sync_api import Dialog, Page, sync_playwright
from web_seed import HOSTILE_NAME, Seeded, history, seed

from harness import Database, terminate, wait_for

CHROMIUM = os.environ.get("PGTICK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = Path(os.environ.get("PGTICK_SCREENSHOTS") or Path(__file__).resolve().parent / "screenshots")
PASSWORD = "correct horse battery"
Conn = psycopg.Connection[Any]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.fixture
def dashboard(db: Database) -> Iterator[tuple[str, Seeded]]:
    """`pgtick web` on a free loopback port, as the operator test login, over a seeded database."""
    with db.connect() as conn:
        history(conn, 1500)
        seeded = seed(conn)
    port = _free_port()
    env = {**os.environ, "PGTICK_WEB_PASSWORD": PASSWORD}
    env.pop("DATABASE_URL", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgtick.cli",
            "web",
            "--bind",
            f"127.0.0.1:{port}",
            "--dsn",
            db.dsn_as("pgtick_t_operator"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for("the dashboard to answer", lambda: proc.poll() is not None or _answers(base + "/"), 60)
        assert proc.poll() is None, (
            f"pgtick web exited {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}"
        )
        yield base, seeded
    finally:
        terminate(proc, 15)


@pytest.fixture
def page() -> Iterator[Page]:
    if not Path(CHROMIUM).exists():
        raise AssertionError(
            f"{CHROMIUM} not found: install Debian's chromium package (apt-get install chromium)"
        )
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1360, "height": 900})
            context.set_default_timeout(90_000)  # a loaded 2-core machine renders slowly
            yield context.new_page()
        finally:
            browser.close()


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def one(conn: Conn, query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()
    assert row is not None, query
    return row[0]


def test_an_operator_steers_schedules_and_runs_in_a_real_browser(
    dashboard: tuple[str, Seeded], page: Page, db: Database
) -> None:
    base, seeded = dashboard
    alerts: list[str] = []
    errors: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        if dialog.type == "confirm":
            dialog.accept()
        else:  # an alert() can only come from injected markup
            alerts.append(dialog.message)
            dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)

    try:
        _steer(base, seeded, page, db)
    except Exception:
        shot(page, "failure")
        raise
    assert alerts == [], f"markup from the database ran as script: {alerts}"
    assert errors == [], f"browser errors: {errors}"


def _steer(base: str, seeded: Seeded, page: Page, db: Database) -> None:
    with db.connect() as conn:
        # Read-only until logged in: no action buttons anywhere.
        page.goto(base + "/")
        page.wait_for_selector("svg.chart")
        assert page.locator("#kinds table").count() == 1
        assert page.locator("text=read-only").count() >= 1
        shot(page, "overview")

        page.goto(base + "/definitions")
        assert page.locator("button", has_text="pause").count() == 0
        page.click("text=operator login")
        page.fill("input[name=name]", "alice")
        page.fill("input[name=password]", PASSWORD)
        page.click("button:has-text('Log in')")
        page.wait_for_selector("text=operator: alice")
        assert page.url == base + "/definitions", page.url

        row = page.locator("tr[data-name='berlin-sunday-0230']")
        row.locator("button", has_text="pause").click()
        page.wait_for_selector("text=definition berlin-sunday-0230 paused")
        assert one(conn, "SELECT enabled FROM jobs.definitions WHERE name = 'berlin-sunday-0230'") is False
        assert page.locator("tr[data-name='capped'] .badge", has_text="at cap").count() == 1
        shot(page, "definitions")
        page.goto(base + "/definition?" + urlencode({"name": "berlin-sunday-0230"}))
        assert page.locator("#upcoming-paused").is_visible(), "a paused definition's next runs look due"
        shot(page, "definition-paused")
        page.goto(base + "/definitions")
        page.locator("tr[data-name='berlin-sunday-0230']").locator("button", has_text="resume").click()
        page.wait_for_selector("text=definition berlin-sunday-0230 resumed")
        assert one(conn, "SELECT enabled FROM jobs.definitions WHERE name = 'berlin-sunday-0230'") is True

        page.goto(base + "/definition?" + urlencode({"name": "berlin-sunday-0230"}))
        assert page.locator("#upcoming .badge.dst").count() >= 2, "DST moves are not marked"
        shot(page, "definition-dst")
        page.click("button:has-text('run now')")
        page.wait_for_selector("text=queued now")
        manual = one(
            conn,
            "SELECT count(*) FROM jobs.runs r JOIN jobs.definitions d ON d.id = r.definition_id"
            " WHERE d.name = 'berlin-sunday-0230' AND r.origin = 'manual' AND r.status = 'QUEUED'",
        )
        assert manual == 1

        page.goto(base + "/definition?" + urlencode({"name": HOSTILE_NAME}))
        page.goto(base + f"/runs/{seeded.hostile_run}")
        assert page.locator("#payload").inner_text().count("<script>") == 1  # shown as text
        page.click("button:has-text('retry')")
        page.wait_for_selector(f"text=run {seeded.hostile_run} retried as run")
        assert (
            one(conn, "SELECT status::text FROM jobs.runs WHERE retry_of = %s", seeded.hostile_run)
            == "QUEUED"
        )

        page.goto(base + f"/runs/{seeded.chain[2]}")
        assert page.locator("#chain tbody tr").count() == 3
        shot(page, "run-chain")

        page.goto(base + f"/runs/{seeded.queued}")
        page.click("button:has-text('cancel')")
        page.wait_for_selector(f"text=run {seeded.queued} cancelled")
        assert one(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", seeded.queued) == "CANCELLED"

        page.goto(base + "/runs")
        page.select_option("select[name=status]", "FAILED")
        page.fill("input[name=kind]", "batch")
        page.click("button:has-text('Filter')")
        page.wait_for_selector("#bulk")
        assert page.locator("table.runs tbody tr").count() == 3
        shot(page, "runs-failed-filter")
        page.click("#bulk button:has-text('Retry 3 failed')")
        page.wait_for_selector("text=retried 3 failed run(s)")
        retried = one(
            conn,
            "SELECT count(*) FROM jobs.runs WHERE retry_of = ANY(%s) AND status = 'QUEUED'",
            seeded.failed_batch,
        )
        assert retried == 3

        page.goto(base + "/running")
        page.locator(f"tr[data-run='{seeded.running}'] button", has_text="cancel").click()
        page.wait_for_selector("text=cancel requested")
        assert one(conn, "SELECT cancel_requested FROM jobs.runs WHERE id = %s", seeded.running) is True
        shot(page, "running")

        page.goto(base + "/runs")
        shot(page, "runs")
        page.goto(
            base
            + "/preview?"
            + urlencode({"schedule": "30 2 * 3,10 0", "tz": "Europe/Berlin", "after": "2027-03-01"})
        )
        assert page.locator("#preview .badge.dst").count() >= 2
        shot(page, "preview")

        page.goto(base + "/audit")
        actions = page.locator("#audit tbody tr td:nth-child(4)").all_inner_texts()
        assert actions == [
            "cancel",
            "bulk_retry",
            "cancel",
            "retry",
            "run_now",
            "resume",
            "pause",
            "login",
        ], actions
        shot(page, "audit")

        page.goto(base + "/")
        page.wait_for_selector("svg.chart rect.ok")
        shot(page, "overview-operator")
