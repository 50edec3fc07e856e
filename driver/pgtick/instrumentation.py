"""Where tracing and metrics hook into the driver: one point each for enqueue (client.py),
claim (worker.py) and execution (execution.py), and one for a run the worker gives up on
while its job code still runs (worker.py).

``current`` does nothing until an integration replaces it (``pgtick.contrib.otel.instrument``);
the driver calls it unconditionally, so a hook costs one method call when nothing listens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgtick.app import Context
    from pgtick.execution import Outcome

#: The SQL functions whose runs carry the enqueuer's trace context.
ENQUEUING = frozenset({"enqueue", "enqueue_many", "run_now"})

#: The transaction setting jobs.runs.trace_context takes its default from.
SET_TRACE_CONTEXT = "SELECT set_config('pgtick.trace_context', %s, true)"


class Instrumentation:
    """The hooks, doing nothing."""

    @contextmanager
    def enqueue(self, function: str, args: Mapping[str, Any]) -> Iterator[str | None]:
        """Around one enqueuing call (``function`` in ``ENQUEUING``): yields the trace
        context to store with the runs (JSON text), or None."""
        yield None

    def claimed(self, worker_id: str, runs: Sequence[Mapping[str, Any]], seconds: float) -> None:
        """After a claim that returned ``runs`` (maybe none) in ``seconds``."""

    @contextmanager
    def execute(self, ctx: Context) -> Iterator[Callable[[Outcome], None]]:
        """Around the job code of one run; the yielded function is given the outcome."""
        yield _ignore

    def given_up(self, ctx: Context, outcome: Outcome) -> None:
        """The run stopped being the worker's while its job code may still run (the worker
        failed it past its kind's timeout: ``outcome`` is that failure; or it was reaped or
        fenced: ``abandon``), said from another thread than the job's: what ``execute`` began
        for the run ends now, with that outcome, whatever the job still does; its return, if it
        comes, ends nothing a second time. Nothing, for a run whose job has not begun."""


def _ignore(outcome: Outcome) -> None:
    pass


current = Instrumentation()
