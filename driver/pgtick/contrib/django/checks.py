"""System checks (database-tagged: ``manage.py check --database ALIAS`` runs them, and
``manage.py migrate`` before migrating): is the jobs schema installed and up to date?

Warnings, not errors: ``migrate`` runs these checks first and would refuse to install
the schema on an error. ``check --database default --fail-level WARNING`` makes them
fail a deploy step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from django.core import checks
from django.db import Error as DjangoDatabaseError

from pgtick import migrate
from pgtick.contrib.django import database_alias, raw_connection


@checks.register(checks.Tags.database)
def schema_migrated(
    app_configs: Sequence[Any] | None = None, databases: Sequence[str] | None = None, **_: Any
) -> list[checks.CheckMessage]:
    alias = database_alias()
    if databases is None or alias not in databases:
        return []
    try:
        conn = raw_connection(alias)
        applied = migrate.applied_versions(conn)
    except (psycopg.Error, DjangoDatabaseError, RuntimeError) as exc:  # Django wraps connection errors
        return [checks.Error(f"cannot read the pgtick schema in database {alias!r}: {exc}", id="pgtick.E003")]
    if not applied:
        return [
            checks.Warning(
                f"the pgtick jobs schema is not installed in database {alias!r}",
                hint="run `manage.py migrate` (or `manage.py pgtick_migrate`)",
                id="pgtick.W001",
            )
        ]
    pending = [m.version for m in migrate.migrations() if m.version not in applied]
    if pending:
        return [
            checks.Warning(
                f"pgtick migrations not applied in database {alias!r}: {', '.join(pending)}",
                hint="run `manage.py migrate` (or `manage.py pgtick_migrate`)",
                id="pgtick.W002",
            )
        ]
    return []
