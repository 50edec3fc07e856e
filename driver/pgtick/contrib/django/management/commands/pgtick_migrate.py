"""``manage.py pgtick_migrate``: install or upgrade the jobs schema (``pgtick migrate``)."""

from __future__ import annotations

from typing import Any

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from pgtick import migrate
from pgtick.contrib.django import database_alias, dsn
from pgtick.db import connect
from pgtick.errors import PgtickError


def one_line(exc: BaseException) -> str:
    """The first line of an error's message, as a management command's error line."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _why(exc: BaseException) -> str:
    """What stopped a migration, in one line: PostgreSQL's message with its hint, as
    ``pgtick migrate`` says it."""
    if isinstance(exc, psycopg.Error) and exc.diag.message_primary:
        hint = f" ({exc.diag.message_hint})" if exc.diag.message_hint else ""
        return f"{exc.diag.message_primary}{hint}"
    return one_line(exc)


def apply_schema(alias: str) -> list[str]:
    """Apply pgtick's schema migrations to the Django database ``alias``. A failure (no such
    database, a login that may not install, the server down) is a ``CommandError`` of one
    line, which every management command prints without a traceback: ``pgtick_migrate``,
    and ``migrate``, which runs this from pgtick's Django migration and after migrating."""
    try:
        with connect(dsn(alias), application_name="pgtick-migrate") as conn:
            return migrate.apply(conn)
    except (PgtickError, ImproperlyConfigured, psycopg.Error) as exc:
        raise CommandError(f"pgtick could not migrate database {alias!r}: {_why(exc)}") from exc


class Command(BaseCommand):
    help = "Install or upgrade pgtick's jobs schema in PGTICK['DATABASE']."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", default=None, help="Django database alias (default: PGTICK['DATABASE'])"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            alias = options["database"] or database_alias()
        except ImproperlyConfigured as exc:
            raise CommandError(one_line(exc)) from exc
        done = apply_schema(alias)
        self.stdout.write(f"pgtick: applied {', '.join(done)}" if done else "pgtick: schema up to date")
