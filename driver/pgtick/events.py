"""What a worker tells the outside: the listener interface, and the counters built on it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from pgtick.execution import Settlement


class WorkerListener(Protocol):
    """Receives the worker's events (the metrics endpoint and ``WorkerStats`` implement it).

    Optional: ``on_started(kind, definition_id, lateness)`` hears the start lateness
    (``started_at - scheduled_for``, seconds) of every run claimed."""

    def on_claim(self, kinds: list[str], seconds: float) -> None: ...
    def on_outcome(self, kind: str, outcome: Settlement) -> None: ...
    def on_heartbeat_failure(self) -> None: ...


@dataclass
class WorkerStats:
    """Counters of one worker, kept by listening to its events."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    abandoned: int = 0
    snoozed: int = 0
    fenced: int = 0
    heartbeat_failures: int = 0
    max_lateness: float = 0.0

    def on_claim(self, kinds: list[str], seconds: float) -> None:
        self.claimed += len(kinds)

    def on_started(self, kind: str, definition_id: int | None, lateness: float) -> None:
        """Start lateness (started_at - scheduled_for, seconds) of a run just claimed."""
        self.max_lateness = max(self.max_lateness, lateness)

    def on_outcome(self, kind: str, outcome: Settlement) -> None:
        if outcome == "complete":
            self.completed += 1
        elif outcome == "fail":
            self.failed += 1
        elif outcome == "cancel":
            self.cancelled += 1
        elif outcome == "abandon":
            self.abandoned += 1
        elif outcome == "snooze":
            self.snoozed += 1
        else:
            self.fenced += 1

    def on_heartbeat_failure(self) -> None:
        self.heartbeat_failures += 1


class Listeners:
    """Passes every event to each listener, in order."""

    def __init__(self, listeners: Iterable[WorkerListener | None]) -> None:
        self.listeners = [x for x in listeners if x is not None]

    def on_claim(self, kinds: list[str], seconds: float) -> None:
        for x in self.listeners:
            x.on_claim(kinds, seconds)

    def on_started(self, kind: str, definition_id: int | None, lateness: float) -> None:
        for x in self.listeners:
            hear = getattr(x, "on_started", None)
            if hear is not None:
                hear(kind, definition_id, lateness)

    def on_outcome(self, kind: str, outcome: Settlement) -> None:
        for x in self.listeners:
            x.on_outcome(kind, outcome)

    def on_heartbeat_failure(self) -> None:
        for x in self.listeners:
            x.on_heartbeat_failure()
