from __future__ import annotations

from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=200)
    receipt_sent_at = models.DateTimeField(null=True)
    receipt_run = models.BigIntegerField(null=True)
