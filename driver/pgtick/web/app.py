"""The dashboard as an ASGI app (Starlette): pages, actions, login.

Pages are rendered on the server (Jinja2 with autoescaping); a small script in
``static/app.js`` adds auto-refresh and confirmation prompts. Reading needs no
login; every POST needs the session's CSRF token and, except the login itself,
an operator login, and each action commits together with its audit entry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import jinja2
import psycopg
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import Scope

from pgtick import json_numbers
from pgtick.errors import InvalidArgument, NotFound, from_psycopg
from pgtick.schedule.zones import DST_GAPS, DST_REPEATS, strftime
from pgtick.terminal import counted
from pgtick.web import charts, inputs, queries, timeview
from pgtick.web.auth import COOKIE, Secret, Session, Sessions, csrf_ok
from pgtick.web.db import DEFAULT_TIMEOUT, ActionsUnavailable, Database, DatabaseLost, DatabaseTimeout

log = logging.getLogger("pgtick.web")
HERE = Path(__file__).resolve().parent

#: Time the definitions page may spend computing next runs from schedules, for definitions
#: no scheduler has materialized yet (the rest come from the database).
COMPUTE_NEXT_SECONDS = 0.1

#: Time the preview page may spend expanding a schedule: a sparse rule (a second of one day a
#: year) can take seconds between two occurrences; the page shows those found by then.
PREVIEW_SECONDS = 2.0

#: Seconds a refused login waits before it answers.
LOGIN_FAILURE_DELAY = 1.0

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


# -- formatting -----------------------------------------------------------------------------


def fmt_utc(value: datetime | None) -> str:
    if value is None:
        return ""
    return strftime(value.astimezone(UTC), "%Y-%m-%d %H:%M:%SZ")


def fmt_local(value: datetime | None, zone: str | None = None) -> str:
    """A wall time (naive, as jobs.definition_health gives it) or an aware time in `zone`."""
    if value is None:
        return ""
    if value.tzinfo is not None and zone:
        from zoneinfo import ZoneInfo

        value = value.astimezone(ZoneInfo(zone))
        return strftime(value, "%Y-%m-%d %H:%M:%S %Z")
    return strftime(value, "%Y-%m-%d %H:%M:%S")


def fmt_age(value: timedelta | float | None) -> str:
    if value is None:
        return ""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 10:
        return f"{sign}{seconds:.1f}s"
    if seconds < 120:
        return f"{sign}{seconds:.0f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 120:
        return f"{sign}{minutes}m {sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{sign}{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{sign}{days}d {hours:02d}h"


def fmt_json(value: Any) -> str:
    if value is None:
        return ""
    return json_numbers.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def fmt_pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def make_templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        utc=fmt_utc, local=fmt_local, age=fmt_age, json=fmt_json, counted=counted, strftime=strftime
    )
    env.globals.update(
        pct=fmt_pct, statuses=queries.STATUSES, urlencode=urlencode, form_id=lambda: secrets.token_urlsafe(16)
    )
    return Jinja2Templates(env=env)


def _policy(row: dict[str, Any]) -> timeview.Policy:
    """A definition's stored DST policy (None is auto), which its schedule is parsed with."""
    return row["stored_dst_gap"], row["stored_dst_repeat"]


def _schedule_ref(row: dict[str, Any]) -> timeview.ScheduleRef | None:
    """A recurring definition's schedule as the scheduler reads it (None for a one-shot)."""
    if not row["schedule"]:
        return None
    return row["schedule"], row["created_at"], _policy(row)


def _next_start(row: dict[str, Any], upcoming: list[timeview.Occurrence]) -> timeview.Occurrence | None:
    """A recurring definition's next start as the CLI shows it (next_start_at: the first
    QUEUED run not waiting on dependencies, a paused definition's too, else the cursor);
    for one no scheduler has materialized yet, its next occurrence. None for a one-shot
    (its page says when it runs), a finished schedule or one that will not compute."""
    if not row["schedule"]:
        return None
    if row.get("next_start_at") is not None:
        return timeview.labelled(row["next_start_at"], row["timezone"], datetime.now(UTC), _schedule_ref(row))
    if row["paused"] or row["finished"] or row["next_run_at"] is not None:
        return None
    return next((o for o in upcoming if o.utc), None)


# -- the app ----------------------------------------------------------------------------------


class CsrfRefused(HTTPException):
    """A POST without the CSRF token of the session its cookie names (answered 403)."""

    def __init__(self, form: FormData) -> None:
        super().__init__(403, "CSRF token missing or wrong: reload the page and try again")
        self.form = form


class AlreadyDone(Exception):
    """An action that finds what it was to do done already (a form sent twice, another
    operator first): nothing is changed and nothing audited, and the page it returns to
    says so in `message`, with a `link` (path, text) to what did it."""

    def __init__(self, message: str, link: tuple[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.link = link


#: The counts of jobs.queue_stats the overview adds up over every kind.
OVERVIEW_TOTALS = ("queued", "scheduled", "running", "completed_1h", "failed_1h", "cancelled_1h", "lost_1h")


class Dashboard:
    """Shared state of one dashboard process: database, sessions, operator secret."""

    def __init__(
        self,
        dsn: str,
        secret: Secret | None,
        *,
        refresh_seconds: int = 10,
        db_timeout: float = DEFAULT_TIMEOUT,
        cookie_secure: bool = False,
        trust_proxy: bool = False,
    ) -> None:
        self.db = Database(dsn, timeout=db_timeout)
        self.cookie_secure = cookie_secure
        self.trust_proxy = trust_proxy
        self.secret = secret
        self.sessions = Sessions()
        self._login_gate = asyncio.Lock()  # logins one at a time (see login)
        self.templates = make_templates()
        self.refresh_seconds = refresh_seconds

    # sessions and rendering

    def session(self, request: Request) -> Session:
        session: Session | None = request.scope.get("pgtick.session")
        if session is None:
            session = self.sessions.get(request.cookies.get(COOKIE)) or self.sessions.new()
            request.scope["pgtick.session"] = session
        return session

    def render(self, request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        session = self.session(request)
        base = {
            "request": request,
            "operator": session.operator,
            "csrf": session.csrf,
            # (An auto-refresh in the background drops the messages of what it fetched: they stay
            # for the page an action goes back to, which may be loading in another tab.)
            "flashes": [] if request.headers.get("x-refresh") else session.take_flashes(),
            "access": self.db.access,
            "features": self.db.features,
            "can_act": self.secret is not None and self.db.access.operator,
            "login_configured": self.secret is not None,
            "refresh": self.refresh_seconds,
            "here": self.here(request),
            "now": datetime.now(UTC),
        }
        response = self.templates.TemplateResponse(request, name, {**base, **context}, status_code=status)
        return self.finish(request, response)

    @staticmethod
    def here(request: Request) -> str:
        """The page the login link and the logout form of this answer go back to: the page
        itself, or for the answer to an action (a POST, whose address answers a GET with 405)
        the page it was sent from, as the form's `next` names it (the overview when unknown)."""
        if request.method in ("GET", "HEAD"):
            return request.url.path + (f"?{request.url.query}" if request.url.query else "")
        back: str = request.scope.get("pgtick.back", "/")
        return back

    def finish(self, request: Request, response: Response) -> Response:
        session = request.scope.get("pgtick.session")
        if session is not None and request.cookies.get(COOKIE) != session.id:
            response.set_cookie(
                COOKIE,
                session.id,
                httponly=True,
                samesite="strict",
                path="/",
                secure=self.over_https(request),
            )
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers["Cache-Control"] = "no-store"
        return response

    def over_https(self, request: Request) -> bool:
        """Whether the browser reached the dashboard over HTTPS, so its session cookie is
        marked Secure (sent back over HTTPS only): always when told so (`cookie_secure`);
        when the server itself speaks TLS; and, behind a proxy that terminates TLS, when the
        request says so in X-Forwarded-Proto, if that proxy is trusted (`trust_proxy`: it sets
        the header, never passing on a client's). A trusted proxy that appends to the header
        put its own value last, after any the client sent: that one is read."""
        if self.cookie_secure or request.url.scheme == "https":
            return True
        if not self.trust_proxy:
            return False
        forwarded = request.headers.get("x-forwarded-proto", "")
        return forwarded.rsplit(",", 1)[-1].strip().lower() == "https"

    def site(self, request: Request) -> str:
        """The host and port the browser addressed, which a POST's Origin must name: the Host
        header; behind a trusted proxy (`trust_proxy`), the X-Forwarded-Host it sets when it
        does (its own value last, as X-Forwarded-Proto), since the Host it sends is then the
        dashboard's own address (the loopback it is bound to), not the site the browser is on."""
        if self.trust_proxy:
            forwarded = request.headers.get("x-forwarded-host", "").rsplit(",", 1)[-1].strip()
            if forwarded:
                return forwarded.lower()
        return request.headers.get("host", "").lower()

    def error(self, request: Request, status: int, message: str) -> Response:
        return self.render(request, "error.html", {"status": status, "message": message}, status)

    def redirect(self, request: Request, target: str) -> Response:
        return self.finish(request, RedirectResponse(target, status_code=303))

    # pages

    async def overview(self, request: Request) -> Response:
        feats = self.db.features
        async with self.db.reading() as conn:
            kinds = await queries.kind_stats(conn)
            queue_rows = await queries.queues(conn, feats)
            limit_rows = await queries.limits(conn, feats)
            leader = await queries.leader(conn)
            start, minutes = await queries.last_hour(conn)
        totals = {key: sum(int(k[key]) for k in kinds) for key in OVERVIEW_TOTALS}
        finished = totals["completed_1h"] + totals["failed_1h"] + totals["cancelled_1h"]
        oldest = max((k["oldest_queued_age"] for k in kinds if k["oldest_queued_age"]), default=None)
        return self.render(
            request,
            "overview.html",
            {
                "kinds": kinds,
                "queues": queue_rows,
                "limits": limit_rows,
                "leader": leader,
                "totals": totals,
                "finished": finished,
                "oldest": oldest,
                "throughput_svg": charts.throughput(
                    start, [int(m["completed"]) for m in minutes], [int(m["failed"]) for m in minutes]
                ),
                "lateness_svg": charts.lateness(
                    start,
                    [None if m["late_p50"] is None else float(m["late_p50"]) for m in minutes],
                    [None if m["late_max"] is None else float(m["late_max"]) for m in minutes],
                ),
            },
        )

    async def definitions(self, request: Request) -> Response:
        async with self.db.reading() as conn:
            rows = await queries.definitions(conn, self.db.features)
        await asyncio.to_thread(self._next_runs, rows)
        return self.render(request, "definitions.html", {"definitions": rows})

    @staticmethod
    def _next_runs(rows: list[dict[str, Any]]) -> None:
        """Each definition's next start as the CLI shows it (next_start_at: the first QUEUED
        run not waiting on dependencies, a paused definition's too, else the cursor), else,
        for a schedule no scheduler has materialized yet, its next occurrence while the
        page's budget lasts (on a thread: off the event loop)."""
        now = datetime.now(UTC)
        budget = time.monotonic() + COMPUTE_NEXT_SECONDS
        for row in rows:
            cap = row["max_concurrent_runs"]
            row["at_cap"] = cap is not None and row["running"] >= cap
            row["next"] = None
            if row["next_start_at"] is not None:
                row["next"] = timeview.labelled(
                    row["next_start_at"], row["timezone"], now, _schedule_ref(row)
                )
                continue
            if not row["schedule"] or row["paused"] or row["finished"] or row["schedule_error"]:
                continue
            if row["next_run_at"] is None and time.monotonic() < budget:
                # Not materialized yet (no scheduler has started it): ask the schedule.
                row["next"] = timeview.next_occurrence(
                    row["schedule"], row["timezone"], row["created_at"], now, _policy(row)
                )

    async def definition(self, request: Request) -> Response:
        name = inputs.text(request.query_params, "name", required=True, exact=True)
        assert name is not None
        feats = self.db.features
        async with self.db.reading() as conn:
            row = await queries.definition(conn, name)
            if row is None:
                raise HTTPException(404, f"definition {name!r} does not exist")
            recent = await queries.runs(conn, feats, queries.RunFilter(definition=name), None)
        upcoming: list[timeview.Occurrence] = []
        schedule_error = row["schedule_error"]
        if row["schedule"] and not row["finished"]:
            try:
                upcoming = await asyncio.to_thread(
                    timeview.occurrences,
                    row["schedule"],
                    row["timezone"],
                    after=datetime.now(UTC),
                    count=10,
                    created_at=row["created_at"],
                    policy=_policy(row),
                )
            except (timeview.ScheduleError, ValueError, OverflowError) as exc:
                schedule_error = schedule_error or str(exc)
        times = [o.utc for o in upcoming if o.utc is not None]
        if row["jitter"] and times:  # runs start later by their jitter: show the starts
            async with self.db.reading() as conn:
                offsets = await queries.jitter_offsets(conn, row["id"], row["jitter"], times)
            upcoming = timeview.delayed(upcoming, offsets)
        return self.render(
            request,
            "definition.html",
            {
                "d": row,
                "upcoming": upcoming,
                "next_run": _next_start(row, upcoming),
                "schedule_error": schedule_error,
                "recent": recent[: queries.PAGE_SIZE],
                "at_cap": row["max_concurrent_runs"] is not None
                and row["running"] >= row["max_concurrent_runs"],
            },
        )

    async def preview(self, request: Request) -> Response:
        params = request.query_params
        schedule = inputs.text(params, "schedule", max_length=4000)
        tz = inputs.zone(params, "tz")
        count = inputs.integer(params, "count", 1, 1000, default=10)
        assert count is not None
        after = inputs.instant(params, "after", tz) or datetime.now(UTC)
        policy = (
            inputs.choice(params, "dst_gap", DST_GAPS),
            inputs.choice(params, "dst_repeat", DST_REPEATS),
        )
        result: list[timeview.Occurrence] = []
        problem = note = effective = None
        if schedule:
            deadline = time.monotonic() + PREVIEW_SECONDS
            try:
                # (On a thread: a schedule that takes long to expand holds this request only.)
                result = await asyncio.to_thread(
                    timeview.occurrences,
                    schedule,
                    tz,
                    after=after,
                    count=count,
                    policy=policy,
                    deadline=deadline,
                )
                effective = timeview.policy_text(schedule, tz, after=after, policy=policy)
            except (timeview.ScheduleError, ValueError, OverflowError) as exc:
                problem = str(exc)
            shown = sum(1 for o in result if o.utc is not None)
            if shown < count and time.monotonic() >= deadline:
                note = (
                    f"stopped after {counted(shown, 'occurrence')}: the schedule took more than"
                    f" {PREVIEW_SECONDS:g} s to expand (its occurrences are far apart or rare)"
                )
        status = 400 if problem else 200
        return self.render(
            request,
            "preview.html",
            {
                "schedule": schedule or "",
                "tz": tz,
                "count": count,
                "after": params.get("after", ""),
                "dst_gap": policy[0] or "auto",
                "dst_repeat": policy[1] or "auto",
                "dst_gaps": ("auto", *DST_GAPS),
                "dst_repeats": ("auto", *DST_REPEATS),
                "effective": effective,
                "result": result,
                "problem": problem,
                "note": note,
            },
            status,
        )

    async def runs(self, request: Request) -> Response:
        params = request.query_params
        flt = inputs.run_filter(params)
        before = inputs.integer(params, "before", 1, 2**63 - 1)
        feats = self.db.features
        async with self.db.reading() as conn:
            rows = await queries.runs(conn, feats, flt, before)
            bulk = None
            if flt.status == "FAILED":
                bulk = {
                    "unretried": await queries.failed_count(conn, feats, flt, unretried=True),
                    "failed": await queries.failed_count(conn, feats, flt, unretried=False),
                    "upto": await queries.failed_top(conn, feats, flt),
                    "limit": queries.BULK_LIMIT,
                }
        more = len(rows) > queries.PAGE_SIZE
        rows = rows[: queries.PAGE_SIZE]
        next_params = {**flt.params(), "before": str(rows[-1]["id"])} if more and rows else None
        return self.render(
            request,
            "runs.html",
            {
                "runs": rows,
                "filter": flt,
                "filter_params": flt.params(),
                "next_params": next_params,
                "bulk": bulk,
            },
        )

    async def run(self, request: Request) -> Response:
        run_id = _run_id(request)
        feats = self.db.features
        async with self.db.reading() as conn:
            row = await queries.run(conn, feats, run_id)
            if row is None:
                raise HTTPException(404, f"run {run_id} does not exist")
            chain = await queries.attempt_chain(conn, feats, run_id)
            deps = await queries.dependencies(conn, feats, run_id)
        return self.render(request, "run.html", {"r": row, "chain": chain, "deps": deps})

    async def running(self, request: Request) -> Response:
        async with self.db.reading() as conn:
            rows = await queries.running(conn)
        return self.render(request, "running.html", {"running": rows})

    async def audit(self, request: Request) -> Response:
        before = inputs.integer(request.query_params, "before", 1, 2**63 - 1)
        async with self.db.reading() as conn:
            rows = await queries.audit(conn, before)
        more = len(rows) > queries.PAGE_SIZE
        rows = rows[: queries.PAGE_SIZE]
        return self.render(
            request, "audit.html", {"entries": rows, "next_before": rows[-1]["id"] if more and rows else None}
        )

    async def login_page(self, request: Request) -> Response:
        back = request.query_params.get("next", "/")
        return self.render(request, "login.html", {"problem": None, "name": "", "back": back})

    # posts

    async def _form(self, request: Request, *, need_operator: bool = True) -> FormData:
        """The posted form, after the CSRF and login checks every POST passes."""
        origin = request.headers.get("origin")
        origin_host = _origin_host(origin) if origin and origin != "null" else ""
        if origin_host is None or (origin_host and origin_host.lower() != self.site(request)):
            raise HTTPException(403, "cross-site request refused (Origin does not match this site)")
        form = await request.form(max_files=0, max_fields=50)
        target = form.get("next")
        request.scope["pgtick.back"] = inputs.local_path(target if isinstance(target, str) else None, "/")
        session = self.sessions.get(request.cookies.get(COOKIE))
        submitted = form.get("csrf")
        if not csrf_ok(session, submitted if isinstance(submitted, str) else None):
            raise CsrfRefused(form)
        assert session is not None
        request.scope["pgtick.session"] = session
        if need_operator:
            if self.secret is None:
                raise HTTPException(403, "read-only dashboard: it was started without an operator password")
            if session.operator is None:
                raise HTTPException(403, "log in as an operator to do this")
        return form

    def _actor(self, request: Request) -> str:
        session = self.session(request)
        client = request.client.host if request.client else "?"
        return f"{session.operator} ({client})"[:200]

    def _back(self, request: Request, form: FormData, default: str) -> Response:
        target = form.get("next")
        return self.redirect(request, inputs.local_path(target if isinstance(target, str) else None, default))

    async def login(self, request: Request) -> Response:
        try:
            form = await self._form(request, need_operator=False)
        except CsrfRefused as refused:
            # The login form sent again (a resend, a second click after the first had logged
            # in): its token was the session's before the login, which changed it. Nothing is
            # done; the operator is logged in already.
            session = self.sessions.get(request.cookies.get(COOKIE))
            if session is None or session.operator is None:
                raise
            request.scope["pgtick.session"] = session
            session.flash("ok", f"logged in as {session.operator} already")
            return self._back(request, refused.form, "/")
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        name = inputs.name(fields, "name", max_length=100)
        password = fields.get("password", "")
        if self.secret is None:
            raise HTTPException(403, "read-only dashboard: it was started without an operator password")
        # One login at a time, and a refused one holds the gate for the delay: guesses come at
        # most about one a second however many are sent at once (scrypt's cost aside).
        async with self._login_gate:
            ok = await asyncio.to_thread(self.secret.matches, password)
            if not ok:
                log.warning("dashboard login refused name=%r client=%s", name, request.client)
                await asyncio.sleep(LOGIN_FAILURE_DELAY)
        if not ok:
            return self.render(
                request,
                "login.html",
                {"problem": "wrong password", "name": name or "", "back": self.here(request)},
                401,
            )
        client = request.client.host if request.client else "?"
        async with self.db.acting() as conn:  # audited first: a login that cannot be is refused
            await queries.record_audit(conn, f"{name} ({client})"[:200], "login", None, "{}")
        session = self.sessions.rotate(self.session(request))
        session.operator = name
        request.scope["pgtick.session"] = session
        session.flash("ok", f"logged in as {name}")
        return self._back(request, form, "/")

    async def logout(self, request: Request) -> Response:
        try:
            form = await self._form(request, need_operator=False)
        except CsrfRefused as refused:
            # The logout form sent again (a double click, a resend): its token was that of the
            # session the first logout ended. A session with no operator has nothing to end;
            # an operator's stays refused (no other site may log an operator out).
            session = self.sessions.get(request.cookies.get(COOKIE))
            if session is not None and session.operator is not None:
                raise
            self.session(request).flash("ok", "logged out already")
            return self._back(request, refused.form, "/")
        session = self.sessions.rotate(self.session(request))
        request.scope["pgtick.session"] = session
        session.flash("ok", "logged out")
        return self._back(request, form, "/")

    async def _act(
        self,
        request: Request,
        form: FormData,
        action: str,
        target: str,
        call: Callable[[queries.Conn], Awaitable[tuple[str, dict[str, Any]]]],
        default_back: str,
    ) -> Response:
        try:
            async with self.db.acting() as conn:
                message, detail = await call(conn)
                await queries.record_audit(
                    conn, self._actor(request), action, target, json.dumps(detail, default=str)
                )
        except AlreadyDone as done:  # (its transaction rolled back: nothing to audit)
            log.info("dashboard action=%s target=%s by %s: %s", action, target, self._actor(request), done)
            self.session(request).flash("ok", done.message, done.link)
            return self._back(request, form, default_back)
        log.info("dashboard action=%s target=%s by %s: %s", action, target, self._actor(request), message)
        self.session(request).flash("ok", message)
        return self._back(request, form, default_back)

    async def run_action(self, request: Request) -> Response:
        run_id = _run_id(request)
        action = request.path_params["action"]
        if action not in ("cancel", "retry"):
            raise HTTPException(404, f"no such action on a run: {action[:40]!r}")
        form = await self._form(request)
        if action == "retry":
            return await self._retry(request, form, run_id)

        async def call(conn: queries.Conn) -> tuple[str, dict[str, Any]]:
            status, cancelled_now = await queries.cancel(conn, run_id)
            if cancelled_now:
                return f"run {run_id} cancelled", {"status": status}
            if status == "CANCELLED":  # before this request, or by another while it waited
                raise AlreadyDone(f"run {run_id} was cancelled already: nothing to cancel")
            if status == "RUNNING":
                return f"run {run_id}: cancel requested (it stops at its next checkpoint)", {"status": status}
            raise AlreadyDone(f"run {run_id} had already finished ({status}): nothing to cancel")

        return await self._act(request, form, action, f"run {run_id}", call, f"/runs/{run_id}")

    async def _retry(self, request: Request, form: FormData, run_id: int) -> Response:
        """Retry a run: one next attempt, however often it is asked. A retry that finds the run
        retried already (the same form sent twice, another tab's or another operator's form
        first) queues nothing and says which run retried it; the form's random id tells the
        operator's own repeat from another's retry."""
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        once = inputs.text(fields, "once", max_length=100)
        session = self.session(request)
        feats = self.db.features

        async def call(conn: queries.Conn) -> tuple[str, dict[str, Any]]:
            earlier = await queries.next_attempt(conn, feats, run_id)
            if earlier is None:
                try:
                    async with conn.transaction():  # (a savepoint: a refusal leaves ours usable)
                        new_run = await queries.retry(conn, run_id)
                except psycopg.errors.InvalidParameterValue:
                    # jobs.retry waits for the run's lock: one retried meanwhile is refused then.
                    earlier = await queries.next_attempt(conn, feats, run_id)
                    if earlier is None:
                        raise  # refused for another reason: its error page
                else:
                    if once is not None:
                        session.remember(once, new_run)
                    return f"run {run_id} retried as run {new_run}", {"new_run": new_run}
            mine = once is not None and session.sent.get(once) == earlier
            raise AlreadyDone(
                f"run {run_id} was already retried as run {earlier}"
                + (" (this retry form was sent already)" if mine else "")
                + ": nothing more queued",
                (f"/runs/{earlier}", f"see run {earlier}"),
            )

        return await self._act(request, form, "retry", f"run {run_id}", call, f"/runs/{run_id}")

    async def definition_action(self, request: Request) -> Response:
        action = request.path_params["action"]
        if action not in ("pause", "resume", "run-now"):
            raise HTTPException(404, f"no such action on a definition: {action[:40]!r}")
        form = await self._form(request)
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        name = inputs.text(fields, "name", required=True, exact=True)
        assert name is not None
        back = "/definition?" + urlencode({"name": name})
        # "Run now" is not idempotent: the same form sent again (a double click, a resend)
        # queues nothing more. Its form carries a random id; a client without one acts each time.
        once = inputs.text(fields, "once", max_length=100) if action == "run-now" else None
        session = self.session(request)
        if once is not None and not session.first_send(once):
            earlier = session.sent.get(once)
            then = f" (run {earlier} was queued then)" if earlier is not None else ""
            session.flash(
                "ok", f"definition {name}: this run-now form was sent already{then}: nothing more queued"
            )
            return self._back(request, form, back)

        async def call(conn: queries.Conn) -> tuple[str, dict[str, Any]]:
            if action == "run-now":
                new_run = await queries.run_now(conn, name)
                if once is not None:
                    session.sent[once] = new_run
                return f"definition {name}: run {new_run} queued now", {"new_run": new_run}
            if action == "pause":
                changed = await queries.pause_definition(conn, name)
                done, already = "paused", "was paused already"
            else:
                changed = await queries.resume_definition(conn, name)
                done, already = "resumed", "was not paused"
            if not changed:
                return f"definition {name} {already}: nothing changed", {"changed": False}
            return f"definition {name} {done}", {}

        try:
            return await self._act(request, form, action.replace("-", "_"), f"definition {name}", call, back)
        except (DatabaseTimeout, DatabaseLost):
            raise  # a commit cut on its way may have queued the run: the form stays sent
        except BaseException:
            if once is not None:  # nothing was done (the action's transaction rolled back)
                session.sent.pop(once, None)
            raise

    async def queue_action(self, request: Request) -> Response:
        """Pause or resume a queue (jobs.pause_queue / jobs.resume_queue), when the schema has queues."""
        if not self.db.features.has("queues"):
            raise HTTPException(404, "this database has no queues to pause")
        action = request.path_params["action"]
        if action not in ("pause", "resume"):
            raise HTTPException(404, f"no such action on a queue: {action[:40]!r}")
        form = await self._form(request)
        name = inputs.text(
            {k: v for k, v in form.items() if isinstance(v, str)}, "name", required=True, exact=True
        )

        async def call(conn: queries.Conn) -> tuple[str, dict[str, Any]]:
            if action == "pause":
                changed = await queries.pause_queue(conn, name)
                message = f"queue {name} paused" if changed else f"queue {name} was paused already"
            else:
                changed = await queries.resume_queue(conn, name)
                message = (
                    f"queue {name} resumed" if changed else f"queue {name} was not paused: nothing to resume"
                )
            return message, {"changed": changed}

        return await self._act(request, form, f"{action}_queue", f"queue {name}", call, "/")

    async def bulk_action(self, request: Request) -> Response:
        action = request.path_params["action"]
        if action not in ("retry", "discard"):
            raise HTTPException(404, f"no such bulk action: {action[:40]!r}")
        form = await self._form(request)
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        flt = inputs.run_filter(fields)
        flt = queries.RunFilter(**{**flt.__dict__, "status": "FAILED"})
        # What the page showed and the operator confirmed: how many, and up to which run.
        expected = inputs.integer(fields, "expected", 0, queries.BULK_LIMIT)
        upto = inputs.integer(fields, "upto", 0, 2**63 - 1)
        if expected is None or upto is None:
            raise inputs.BadInput(
                "expected and upto must be given: the count and the last run the page showed"
            )
        target = "failed runs " + (urlencode(flt.params()) or "(all)")

        async def call(conn: queries.Conn) -> tuple[str, dict[str, Any]]:
            feats = self.db.features
            ids = await queries.failed_ids(conn, feats, flt, unretried=action == "retry", upto=upto)
            if len(ids) != expected:
                raise HTTPException(
                    409,
                    f"the filter now matches {counted(len(ids), 'run')} to {action}, not the"
                    f" {expected} the page showed: nothing was done; look at the list again",
                )
            if action == "retry":
                retried = set(await queries.retry_many(conn, ids))
                done, left = len(retried), [i for i in ids if i not in retried]
            else:
                done = await queries.discard(conn, ids)
                left = ids if done < len(ids) else []  # (those it deleted are gone: not found below)
            # What the SQL API passes over by its rules (a second failed run of a unique key, a
            # run whose definition was deleted, the runs of unique keys past the first 1,000 of a
            # retry, an attempt a blocked run waits on) is passed over
            # on every click: the rest is done. A run gone or retried meanwhile was taken by
            # another action (the same one sent twice at once): then nothing is done.
            kept = await queries.passed_over(conn, feats, left, unretried=action == "retry") if left else []
            if done + len(kept) != len(ids):
                raise HTTPException(
                    409,
                    f"{len(ids) - done - len(kept)} of the {counted(len(ids), 'run')} taken by another"
                    " action meanwhile: nothing was done; look at the list again",
                )  # (raised in the action's transaction: what this one did is rolled back)
            past = "retried" if action == "retry" else "discarded"
            message = f"{past} {counted(done, 'failed run')}"
            detail: dict[str, Any] = {"filter": flt.params(), past: done, "runs": ids}
            if kept:
                why = (
                    "a run of its unique key is queued or running, its definition was deleted, or"
                    " it is past the 1,000 unique keys one retry takes: retry again for those"
                    if action == "retry"
                    else "a blocked run waits on its retry chain, or it links attempts that stay"
                )
                shown = ", ".join(str(i) for i in kept[:20]) + (", …" if len(kept) > 20 else "")
                message += f"; passed over run{'s' if len(kept) > 1 else ''} {shown} ({why})"
                detail["passed_over"] = kept
            return message, detail

        back = "/runs?" + urlencode(flt.params())
        return await self._act(request, form, f"bulk_{action}", target[:1000], call, back)


def _origin_host(origin: str) -> str | None:
    """The host and port an Origin header names; None when it is not a URL (no site then)."""
    try:
        return urlsplit(origin).netloc
    except ValueError:  # ("http://[", an unclosed IPv6 address)
        return None


def _run_id(request: Request) -> int:
    """The run id of the path; one beyond bigint names no run."""
    run_id = int(request.path_params["run_id"])
    if not 1 <= run_id < 2**63:
        raise HTTPException(404, f"run {run_id} does not exist")
    return run_id


class _Static(StaticFiles):
    """The dashboard's style sheet and script, marked nosniff as its pages are."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def check_schema(dsn: str) -> None:
    """Serve only a jobs schema this driver's dashboard can work with, as ``pgtick run``
    starts only on one: ``SchemaMismatch`` (run ``pgtick migrate``) when it is missing or
    older, whose pages and actions would otherwise fail one by one on the functions it
    lacks; a warning when a newer pgtick migrated it."""
    from pgtick import migrate
    from pgtick.db import connect

    with connect(dsn, application_name="pgtick-web") as conn:
        newer = migrate.check_schema(conn)
    if newer is not None:
        log.warning("%s", newer)


def create_app(
    dsn: str,
    secret: Secret | None = None,
    *,
    refresh_seconds: int = 10,
    allowed_hosts: Sequence[str] | None = None,
    db_timeout: float = DEFAULT_TIMEOUT,
    cookie_secure: bool = False,
    trust_proxy: bool = False,
) -> Starlette:
    """The dashboard for the database at `dsn`; actions need `secret` (None: read-only).
    Its startup fails (``SchemaMismatch``) on a jobs schema older than this driver's.

    Every request's database work ends within `db_timeout` seconds: past it the request
    answers 504 and its connection is replaced (see ``pgtick.web.db``).

    The session cookie is marked Secure when `cookie_secure` (browsers reach the dashboard
    over HTTPS only), when the server speaks TLS itself, and, with `trust_proxy` (a proxy in
    front terminates TLS and sets ``X-Forwarded-Proto``), on requests that header marks
    ``https``; the header is ignored otherwise, since any client can send it."""
    dash = Dashboard(
        dsn,
        secret,
        refresh_seconds=refresh_seconds,
        db_timeout=db_timeout,
        cookie_secure=cookie_secure,
        trust_proxy=trust_proxy,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # On the loop's own thread: nothing is served yet, so blocking it holds up no request,
        # and the loop is never left waiting for a worker thread's wake-up alone (a Ctrl-C while
        # the check ran in one left `pgtick web` waiting for ever, the check done).
        check_schema(dsn)
        await dash.db.open()
        try:
            yield
        finally:
            await dash.db.close()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return dash.error(request, exc.status_code, str(exc.detail))

    async def bad_input(request: Request, exc: Exception) -> Response:
        return dash.error(request, 400, str(exc))

    async def unavailable(request: Request, exc: Exception) -> Response:
        return dash.error(request, 403, str(exc))

    async def database_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, psycopg.Error)
        sqlstate = exc.sqlstate or ""
        message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        refused = from_psycopg(exc)  # what the SQL API refused, as the driver names it
        if isinstance(refused, NotFound):
            return dash.error(request, 404, message)
        if isinstance(refused, InvalidArgument) or sqlstate.startswith("P0"):  # or another RAISE
            return dash.error(request, 400, message)
        if sqlstate == "42501":
            return dash.error(request, 403, f"the database refused: {message}")
        log.error("dashboard database error on %s: %s", request.url.path, message)
        if isinstance(exc, psycopg.OperationalError):
            return dash.error(request, 503, f"database unavailable: {message}")
        return dash.error(request, 500, f"database error: {message}")

    async def pool_timeout(request: Request, exc: Exception) -> Response:
        return dash.error(request, 503, f"database unavailable: no connection within {dash.db.timeout:g} s")

    async def database_timeout(request: Request, exc: Exception) -> Response:
        log.error("dashboard database timeout on %s %s: %s", request.method, request.url.path, exc)
        return dash.error(request, 504, str(exc))

    async def database_lost(request: Request, exc: Exception) -> Response:
        log.error("dashboard database connection lost on %s %s: %s", request.method, request.url.path, exc)
        return dash.error(request, 503, str(exc))

    async def client_gone(request: Request, exc: Exception) -> Response:
        # The client went away while sending its form (a closed browser, a cut network): no
        # fault of the dashboard, and nobody reads the answer.
        log.info("dashboard: the client went away during %s %s", request.method, request.url.path)
        return Response(status_code=400)

    async def server_error(request: Request, exc: Exception) -> Response:
        # A fault of the dashboard itself (the server logs its traceback): answered with the
        # error page and its headers rather than the server's bare text.
        log.error("dashboard error on %s %s: %r", request.method, request.url.path, exc)
        return dash.error(request, 500, "internal error of the dashboard (its log says more)")

    from psycopg_pool import PoolTimeout

    routes = [
        Route("/", dash.overview),
        Route("/definitions", dash.definitions),
        Route("/definition", dash.definition),
        Route("/definitions/{action:str}", dash.definition_action, methods=["POST"]),
        Route("/preview", dash.preview),
        Route("/runs", dash.runs),
        Route("/runs/bulk/{action:str}", dash.bulk_action, methods=["POST"]),
        Route("/runs/{run_id:int}", dash.run),
        Route("/runs/{run_id:int}/{action:str}", dash.run_action, methods=["POST"]),
        Route("/queues/{action:str}", dash.queue_action, methods=["POST"]),
        Route("/running", dash.running),
        Route("/audit", dash.audit),
        Route("/login", dash.login_page),
        Route("/login", dash.login, methods=["POST"]),
        Route("/logout", dash.logout, methods=["POST"]),
        Mount("/static", _Static(directory=HERE / "static"), name="static"),
    ]
    # Bound to the loopback only, the dashboard answers only requests addressed to it there: a
    # page elsewhere that makes its own host name resolve to 127.0.0.1 (DNS rebinding) gets 400.
    middleware: list[Middleware] = []
    if allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)))
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={
            HTTPException: http_error,
            inputs.BadInput: bad_input,
            ActionsUnavailable: unavailable,
            psycopg.Error: database_error,
            PoolTimeout: pool_timeout,
            DatabaseTimeout: database_timeout,
            DatabaseLost: database_lost,
            ClientDisconnect: client_gone,
            Exception: server_error,
        },
    )
    app.state.dashboard = dash
    return app
