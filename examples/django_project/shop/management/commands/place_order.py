from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from shop.services import place_order


class Command(BaseCommand):
    help = "Place an order (and enqueue its receipt in the same transaction)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("item")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            order, run_id = place_order(options["item"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"order={order.pk} run={run_id}")
