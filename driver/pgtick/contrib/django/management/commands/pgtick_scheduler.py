"""``manage.py pgtick_scheduler``: the leader-elected scheduler for PGTICK['APP'] (no worker)."""

from __future__ import annotations

from pgtick.contrib.django.management.commands._run import RunCommand


class Command(RunCommand):
    help = "Run the pgtick scheduler (materialize, reap, prune) for PGTICK['APP'] until SIGTERM/SIGINT."
    worker = False
    scheduler = True
