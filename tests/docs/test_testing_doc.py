"""The README says which tables `pgtick.testing` empties around each test: a test author
reads there what state carries over from one test to the next (none of these) and what
stays (`jobs.config`)."""

from __future__ import annotations

import re

from harness import ROOT
from pgtick import testing

#: How the README names each table the plugin empties; None: an internal table of one that is
#: named (a run's history keys, a rate window's starts).
SAID = {
    "jobs.runs": "runs",
    "jobs.run_history": "their history",
    "jobs.run_history_keys": None,
    "jobs.definitions": "definitions",
    "jobs.retry_policies": "policies",
    "jobs.leases": "leases",
    "jobs.catch_ups": "catch-ups",
    "jobs.worker_registry": "the worker registry",
    "jobs.known_kinds": "known kinds",
    "jobs.paused_queues": "paused queues",
    "jobs.limits": "limits",
    "jobs._rate_starts": None,
    "jobs.worker_scopes": "scopes",
    "jobs.backfills": "backfills",
    "jobs.audit_log": "the audit log",
}


def test_the_readme_names_every_table_the_testing_plugin_empties() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"tables are emptied around each test: (.*?); `jobs\.config` stays", text)
    assert said, "the README no longer says which tables pgtick.testing empties"
    unknown = sorted(set(testing.STATE_TABLES) - set(SAID))
    assert not unknown, f"pgtick.testing empties {unknown}: name them in the README and here"
    missing = [name for table, name in SAID.items() if name and not re.search(rf"\b{name}\b", said.group(1))]
    assert not missing, f"the README's list of what pgtick.testing empties leaves out: {missing}"
    assert "jobs.config" in testing.KEPT_TABLES
