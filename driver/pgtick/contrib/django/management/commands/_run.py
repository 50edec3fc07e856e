"""What pgtick_worker and pgtick_scheduler share: options, ORM-friendly jobs, run_app."""

from __future__ import annotations

import functools
import inspect
from dataclasses import replace
from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from pgtick.app import App, Context
from pgtick.cli import parse_duration
from pgtick.contrib.django import database_alias, dsn, jobs_app
from pgtick.contrib.django.management.commands.pgtick_migrate import one_line
from pgtick.errors import PgtickError
from pgtick.runner import RunOptions, run_app


def orm_friendly(app: App) -> App:
    """Each sync job closes the executor thread's stale Django connections before and after
    it runs (as Django does around a request), so the ORM in job code behaves as in a view."""
    for kind, spec in list(app.jobs.items()):
        if inspect.iscoroutinefunction(spec.fn):
            continue

        def wrapped(ctx: Context, _fn: Any = spec.fn) -> Any:
            close_old_connections()
            try:
                return _fn(ctx)
            finally:
                close_old_connections()

        app.jobs[kind] = replace(spec, fn=functools.wraps(spec.fn)(wrapped))
    return app


class RunCommand(BaseCommand):
    worker = True
    scheduler = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", default=None, help="Django database alias (default: PGTICK['DATABASE'])"
        )
        if self.worker:
            parser.add_argument("--concurrency", type=int, default=10, help="jobs at once (default 10)")
            parser.add_argument("--poll", type=parse_duration, default=1.0, help="poll fallback (default 1s)")
            parser.add_argument(
                "--no-listen", action="store_true", help="poll only (automatic behind a pooler)"
            )
        if self.scheduler:
            parser.add_argument(
                "--tick", type=parse_duration, default=1.0, help="scheduler tick (default 1s)"
            )
        parser.add_argument("--grace", type=parse_duration, default=30.0, help="shutdown grace (30s)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            code = self._run(options)
        except (PgtickError, ImproperlyConfigured, psycopg.Error) as exc:
            raise CommandError(one_line(exc)) from exc
        if code:  # the worker or the scheduler failed (logged): exit for the supervisor to restart
            raise SystemExit(code)

    def _run(self, options: dict[str, Any]) -> int:
        app = orm_friendly(jobs_app())
        run_options = RunOptions(
            concurrency=options.get("concurrency", 10),
            poll_interval=options.get("poll", 1.0),
            tick_interval=options.get("tick", 1.0),
            shutdown_grace=options["grace"],
            scheduler=self.scheduler,
            worker=self.worker,
            listen=not options.get("no_listen", False),
        )
        return run_app(app, dsn(options["database"] or database_alias()), run_options)
