"""The Django app config: registers pgtick's system checks."""

from __future__ import annotations

from django.apps import AppConfig


class PgtickConfig(AppConfig):
    name = "pgtick.contrib.django"
    label = "pgtick"
    verbose_name = "pgtick"
    default = True

    def ready(self) -> None:
        from pgtick.contrib.django import checks  # noqa: F401  (registers the checks)
