"""Test app: jobs whose outcome or input the database or the driver refuses.

``returns`` returns the value named by the payload's ``what``; ``raises`` raises an error
whose message is the one named by ``what``; ``quick`` returns a small result. None is
retried (max_attempts 1), so a refused outcome shows as one FAILED run.

With ``PGTICK_TEST_BROKEN_HOOK=1`` the claim hook of the instrumentation raises once a
run of kind ``breaks`` is claimed (a fault of the worker itself, not of one run), and
its execution hook raises around a run of kind ``hooked`` (a fault of that run).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from pgtick import instrumentation
from pgtick.app import App, Context
from pgtick.execution import Outcome

app = App("test-poison")


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


class Opaque:
    """Not JSON-serialisable."""


RESULTS: dict[str, Callable[[], Any]] = {
    "nan": lambda: {"value": float("nan")},
    "infinity": lambda: [float("inf")],
    "nul": lambda: {"text": "before\x00after"},
    "surrogate": lambda: {"text": "lone \ud800 surrogate"},
    "object": lambda: {"value": Opaque()},
    "deep": lambda: _nested(100_000),
    "large": lambda: {"text": "x" * 2_000_000},  # beyond jobs.config.max_payload_bytes
}


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this error cannot say what it is")


class ExitsWhenPrinted(Exception):
    def __str__(self) -> str:
        raise SystemExit("this error exits when printed")


def _raise(what: str) -> None:
    if what == "nul":
        raise ValueError("bad\x00byte")
    if what == "undecodable":
        raise OSError(b"file \xff\xfe name".decode("utf-8", "surrogateescape"))
    if what == "unprintable":
        raise Unprintable()
    if what == "exits-when-printed":
        raise ExitsWhenPrinted()
    raise RuntimeError(what)


@app.job("returns", max_attempts=1)
def returns(ctx: Context) -> Any:
    return RESULTS[ctx.payload["what"]]()


@app.job("raises", max_attempts=1)
def raises(ctx: Context) -> None:
    _raise(ctx.payload["what"])


@app.job("quick", max_attempts=1)
def quick(ctx: Context) -> dict[str, bool]:
    return {"ok": True}


@app.job("breaks", max_attempts=1)
def breaks(ctx: Context) -> None:
    pass


@app.job("hooked", max_attempts=1)
def hooked(ctx: Context) -> None:
    pass


class BrokenHook(instrumentation.Instrumentation):
    def claimed(self, worker_id: str, runs: Sequence[Mapping[str, Any]], seconds: float) -> None:
        if any(r["kind"] == "breaks" for r in runs):
            raise RuntimeError("the claim hook is broken")

    @contextmanager
    def execute(self, ctx: Context) -> Iterator[Callable[[Outcome], None]]:
        if ctx.kind == "hooked":
            raise RuntimeError("the execution hook is broken")
        with super().execute(ctx) as ended:
            yield ended


if os.environ.get("PGTICK_TEST_BROKEN_HOOK") == "1":
    instrumentation.current = BrokenHook()
