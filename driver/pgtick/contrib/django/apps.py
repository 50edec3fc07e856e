"""The Django app config: registers pgtick's system checks, and brings the jobs schema up to
the installed pgtick after every ``manage.py migrate``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class PgtickConfig(AppConfig):
    name = "pgtick.contrib.django"
    label = "pgtick"
    verbose_name = "pgtick"
    default = True

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from pgtick.contrib.django import checks  # noqa: F401  (registers the checks)

        post_migrate.connect(upgrade_jobs_schema, sender=self, dispatch_uid="pgtick.upgrade_jobs_schema")


def upgrade_jobs_schema(sender: AppConfig, using: str, **kwargs: Any) -> None:
    """After ``manage.py migrate`` of pgtick's database: apply the schema migrations this
    pgtick has and the database lacks (a no-op when it is up to date). The Django migration
    0001 installs the schema once; an upgraded pgtick brings new schema migrations of its own,
    which no Django migration records."""
    from pgtick.contrib.django import database_alias
    from pgtick.contrib.django.management.commands.pgtick_migrate import apply_schema

    if kwargs.get("plan") is None:
        # Sent by ``flush`` (``manage.py flush``, and after every TransactionTestCase test),
        # which empties Django's tables and changes no schema: nothing to migrate.
        return
    if using == database_alias():
        apply_schema(using)
