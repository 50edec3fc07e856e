"""jobs.undefine serializes with every path that adds runs of a definition (jobs.materialize,
materialize_many, materialize_one_shots, finish_backfill, run_now, a retry after a failure):
once undefine has committed, no QUEUED run of the deleted definition exists, and none
appears afterwards. Real sessions: one holds the adding transaction open while another
undefines; then a loop of real processes racing."""

from __future__ import annotations

import contextlib
import random
import secrets
import threading
import time
from collections.abc import Callable
from datetime import datetime

import psycopg
import pytest
from psycopg.types.json import Jsonb

from harness import (
    BlockedCall,
    Conn,
    Database,
    expect_error,
    run_in_processes,
    scalar,
    wait_for,
    waits_on_lock,
)

# Orphans: QUEUED runs whose definition no longer exists, each as "id origin definition_id".
ORPHANS = (
    "SELECT coalesce(array_agg(concat_ws(' ', r.id, r.origin, r.definition_id) ORDER BY r.id), '{}')"
    " FROM jobs.runs AS r"
    " WHERE r.status = 'QUEUED' AND r.definition_id IS NOT NULL"
    " AND NOT EXISTS (SELECT FROM jobs.definitions AS d WHERE d.id = r.definition_id)"
)


def _recurring(conn: Conn) -> int:
    """A recurring definition whose cursor stands a minute in the past."""
    definition_id = int(scalar(conn, "SELECT id FROM jobs.define('d', 'k', schedule => '* * * * *')"))
    conn.execute(
        "SELECT jobs.materialize(%s, NULL, '{}', date_trunc('minute', now()) - interval '1 minute')",
        (definition_id,),
    )
    return definition_id


def _materialize(conn: Conn, held: Conn) -> None:
    definition_id = _recurring(conn)
    held.execute(
        "SELECT jobs.materialize(d.id, d.next_run_at, ARRAY[d.next_run_at],"
        " d.next_run_at + interval '1 minute') FROM jobs.definitions AS d WHERE d.id = %s",
        (definition_id,),
    )


def _materialize_many(conn: Conn, held: Conn) -> None:
    definition_id = _recurring(conn)
    held.execute(
        "SELECT m.* FROM jobs.definitions AS d, jobs.materialize_many(ARRAY[d.id], ARRAY[d.next_run_at],"
        " ARRAY[d.next_run_at + interval '1 minute'], ARRAY[d.revision], ARRAY[d.id], ARRAY[d.next_run_at])"
        " AS m WHERE d.id = %s",
        (definition_id,),
    )


def _materialize_one_shots(conn: Conn, held: Conn) -> None:
    conn.execute("SELECT jobs.define('d', 'k', run_at => now() + interval '10 minutes')")
    held.execute("SELECT jobs.materialize_one_shots(interval '1 hour')")


def _backfill(conn: Conn) -> tuple[int, datetime]:
    """A recurring definition with a pending backfill of one past minute."""
    _recurring(conn)
    at = scalar(conn, "SELECT date_trunc('minute', now()) - interval '1 hour'")
    return int(scalar(conn, "SELECT id FROM jobs.backfill('d', %s, %s)", (at, at))), at


def _finish_backfill(conn: Conn, held: Conn) -> None:
    request, at = _backfill(conn)
    held.execute("SELECT jobs.finish_backfill(%s, ARRAY[%s]::timestamptz[])", (request, at))


def _run_now(conn: Conn, held: Conn) -> None:
    conn.execute("SELECT jobs.define('d', 'k', schedule => '0 0 1 1 *')")
    held.execute("SELECT jobs.run_now('d')")


def _fail_with_retry(conn: Conn, held: Conn) -> None:
    """A running run of the definition fails and its retry is queued."""
    conn.execute("SELECT jobs.define('d', 'k', schedule => '0 0 1 1 *', max_attempts => 3)")
    conn.execute("SELECT jobs.run_now('d')")
    run_id = scalar(conn, "SELECT id FROM jobs.claim(1, 'w')")
    held.execute("SELECT jobs.fail(%s, 'w', '{}', 'boom')", (run_id,))


def _operator_retry(conn: Conn, held: Conn) -> None:
    """An operator queues a failed run of the definition again (jobs.retry)."""
    conn.execute("SELECT jobs.define('d', 'k', schedule => '0 0 1 1 *')")
    conn.execute("SELECT jobs.run_now('d')")
    run_id = scalar(conn, "SELECT id FROM jobs.claim(1, 'w')")
    conn.execute("SELECT jobs.fail(%s, 'w', '{}', 'boom')", (run_id,))
    held.execute("SELECT jobs.retry(%s)", (run_id,))


class Undefine(threading.Thread):
    """jobs.undefine('d') in its own session; keeps the error, if any."""

    def __init__(self, db: Database) -> None:
        super().__init__(daemon=True)
        self.session = db.connect()
        self.pid = self.session.info.backend_pid
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.session.execute("SELECT jobs.undefine('d')")
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.session.close()


@pytest.mark.parametrize(
    "add",
    [
        _materialize,
        _materialize_many,
        _materialize_one_shots,
        _finish_backfill,
        _run_now,
        _fail_with_retry,
        _operator_retry,
    ],
    ids=lambda f: f.__name__.lstrip("_"),
)
def test_undefine_while_runs_are_being_added_leaves_no_queued_run(
    db: Database, conn: Conn, add: Callable[[Conn, Conn], None]
) -> None:
    with db.connect(autocommit=False) as held:
        add(conn, held)  # its runs are inserted, not committed
        added = scalar(held, "SELECT count(*) FROM jobs.runs WHERE status = 'QUEUED'")
        assert added >= 1, "the adding transaction inserted a run"
        undefine = Undefine(db)
        undefine.start()
        # The undefine either waits for the adding transaction or (unserialized) is already done.
        wait_for(
            "the undefine to wait or finish",
            lambda: not undefine.is_alive() or waits_on_lock(conn, undefine.pid),
            60,
        )
        held.commit()
    undefine.join(60)
    assert not undefine.is_alive() and undefine.error is None, f"undefine failed: {undefine.error!r}"
    assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 0
    orphans = scalar(conn, ORPHANS)
    assert orphans == [], (
        f"{add.__name__}: QUEUED runs {orphans} of the undefined definition remain and would run"
    )


def test_undefine_queued_before_a_backfill_finishes_does_not_deadlock(db: Database, conn: Conn) -> None:
    """An undefine and a finish_backfill both wait for the definition (here held by a third
    session); the undefine, first in line, deletes the definition and with it the request.
    The backfill must then add nothing, and neither may be chosen as a deadlock victim."""
    request, at = _backfill(conn)
    errors: list[BaseException] = []

    def finish() -> None:
        try:
            with db.connect() as session:
                session.execute("SELECT jobs.finish_backfill(%s, ARRAY[%s]::timestamptz[])", (request, at))
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    with db.connect(autocommit=False) as holder:
        holder.execute("SELECT FROM jobs.definitions WHERE name = 'd' FOR NO KEY UPDATE")
        undefine = Undefine(db)
        undefine.start()
        wait_for("the undefine to wait", lambda: waits_on_lock(conn, undefine.pid), 60)
        finisher = threading.Thread(target=finish, daemon=True)
        finisher.start()
        wait_for(
            "finish_backfill to wait",
            lambda: scalar(
                conn,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database() AND query LIKE '%%finish_backfill%%'",
            ),
            60,
        )
        holder.commit()
    undefine.join(60)
    finisher.join(60)
    assert undefine.error is None and not errors, f"undefine: {undefine.error!r}, finish_backfill: {errors!r}"
    assert scalar(conn, ORPHANS) == []


# A payload stored out of line (TOAST): every update of its definition row releases the
# page lock midway, the window in which PostgreSQL can lose a FOR KEY SHARE lock taken
# on the row. Random hex, so it does not compress below the TOAST threshold.
_LARGE_PAYLOAD = {"blob": secrets.token_hex(2000)}


#: The longest the definition lives in one round of the race, in seconds. A retry needs a
#: run_now, a claim and a failure (three round trips of the failing side) to fall between a
#: define and its undefine; back to back, the two leave that room only when the machine's
#: scheduling happens to give it. Each round keeps the definition for a random part of this
#: (a seeded draw), so the undefine lands at every point of the others' calls, whatever the
#: machine's speed.
_RACE_WINDOW = 0.02


def _undefine_once(conn: Conn, draw: random.Random) -> int:
    """Define the one-shot with a large payload, keep it a random while, undefine it: one round."""
    conn.execute(
        "SELECT jobs.define('race', 'k', run_at => now() + interval '1 hour', max_attempts => 3,"
        " payload => %s)",
        (Jsonb(_LARGE_PAYLOAD),),
    )
    time.sleep(draw.uniform(0, _RACE_WINDOW))
    conn.execute("SELECT jobs.undefine('race')")
    return 1


def _add_once(conn: Conn) -> int:
    """Add runs of the definition through run_now and materialize_one_shots: how many."""
    added = 0
    try:
        conn.execute("SELECT jobs.run_now('race')")
        added += 1
    except psycopg.errors.NoDataFound:
        pass  # undefined just now
    return added + int(scalar(conn, "SELECT jobs.materialize_one_shots(interval '2 hours')"))


def _fail_once(conn: Conn) -> int:
    """Claim a run of the definition and fail it, which queues a retry: 1 when it did."""
    claimed = conn.execute("SELECT id FROM jobs.claim(1, 'w')").fetchone()
    if claimed is None:
        with contextlib.suppress(psycopg.errors.NoDataFound):  # undefined just now
            conn.execute("SELECT jobs.run_now('race')")
        return 0
    after = conn.execute("SELECT id FROM jobs.fail(%s, 'w', '{}', 'boom')", claimed).fetchone()
    return int(after is not None and after[0] != claimed[0])


#: Retries the race must have queued before it ends (after its minimum length, within its
#: longest): each needs a claim and a failure to fall within a round's window.
_RACE_RETRIES = 20


def _race_member(dsn: str, seconds: float, role: str) -> int:
    """One side of the race, for at least ``seconds``, then until the failing side has queued
    _RACE_RETRIES retries (it says so with a marker table), for at most 120 s in all: what it
    did."""
    draw = random.Random(role)
    steps: dict[str, Callable[[Conn], int]] = {
        "undefine": lambda conn: _undefine_once(conn, draw),
        "add": _add_once,
        "fail": _fail_once,
    }
    done = 0
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            done += steps[role](conn)
            elapsed = time.monotonic() - started
            if elapsed < seconds:
                continue
            if role == "fail" and done >= _RACE_RETRIES:
                conn.execute("CREATE TABLE IF NOT EXISTS public.race_enough ()")
            if elapsed >= 120 or scalar(conn, "SELECT to_regclass('public.race_enough')") is not None:
                return done


def test_undefine_racing_run_now_materialize_and_retries_in_processes(db: Database, conn: Conn) -> None:
    rounds, added, retries = run_in_processes(
        _race_member, [(db.dsn, 8.0, role) for role in ("undefine", "add", "fail")]
    )
    ran = f"{rounds} undefines, {added} runs added, {retries} retries"
    assert rounds > 10 and added > 10 and retries >= _RACE_RETRIES, f"the race ran too little: {ran}"
    assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 0
    orphans = scalar(conn, ORPHANS)
    assert orphans == [], f"QUEUED runs {orphans} of undefined definitions remain ({ran})"


def test_a_run_of_a_deleted_definition_that_fails_is_not_retried(conn: Conn) -> None:
    """The definition is undefined while its run is RUNNING: the run finishes normally (its
    failure is recorded), but no retry of a deleted definition is queued."""
    conn.execute("SELECT jobs.define('d', 'k', schedule => '0 0 1 1 *', max_attempts => 3)")
    conn.execute("SELECT jobs.run_now('d')")
    run_id = scalar(conn, "SELECT id FROM jobs.claim(1, 'w')")
    conn.execute("SELECT jobs.undefine('d')")
    failed = conn.execute(
        "SELECT id, status::text FROM jobs.fail(%s, 'w', '{}', 'boom')", (run_id,)
    ).fetchone()
    assert failed == (run_id, "FAILED"), f"fail returned {failed}: a retry of the undefined definition"
    assert scalar(conn, ORPHANS) == []


def _failed_runs(conn: Conn, *names: str) -> dict[str, int]:
    """A definition per name and one FAILED run of each (no retry left): name -> run id."""
    failed = {}
    for name in names:
        conn.execute("SELECT jobs.define(%s, 'k', schedule => '0 0 1 1 *')", (name,))
        conn.execute("SELECT jobs.run_now(%s)", (name,))
        run_id = scalar(conn, "SELECT id FROM jobs.claim(1, 'w')")
        conn.execute("SELECT jobs.fail(%s, 'w', '{}', 'boom')", (run_id,))
        failed[name] = int(run_id)
    return failed


def test_an_operator_cannot_queue_again_a_run_of_a_deleted_definition(conn: Conn) -> None:
    """jobs.retry refuses (22023, naming the run) a failed run whose definition was undefined;
    jobs.retry_many passes it over and still retries the others it was given."""
    failed = _failed_runs(conn, "gone", "kept")
    conn.execute("SELECT jobs.undefine('gone')")
    expect_error(
        conn, "SELECT jobs.retry(%s)", (failed["gone"],), "22023", f"run {failed['gone']}", "deleted"
    )
    retried = conn.execute(
        "SELECT retry_of FROM jobs.retry_many(%s)", ([failed["gone"], failed["kept"]],)
    ).fetchall()
    assert retried == [(failed["kept"],)], f"retry_many queued {retried}; only the kept definition's run"
    assert scalar(conn, ORPHANS) == []


def test_a_bulk_retry_waiting_on_an_undefine_passes_its_run_over(db: Database, conn: Conn) -> None:
    """jobs.retry_many checks a run's definition under the definition's lock: a bulk retry that
    waits for an undefine in flight passes that run over once it commits, rather than fail the
    whole click, and still retries the others."""
    failed = _failed_runs(conn, "gone", "kept")
    with db.connect(autocommit=False) as undefiner, db.connect() as operator:
        undefiner.execute("SELECT jobs.undefine('gone')")  # its key held until this commits
        retrying = BlockedCall(
            conn,
            operator,
            lambda: operator.execute(
                "SELECT retry_of FROM jobs.retry_many(%s)", ([failed["gone"], failed["kept"]],)
            ).fetchall(),
            "the bulk retry to wait for the undefine",
        )
        undefiner.commit()
        outcome = retrying.join(60)
    assert outcome == [[(failed["kept"],)]], f"retry_many gave {outcome}; only the kept definition's run"
    assert scalar(conn, ORPHANS) == []
