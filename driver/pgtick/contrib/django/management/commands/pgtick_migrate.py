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


def apply_schema(alias: str) -> list[str]:
    with connect(dsn(alias), application_name="pgtick-migrate") as conn:
        return migrate.apply(conn)


class Command(BaseCommand):
    help = "Install or upgrade pgtick's jobs schema in PGTICK['DATABASE']."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", default=None, help="Django database alias (default: PGTICK['DATABASE'])"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"] or database_alias()
        try:
            done = apply_schema(alias)
        except (PgtickError, ImproperlyConfigured, psycopg.Error) as exc:
            raise CommandError(one_line(exc)) from exc
        self.stdout.write(f"pgtick: applied {', '.join(done)}" if done else "pgtick: schema up to date")
