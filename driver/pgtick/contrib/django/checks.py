"""System checks. ``pgtick.E001``: ``PGTICK`` is not a dict, or pgtick's database alias is
missing from ``DATABASES`` or not PostgreSQL; ``pgtick.E002``: ``PGTICK["APP"]`` is set but
cannot be loaded (every ``manage.py`` command runs both, so a deploy's ``check`` catches them
before a worker starts). Database-tagged (``manage.py check
--database ALIAS`` runs them, and ``manage.py migrate`` before migrating): is the jobs schema
installed and up to date?

The schema checks warn rather than fail: ``migrate`` runs these checks first and would
refuse to install the schema on an error. ``check --database default --fail-level WARNING``
makes them fail a deploy step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import Error as DjangoDatabaseError

from pgtick import migrate
from pgtick.contrib.django import _postgresql, _settings, database_alias, jobs_app, raw_connection


@checks.register()
def database_configured(app_configs: Sequence[Any] | None = None, **_: Any) -> list[checks.CheckMessage]:
    """PGTICK["DATABASE"] names a database in DATABASES, and it is PostgreSQL (an error: no
    pgtick command can work without one; this check needs no connection)."""
    try:
        _postgresql(None)
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc),
                hint="set PGTICK['DATABASE'] to the alias of a PostgreSQL database",
                id="pgtick.E001",
            )
        ]
    return []


@checks.register()
def app_loadable(app_configs: Sequence[Any] | None = None, **_: Any) -> list[checks.CheckMessage]:
    """PGTICK["APP"], when set, names a pgtick.App that imports (an error: pgtick_worker and
    pgtick_scheduler would stop on it). Unset is left alone: a project may only enqueue."""
    try:
        target = _settings().get("APP")
    except ImproperlyConfigured:  # pgtick.E001 says why
        return []
    if not target:
        return []
    try:
        jobs_app()
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc).splitlines()[0],
                hint="set PGTICK['APP'] to the pgtick.App of your jobs, as module:attr",
                id="pgtick.E002",
            )
        ]
    return []


@checks.register(checks.Tags.database)
def schema_migrated(
    app_configs: Sequence[Any] | None = None, databases: Sequence[str] | None = None, **_: Any
) -> list[checks.CheckMessage]:
    try:
        alias = database_alias()
        _postgresql(alias)
    except ImproperlyConfigured:  # pgtick.E001 says why
        return []
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
