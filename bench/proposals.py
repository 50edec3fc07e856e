"""A/B measurements of the changes docs/performance.md recommends, applied to scratch
databases only (sql/ and driver/ are not touched):

* ``generic``: jobs.claim with ``plan_cache_mode = force_generic_plan`` (set per session
  here through the DSN; the proposal is a ``SET`` clause on the function);
* ``trylock``: jobs.claim whose dispatch locks are all try-locks (a busy definition has
  no room this time) instead of waits, on the capped drains;
* ``no-heartbeat``: the driver without its heartbeat calls (the upper bound of not
  heartbeating right after every claim).

    .venv/bin/python bench/proposals.py [--jobs 20000] [--rounds 2]

Prints one JSON line per measurement; baseline and proposal alternate, round by round.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import sys_pgtick
from bench.harness import Server, connect, rate, run_drain

ROOT = Path(__file__).resolve().parent.parent
GENERIC = " options='-c plan_cache_mode=force_generic_plan'"

WAIT_BRANCH = """            IF v_max_locked IS NULL OR v_def > v_max_locked THEN
                PERFORM pg_advisory_xact_lock(hashtextextended('dispatch:' || v_def, 0));
                v_max_locked := v_def;
                v_count_defs := v_count_defs || v_def;
            ELSIF pg_try_advisory_xact_lock(hashtextextended('dispatch:' || v_def, 0)) THEN"""
TRY_BRANCH = """            IF pg_try_advisory_xact_lock(hashtextextended('dispatch:' || v_def, 0)) THEN"""


def trylock_claim() -> str | None:
    """sql/claim.sql with every dispatch lock a try-lock, or None if the text moved on."""
    text = (ROOT / "sql" / "claim.sql").read_text()
    return text.replace(WAIT_BRANCH, TRY_BRANCH) if WAIT_BRANCH in text else None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dsn")
    args = parser.parse_args()
    server = Server(args.dsn)
    n = 0

    def drain(
        label: str,
        target: Callable[..., None],
        target_args: tuple[Any, ...],
        jobs: int,
        options: str = "",
        claim_sql: str | None = None,
        caps: tuple[int, int] | None = None,
    ) -> None:
        nonlocal n
        n += 1
        name = f"p{n:03d}"
        dsn = server.fresh_database(name)
        sys_pgtick.install(dsn)
        if claim_sql is not None:
            with connect(dsn) as conn:
                conn.execute(claim_sql.encode())
        defs = sys_pgtick.define_capped(dsn, *caps) if caps else None
        sys_pgtick.fill(dsn, jobs, defs)
        t = run_drain(dsn + options, jobs, sys_pgtick.DRAIN, target, 1, *target_args)
        print(
            json.dumps(
                {"proposal": label, "jobs": jobs, "jobs_per_s": rate(jobs, t.seconds), "done": t.completed}
            ),
            flush=True,
        )
        server.drop_database(name)

    try:
        patched = trylock_claim()
        for _ in range(args.rounds):
            for batch in (1, 10, 100):
                jobs = args.jobs // 2 if batch == 1 else args.jobs
                for label, options in (("baseline", ""), ("generic", GENERIC)):
                    drain(f"pgtick-sql b{batch} {label}", sys_pgtick.sql_worker, (batch, 10), jobs, options)
            for label, hb, options in (
                ("baseline", True, ""),
                ("no-heartbeat", False, ""),
                ("no-heartbeat+generic", False, GENERIC),
            ):
                drain(
                    f"pgtick-driver b10 {label}", sys_pgtick.driver_worker, (10, 10, hb), args.jobs, options
                )
            for case, caps in (("100-definitions-cap-2", (100, 2)), ("hot-key-cap-10", (1, 10))):
                drain(
                    f"pgtick-sql caps {case} baseline", sys_pgtick.sql_worker, (10, 10), args.jobs, caps=caps
                )
                if patched is not None:
                    drain(
                        f"pgtick-sql caps {case} trylock",
                        sys_pgtick.sql_worker,
                        (10, 10),
                        args.jobs,
                        claim_sql=patched,
                        caps=caps,
                    )
        if patched is None:
            print(
                json.dumps(
                    {"proposal": "trylock", "skipped": "sql/claim.sql changed; patch no longer applies"}
                )
            )
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
