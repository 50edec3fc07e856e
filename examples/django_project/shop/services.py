"""Placing an order: the order and its receipt job commit together, or neither does."""

from __future__ import annotations

from django.db import transaction

import pgtick.contrib.django as pgtick
from shop.models import Order


def place_order(item: str) -> tuple[Order, int]:
    with transaction.atomic():
        order = Order.objects.create(item=item)
        run = pgtick.enqueue("send-receipt", {"order": order.pk})
        if not item.strip():
            raise ValueError("item must not be empty")  # rolls back the order and the run
    return order, run.id
