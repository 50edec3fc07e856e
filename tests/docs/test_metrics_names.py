"""The Prometheus series the docs name are the ones `pgtick run --metrics-port` serves, and
docs/operations.md names every one of them: an alert written from the docs matches."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

from harness import ROOT
from pgtick.metrics import DATABASE_GAUGES, WorkerMetrics

# Names the docs spell like series that are not: a pytest fixture, a role, Django commands.
NOT_SERIES = {"pgtick_jobs", "pgtick_dashboard", "pgtick_migrate", "pgtick_worker", "pgtick_scheduler"}


def served() -> set[str]:
    """Every series name, as exposed (a counter with its _total), per_definition on."""
    registry = CollectorRegistry()
    WorkerMetrics(registry, per_definition=True)
    names = {f.name + ("_total" if f.type == "counter" else "") for f in registry.collect()}
    return names | {name for _, name, _, _ in DATABASE_GAUGES}


def named(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w.])pgtick_[a-z_]+[a-z]", text)) - NOT_SERIES


def test_every_series_the_docs_name_is_served() -> None:
    series = served()
    unknown = {
        f"{doc.name}: {name}"
        for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for name in named(doc.read_text())
        if name not in series
    }
    assert not unknown, f"the docs name series the metrics endpoint does not serve: {sorted(unknown)}"


def test_the_runbook_names_every_series_served() -> None:
    missing = served() - named((ROOT / "docs" / "operations.md").read_text())
    assert not missing, f"docs/operations.md does not name the served series {sorted(missing)}"
