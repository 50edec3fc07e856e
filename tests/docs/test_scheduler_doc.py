"""The scheduler's bounds the README and docs/cli.md state are its defaults: they have no
setting of their own, so the docs are the only place a user reads them."""

from __future__ import annotations

import inspect
import re

from harness import ROOT
from pgtick import runner
from pgtick.scheduler import Scheduler


def _text(name: str) -> str:
    return " ".join((ROOT / name).read_text().split())


def _default(parameter: str) -> object:
    return inspect.signature(Scheduler).parameters[parameter].default


def test_the_runs_a_leader_that_fell_behind_makes_a_tick_are_the_schedulers_bound() -> None:
    said = re.search(
        r"runs it late, whatever the policy, up to ([\d,]+) runs of a definition a tick", _text("README.md")
    )
    assert said, "the README no longer says how many late runs of a definition a tick makes"
    assert int(said.group(1).replace(",", "")) == _default("max_catch_up")


def test_the_catch_up_budget_docs_cli_states_is_the_schedulers() -> None:
    text = _text("docs/cli.md")
    said = re.search(
        r"within a budget per tick \(([\d,]+) missed occurrences and half a tick of wall time,"
        r" at most (\d+) s\)",
        text,
    )
    assert said, "docs/cli.md no longer states the catch-up budget per tick"
    assert int(said.group(1).replace(",", "")) == _default("catch_up_budget")
    assert Scheduler("postgresql://unused", owner="doc", tick_interval=3600).catch_up_seconds == float(
        said.group(2)
    )
    first = re.search(r"starts its worker once its scheduler's first tick is done \((\d+) s at most\)", text)
    assert first, "docs/cli.md no longer says how long the worker waits for the first tick"
    assert float(first.group(1)) == runner.FIRST_TICK_WAIT
