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
from functools import partial
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
        page.wait_for_selector("text=retried 3 failed runs")
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


def test_a_double_click_on_retry_queues_one_attempt_and_says_so_in_a_real_browser(
    dashboard: tuple[str, Seeded], page: Page, db: Database
) -> None:
    """An operator clicks retry twice, the second click before the first has answered: the
    browser sends the form twice and ends on the run's page, which says the run was retried
    and that the second click found it retried already, with a link to the retry; there is
    one next attempt. (The run's lock is held until both requests wait for it, so that the
    first cannot answer before the second click, however fast or slow the machine.)"""
    base, seeded = dashboard
    run_id = seeded.hostile_run
    page.goto(base + "/login")
    page.fill("input[name=name]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Log in')")
    page.wait_for_selector("text=operator: alice")
    page.goto(base + f"/runs/{run_id}")
    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'pgtick-web' AND wait_event_type = 'Lock'"
    )

    def waiting_at_least(n: int) -> bool:
        return bool(one(conn, waiting) >= n)

    # The mouse, as a person clicks: a locator's click waits for the first click's page.
    box = page.locator("button", has_text="retry").bounding_box()
    assert box is not None
    with db.connect() as conn, db.connect() as holder:
        with holder.transaction():
            holder.execute("SELECT FROM jobs.runs WHERE id = %s FOR UPDATE", (run_id,))
            for clicks in (1, 2):
                page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                wait_for(f"{clicks} retries waiting", partial(waiting_at_least, clicks), 60)
        page.wait_for_selector(f"text=run {run_id} was already retried as run")
        shot(page, "run-retried-twice")
        new_run = one(conn, "SELECT id FROM jobs.runs WHERE retry_of = %s", run_id)
        assert one(conn, "SELECT count(*) FROM jobs.runs WHERE retry_of = %s", run_id) == 1
    assert page.url == base + f"/runs/{run_id}", page.url
    assert page.locator("#error-message").count() == 0, "the second click ended on an error page"
    messages = page.locator(".flash").all_inner_texts()
    assert any(f"run {run_id} retried as run {new_run}" in m for m in messages), messages
    link = page.locator(".flash a", has_text=f"see run {new_run}")
    assert link.get_attribute("href") == f"/runs/{new_run}"
    link.click()
    page.wait_for_url(base + f"/runs/{new_run}")


#: Names as long as the schema takes them (200 characters), without a space to break at: a
#: dotted module path, a generated worker id.
LONG_NAME = "billing.invoices." + "monthly_reconciliation_of_" * 6 + "ledger"
LONG_KIND = "com.example.jobs." + "ExportCustomerStatementsToArchive" * 5
LONG_QUEUE = "tenant-" + "0123456789abcdef" * 12
LONG_WORKER = "worker-" + "a1b2c3d4e5" * 19
LONG_OPERATOR = "oncall." + "x" * 93


def _widths(page: Page) -> dict[str, Any]:
    """What sticks out sideways: the page and #main beyond their width, the text elements
    wider than the viewport, and the buttons (of the page, of its heading) beyond it."""
    return dict(
        page.evaluate(
            """() => {
            const width = document.documentElement.clientWidth;
            const main = document.getElementById("main");
            const describe = (e) => e.tagName + ":" + e.textContent.trim().slice(0, 40);
            const wide = Array.from(document.querySelectorAll("h1, td, th, dd, .flash, p, .badge"))
                .filter((e) => e.getBoundingClientRect().width > width).map(describe);
            return {
                width: width,
                page: document.documentElement.scrollWidth,
                main: main.scrollWidth - main.clientWidth,
                wide: wide,
                buttons: Array.from(document.querySelectorAll("main button"))
                    .filter((b) => b.getBoundingClientRect().right > width).map(describe),
                heading: Array.from(document.querySelectorAll("main .heading button"))
                    .filter((b) => b.getBoundingClientRect().right > width).map(describe),
            };
        }"""
        )
    )


def test_long_names_wrap_and_leave_every_button_on_screen(
    dashboard: tuple[str, Seeded], page: Page, db: Database
) -> None:
    """Names, kinds, queues and workers as long as the schema allows, without a space: at a
    desktop width every page still fits its window with every button on it; at a phone's
    width (375 px) no heading, cell or message is wider than the screen and the buttons of a
    definition's heading are on it."""
    base, _ = dashboard
    claim = "SELECT id FROM jobs.claim(1, %s, ARRAY[%s], true)"
    with db.connect() as conn:
        conn.execute(
            "SELECT jobs.define(name => %s, kind => %s, schedule => '0 3 * * *', queue => %s)",
            (LONG_NAME, LONG_KIND, LONG_QUEUE),
        )
        running = one(conn, "SELECT id FROM jobs.run_now(%s)", LONG_NAME)
        assert one(conn, claim, LONG_WORKER, LONG_KIND) == running
        failed = one(conn, "SELECT id FROM jobs.run_now(%s)", LONG_NAME)
        assert one(conn, claim, LONG_WORKER, LONG_KIND) == failed
        conn.execute("SELECT jobs.fail(%s, %s, ARRAY['E'], %s)", (failed, LONG_WORKER, "E" * 500))
    page.goto(base + "/login")
    page.fill("input[name=name]", LONG_OPERATOR)
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Log in')")
    page.wait_for_selector("text=logged in as")
    named = "/definition?" + urlencode({"name": LONG_NAME})
    page.goto(base + named)
    page.click("button:has-text('pause')")  # an audit entry and a message naming it
    page.wait_for_selector("text=paused")
    paths = [
        "/",
        "/definitions",
        named,
        "/runs?" + urlencode({"kind": LONG_KIND}),
        f"/runs/{failed}",
        "/running",
        "/audit",
        "/definition?" + urlencode({"name": LONG_NAME + "x"}),  # the 404 page names it
    ]
    problems = []
    for width in (1360, 375):
        page.set_viewport_size({"width": width, "height": 900})
        for path in paths:
            page.goto(base + path)
            found = _widths(page)
            shot(page, f"long-names-{width}-{paths.index(path)}")
            # (At a phone's width a table of many columns scrolls sideways within the page.)
            fits = width < 1000 or (found["main"] <= 0 and not found["buttons"])
            if found["page"] > width or found["wide"] or found["heading"] or not fits:
                problems.append(f"{width} px {path}: {found}")
    assert problems == [], "\n".join(problems)
