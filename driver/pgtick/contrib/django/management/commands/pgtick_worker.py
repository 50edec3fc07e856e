"""``manage.py pgtick_worker``: claim and run the jobs of PGTICK['APP'] (no scheduler)."""

from __future__ import annotations

from pgtick.contrib.django.management.commands._run import RunCommand


class Command(RunCommand):
    help = "Run a pgtick worker for PGTICK['APP'] until SIGTERM/SIGINT."
    worker = True
    scheduler = False
