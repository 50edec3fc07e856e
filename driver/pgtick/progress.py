"""Progress of long work (migrate, prune, backfill): a bar on a terminal, nothing otherwise.

The bar is drawn by ``rich`` on stderr, so stdout keeps only the result (the
one-line summary the command prints when it is done, TTY or not).
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any, Self


class Bar:
    """A progress bar over ``total`` items, drawn only when ``enabled`` (stderr is a terminal)."""

    def __init__(self, label: str, total: float | None, *, enabled: bool, percent: bool = False) -> None:
        self.label = label
        self.total = total
        self.enabled = enabled
        self.percent = percent  # a share of the work (a window walked), not a count of items
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Self:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn() if self.percent else MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=sys.stderr),
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total)
        return self

    def advance(self, n: int = 1, *, description: str | None = None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=n, description=description or self.label)

    def reached(self, description: str, fraction: float) -> None:
        """A ``percent`` bar: doing ``description`` now, ``fraction`` of the work done."""
        if self._progress is not None:
            self._progress.update(
                self._task, completed=fraction * (self.total or 1), description=f"{self.label} {description}"
            )

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()


class Steps(Bar):
    """A bar fed by ``progress(step, done, total)`` callbacks (``migrate.apply``)."""

    def __init__(self, label: str, *, enabled: bool) -> None:
        super().__init__(label, None, enabled=enabled)

    def step(self, name: str, done: int, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total, description=f"{self.label} {name}")
