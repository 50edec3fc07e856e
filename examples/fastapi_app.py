"""A FastAPI app that enqueues jobs in its own transactions and runs them in-process.

    pip install 'pgtick[fastapi]' uvicorn
    pgtick migrate --dsn "$DATABASE_URL"
    DATABASE_URL=postgresql://localhost/shop uvicorn examples.fastapi_app:api

POST /orders {"item": "book"} inserts an order and enqueues its receipt in one
transaction: both commit, or (an empty item, any error) neither does. The worker
started by the lifespan runs "send-receipt", which marks the order.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel

from pgtick import App, AsyncClient, Context
from pgtick.contrib.asgi import Pgtick, Transaction, client

ORDERS = """
CREATE TABLE IF NOT EXISTS orders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item text NOT NULL,
    receipt_sent_at timestamptz
)
"""


class Order(BaseModel):
    item: str


def create_app(dsn: str) -> FastAPI:
    jobs = App("shop", dsn=dsn)

    @jobs.job("send-receipt")
    def send_receipt(ctx: Context) -> dict[str, Any]:
        with psycopg.connect(dsn) as conn:
            conn.execute("UPDATE orders SET receipt_sent_at = now() WHERE id = %s", (ctx.payload["order"],))
        return {"sent": ctx.payload["order"]}

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(ORDERS)

    tick = Pgtick(jobs, dsn, scheduler=True, poll_interval=0.2)
    api = FastAPI(lifespan=tick.lifespan)

    @api.post("/orders")
    async def create_order(
        order: Order,
        conn: Transaction,  # commits before the response is sent
        pgtick: Annotated[AsyncClient, Depends(client)],
    ) -> dict[str, Any]:
        cur = await conn.execute("INSERT INTO orders (item) VALUES (%s) RETURNING id", (order.item,))
        row = await cur.fetchone()
        assert row is not None
        run = await pgtick.enqueue("send-receipt", {"order": row[0]}, conn=conn)
        if not order.item.strip():
            raise HTTPException(422, "item must not be empty")  # rolls back the order and its run
        return {"order": row[0], "run": run.id}

    return api


if "DATABASE_URL" in os.environ:
    api = create_app(os.environ["DATABASE_URL"])
