"""The shop's jobs: plain Django code, ORM included."""

from __future__ import annotations

from django.utils import timezone

from pgtick import App, Context

app = App("shop")


@app.job("send-receipt")
def send_receipt(ctx: Context) -> dict[str, int]:
    from shop.models import Order

    updated = Order.objects.filter(pk=ctx.payload["order"]).update(
        receipt_sent_at=timezone.now(), receipt_run=ctx.run_id
    )
    return {"updated": updated}


@app.job("close-day")
def close_day(ctx: Context) -> None:
    ctx.logger.info("closing the day")


app.schedule("close-day", "close-day", "0 23 * * *", tz="Europe/Sofia")
