"""``manage.py pgtick_migrate``: install or upgrade the jobs schema (``pgtick migrate``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from pgtick import migrate
from pgtick.contrib.django import database_alias, dsn
from pgtick.db import connect


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
        done = apply_schema(alias)
        self.stdout.write(f"pgtick: applied {', '.join(done)}" if done else "pgtick: schema up to date")
