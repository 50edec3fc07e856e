"""OpenTelemetry for pgtick (extra ``pgtick[otel]``): spans and metrics for enqueue, claim
and execution, with the trace context carried in the run row.

    from pgtick.contrib.otel import instrument
    instrument()   # the global tracer and meter providers, or pass your own

Spans (names and attributes after the OpenTelemetry semantic conventions for messaging;
``messaging.system`` is ``pgtick``, the destination is the job kind):

* ``send {kind}`` (PRODUCER) around ``Client.enqueue`` / ``enqueue_many``, and
  ``send {definition}`` around ``run_now`` (its kind is the definition's, which the span
  starts before the database says), and ``AsyncClient``'s. Its context is stored with the
  runs (``jobs.runs.trace_context``, W3C ``traceparent``/``tracestate``) in the same
  transaction, so it commits or rolls back with them.
* ``receive`` (CLIENT) for each worker claim that returned runs, with
  ``messaging.batch.message_count``.
* ``process {kind}`` (CONSUMER) around the job code, a child of the run's ``send`` span,
  so one trace runs from the request that enqueued to the job that ran. A retry's row
  carries the same context (the database copies it), so every attempt is in that trace;
  an attempt after the first also links to the previous attempt's ``process`` span when
  this process ran it (``pgtick.link = previous_attempt``). A failed attempt has status
  ERROR and ``error.type``; so has one whose job returned after its worker (or the server)
  failed the run past its timeout (``JobTimeout``), whatever the job returned. The span
  ends when the run stops being its worker's, even if the job never returns: failed by its
  worker past its kind's timeout, in error (``JobTimeout``, described by the run's error);
  reaped past the run's own timeout, in error (``JobTimeout``); otherwise reaped or fenced,
  with outcome ``abandon``.

Metrics: ``messaging.client.sent.messages`` and ``messaging.client.consumed.messages``
(counters), ``messaging.client.operation.duration`` (enqueue and claim, seconds) and
``messaging.process.duration`` (job code, seconds), with ``messaging.operation.name``,
``messaging.destination.name`` and, on failure, ``error.type``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # the optional dependency: say which extra brings it
    raise ImportError(f"pgtick.contrib.otel needs OpenTelemetry: pip install 'pgtick[otel]' ({exc})") from exc

from pgtick import __version__, instrumentation
from pgtick.app import Context, error_classes
from pgtick.errors import JobTimeout
from pgtick.execution import Outcome

__all__ = ["OtelInstrumentation", "instrument", "uninstrument"]

SYSTEM = "pgtick"
_propagator = TraceContextTextMapPropagator()


class OtelInstrumentation(instrumentation.Instrumentation):
    """The driver's hooks, reporting to OpenTelemetry."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        remember_attempts: int = 10000,
    ) -> None:
        self.tracer = trace.get_tracer("pgtick", __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter("pgtick", __version__, meter_provider=meter_provider)
        self.sent = meter.create_counter(
            "messaging.client.sent.messages", unit="{message}", description="Runs enqueued."
        )
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages", unit="{message}", description="Runs claimed by workers."
        )
        self.operation_duration = meter.create_histogram(
            "messaging.client.operation.duration",
            unit="s",
            description="Duration of enqueue and claim calls.",
        )
        self.process_duration = meter.create_histogram(
            "messaging.process.duration", unit="s", description="Duration of job code, per run attempt."
        )
        # run id -> its process span, for the link from the attempt that retries it
        self._attempts: OrderedDict[int, trace.SpanContext] = OrderedDict()
        self._remember = remember_attempts
        # run id -> its attempt whose span is still open: ended by the job's return, or by the
        # worker giving up on the run first (``given_up``)
        self._open: dict[int, _Attempt] = {}
        self._lock = threading.Lock()

    # -- enqueue -----------------------------------------------------------------
    @contextmanager
    def enqueue(self, function: str, args: Mapping[str, Any]) -> Iterator[str | None]:
        destination = str(args.get("name") if function == "run_now" else args.get("kind"))
        count = len(args.get("payloads") or []) if function == "enqueue_many" else 1
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": function,
            "messaging.operation.type": "send",
            "messaging.destination.name": destination,
        }
        if function == "enqueue_many":
            attributes["messaging.batch.message_count"] = count
        began = time.monotonic()
        error: str | None = None
        with self.tracer.start_as_current_span(
            f"send {destination}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            carrier: dict[str, str] = {}
            _propagator.inject(carrier)
            try:
                yield json.dumps(carrier) if carrier else None
            except BaseException as exc:
                error = type(exc).__name__
                span.set_attribute("error.type", error)
                raise
            finally:
                metric = {k: attributes[k] for k in ("messaging.system", "messaging.operation.name")}
                metric["messaging.destination.name"] = destination
                if error:
                    metric["error.type"] = error
                else:
                    self.sent.add(count, metric)
                self.operation_duration.record(time.monotonic() - began, metric)

    # -- claim -------------------------------------------------------------------
    def claimed(self, worker_id: str, runs: Sequence[Mapping[str, Any]], seconds: float) -> None:
        base = {"messaging.system": SYSTEM, "messaging.operation.name": "claim"}
        self.operation_duration.record(seconds, base)
        if not runs:
            return
        now = time.time_ns()
        span = self.tracer.start_span(
            "receive",
            kind=SpanKind.CLIENT,
            start_time=now - int(seconds * 1e9),
            attributes={
                **base,
                "messaging.operation.type": "receive",
                "messaging.batch.message_count": len(runs),
                "messaging.consumer.group.name": worker_id,
            },
            links=[Link(c) for c in (_span_context(r.get("trace_context")) for r in runs) if c is not None],
        )
        span.end(end_time=now)
        for run in runs:
            self.consumed.add(1, {**base, "messaging.destination.name": str(run["kind"])})

    # -- execution ---------------------------------------------------------------
    @contextmanager
    def execute(self, ctx: Context) -> Iterator[Callable[[Outcome], None]]:
        run = ctx.run
        parent = _context(run.get("trace_context"))
        links = []
        retry_of = run.get("retry_of")
        if retry_of is not None:
            with self._lock:
                previous = self._attempts.get(int(retry_of))
            if previous is not None:
                links.append(Link(previous, {"pgtick.link": "previous_attempt"}))
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": ctx.kind,
            "messaging.message.id": str(ctx.run_id),
            "pgtick.run.attempt": int(run.get("attempt") or 1),
        }
        if retry_of is not None:
            attributes["pgtick.run.retry_of"] = str(retry_of)
        span = self.tracer.start_span(
            f"process {ctx.kind}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        )
        attempt = _Attempt(ctx, span, time.monotonic())
        with self._lock:
            self._attempts[ctx.run_id] = span.get_span_context()
            while len(self._attempts) > self._remember:
                self._attempts.popitem(last=False)
            self._open[ctx.run_id] = attempt
        outcomes: list[Outcome] = []
        try:
            with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                yield outcomes.append
        except BaseException:
            self._end(attempt, None, record=False)
            raise
        self._end(attempt, outcomes[-1] if outcomes else None)

    def given_up(self, ctx: Context, outcome: Outcome) -> None:
        with self._lock:
            attempt = self._open.get(ctx.run_id)
        if attempt is not None and attempt.ctx is ctx:
            self._end(attempt, outcome)

    def _end(self, attempt: _Attempt, outcome: Outcome | None, *, record: bool = True) -> None:
        """End the attempt's span with its outcome, once: by the job's return, or by its worker
        giving up on the run first (``given_up``), whichever comes first."""
        ctx, span = attempt.ctx, attempt.span
        with self._lock:
            if self._open.get(ctx.run_id) is not attempt:
                return  # ended already
            del self._open[ctx.run_id]
        metric = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "process",
            "messaging.destination.name": ctx.kind,
        }
        if outcome is not None:
            action, error, message = _how_it_ended(ctx, outcome)
            span.set_attribute("pgtick.run.outcome", action)
            if error is not None:
                span.set_attribute("error.type", error)
                span.set_status(Status(StatusCode.ERROR, message))
                metric["error.type"] = error
        span.end()
        if record:
            self.process_duration.record(time.monotonic() - attempt.began, metric)


@dataclass
class _Attempt:
    """A run attempt whose ``process`` span is open."""

    ctx: Context
    span: trace.Span
    began: float


def _how_it_ended(ctx: Context, outcome: Outcome) -> tuple[str, str | None, str | None]:
    """The attempt's outcome as the run recorded it: (action, error type, message). A run that
    stopped being its worker's (its job's result, if any, dropped) was failed as Timeout past
    its timeout (by its worker, or the server's reap), and otherwise reaped or fenced
    (``abandon``)."""
    if outcome.action == "fail":
        return "fail", (outcome.classes or ["Error"])[0], outcome.message
    if ctx.abandoned or outcome.action == "abandon":
        if ctx.timeout is not None and time.monotonic() - ctx.timeout_from > ctx.timeout:
            message = f"run {ctx.run_id} exceeded its timeout of {ctx.timeout:g}s"
            return "fail", error_classes(JobTimeout(message))[0], message
        return "abandon", None, None
    return outcome.action, None, None


def _carrier(value: Any) -> dict[str, str] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, Mapping) and "traceparent" in value:
        return {str(k): str(v) for k, v in value.items()}
    return None


def _context(value: Any) -> Any:
    carrier = _carrier(value)
    return _propagator.extract(carrier) if carrier is not None else None


def _span_context(value: Any) -> trace.SpanContext | None:
    context = _context(value)
    if context is None:
        return None
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None


def instrument(
    tracer_provider: trace.TracerProvider | None = None, meter_provider: metrics.MeterProvider | None = None
) -> OtelInstrumentation:
    """Report pgtick's enqueues, claims and executions in this process to OpenTelemetry."""
    instance = OtelInstrumentation(tracer_provider, meter_provider)
    instrumentation.current = instance
    return instance


def uninstrument() -> None:
    """Stop reporting (the hooks do nothing again)."""
    instrumentation.current = instrumentation.Instrumentation()
