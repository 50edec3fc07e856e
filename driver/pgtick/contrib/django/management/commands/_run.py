"""What pgtick_worker and pgtick_scheduler share: options, ORM-friendly jobs, run_app."""

from __future__ import annotations

import functools
import importlib
import inspect
import pickle
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections

from pgtick.app import App, Context
from pgtick.cli import duration, integer, parse_duration
from pgtick.contrib.django import database_alias, dsn, jobs_app
from pgtick.contrib.django.management.commands.pgtick_migrate import one_line
from pgtick.errors import PgtickError
from pgtick.runner import RunOptions, run_app


class OrmJob:
    """A sync job function run as Django runs a view: the stale Django connections of the
    thread are closed before and after it.

    A job of ``isolation="process"`` travels to its child process pickled: an ``OrmJob``
    goes as its function's module and name (the function must be importable as itself, as
    for any isolated job), and in the child, a fresh interpreter, it sets Django up
    (``DJANGO_SETTINGS_MODULE``, inherited from ``manage.py``) before it imports the job's
    module, whose models need the app registry."""

    def __init__(self, fn: Callable[[Context], Any] | None, module: str = "", name: str = "") -> None:
        self._fn = fn
        self._module = fn.__module__ if fn is not None else module
        self._name = fn.__qualname__ if fn is not None else name
        self.__name__ = self._name.rpartition(".")[2]
        self.__qualname__ = self._name
        self.__module__ = self._module
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, ctx: Context) -> Any:
        if self._fn is None:  # in a job's child process: Django first, then the job's module
            self._fn = _job_function(self._module, self._name, setup=True)
        close_old_connections()
        try:
            return self._fn(ctx)
        finally:
            close_old_connections()

    def __reduce__(self) -> tuple[Any, ...]:
        try:
            importable = _job_function(self._module, self._name, setup=False) is self._fn
        except Exception:
            importable = False
        if not importable:
            raise pickle.PicklingError(
                f"Can't pickle {self._fn!r}: it is not importable as {self._module}.{self._name}"
            )
        return (OrmJob, (None, self._module, self._name))


def _job_function(module: str, name: str, *, setup: bool) -> Any:
    """The object ``module``.``name`` names; with ``setup``, Django is set up first."""
    if setup:
        import django
        from django.apps import apps

        if not apps.ready:
            django.setup()
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def _async_orm_job(fn: Callable[[Context], Awaitable[Any]]) -> Callable[[Context], Awaitable[Any]]:
    """An ``async def`` job run as Django runs an async view: Django's async ORM queries on
    the thread ``sync_to_async`` keeps for thread-sensitive code, whose stale connections
    (one the server ended, say) are closed there before and after the job."""
    from asgiref.sync import sync_to_async

    close_there = sync_to_async(close_old_connections)

    @functools.wraps(fn)
    async def wrapped(ctx: Context) -> Any:
        await close_there()
        try:
            return await fn(ctx)
        finally:
            await close_there()

    wrapped._pgtick_orm = True  # type: ignore[attr-defined]
    return wrapped


def orm_friendly(app: App) -> App:
    """Each job closes stale Django connections before and after it runs (as Django does
    around a request), so the ORM in job code behaves as in a view: a sync job those of its
    executor thread, in a job process (``isolation="process"``) too (see ``OrmJob``); an
    ``async def`` job those its async ORM queries use."""
    for kind, spec in list(app.jobs.items()):
        if isinstance(spec.fn, OrmJob) or getattr(spec.fn, "_pgtick_orm", False):
            continue
        if inspect.iscoroutinefunction(spec.fn):
            app.jobs[kind] = replace(spec, fn=_async_orm_job(spec.fn))
        else:
            app.jobs[kind] = replace(spec, fn=OrmJob(spec.fn))
    return app


class RunCommand(BaseCommand):
    worker = True
    scheduler = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", default=None, help="Django database alias (default: PGTICK['DATABASE'])"
        )
        if self.worker:
            parser.add_argument(
                "--concurrency", type=integer(1, 1000), default=10, help="jobs at once (1..1000, default 10)"
            )
            parser.add_argument("--poll", type=parse_duration, default=1.0, help="poll fallback (default 1s)")
            parser.add_argument(
                "--no-listen", action="store_true", help="poll only (automatic behind a pooler)"
            )
        if self.scheduler:
            parser.add_argument(
                "--tick",
                type=duration(timedelta(days=1)),
                default=1.0,
                help="scheduler tick (default 1s, at most 1d)",
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
