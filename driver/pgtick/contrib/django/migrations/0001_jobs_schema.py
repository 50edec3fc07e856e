"""Install or upgrade pgtick's ``jobs`` schema in pgtick's database (``PGTICK["DATABASE"]``).

The schema has its own versioned migrations (recorded in ``jobs.schema_migrations``);
this Django migration runs them once, and every later ``manage.py migrate`` runs them again
(``apps.upgrade_jobs_schema``, on ``post_migrate``), so an upgraded pgtick's new schema
migrations are applied with the project's own.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def apply_jobs_schema(apps: Any, schema_editor: Any) -> None:
    from pgtick.contrib.django import database_alias
    from pgtick.contrib.django.management.commands.pgtick_migrate import apply_schema

    if schema_editor.connection.alias == database_alias():
        apply_schema(schema_editor.connection.alias)


class Migration(migrations.Migration):
    atomic = False  # pgtick migrates on its own connection, one transaction per migration

    dependencies: list[tuple[str, str]] = []  # noqa: RUF012
    operations = [migrations.RunPython(apply_jobs_schema, migrations.RunPython.noop, elidable=False)]  # noqa: RUF012
