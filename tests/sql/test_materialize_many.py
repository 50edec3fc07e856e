"""jobs.materialize_many: many cursors and their runs in one statement; a definition whose
runs the database refuses is isolated, recorded and backed off while the others go on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from harness import Conn, Database, expect_error, rows, run_in_processes, scalar

T0 = datetime(2030, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def _defs(conn: Conn, n: int, prefix: str = "m") -> list[int]:
    """n every-minute definitions with their cursor at T0."""
    ids = [
        int(scalar(conn, "SELECT id FROM jobs.define(%s, 'k', schedule => '* * * * *')", (f"{prefix}-{i}",)))
        for i in range(n)
    ]
    conn.execute("UPDATE jobs.definitions SET next_run_at = %s WHERE id = ANY(%s)", (T0, ids))
    return ids


def _materialize(conn: Conn, ids: list[int], at: datetime = T0, runs: int = 1) -> dict[int, Any]:
    """Materialize `runs` occurrences from `at` for every definition; definition id -> (created, error)."""
    run_ids = [i for i in ids for _ in range(runs)]
    run_times = [at + k * MINUTE for _ in ids for k in range(runs)]
    out = rows(
        conn,
        "SELECT * FROM jobs.materialize_many(%s, %s, %s, %s, %s, %s)",
        (ids, [at] * len(ids), [at + runs * MINUTE] * len(ids), [None] * len(ids), run_ids, run_times),
    )
    return {r["definition_id"]: (r["created"], r["error"]) for r in out}


def _occurrences(conn: Conn, definition_id: int) -> list[datetime]:
    return [
        r["scheduled_for"]
        for r in rows(
            conn,
            "SELECT scheduled_for FROM jobs.runs WHERE definition_id = %s AND origin = 'schedule'"
            " ORDER BY scheduled_for",
            (definition_id,),
        )
    ]


def test_one_statement_advances_every_cursor_and_inserts_every_run(conn: Conn) -> None:
    ids = _defs(conn, 50)
    answer = _materialize(conn, ids, runs=2)
    assert answer == {i: (2, None) for i in ids}
    for i in ids:
        assert _occurrences(conn, i) == [T0, T0 + MINUTE]
    cursors = {r["next_run_at"] for r in rows(conn, "SELECT next_run_at FROM jobs.definitions")}
    assert cursors == {T0 + 2 * MINUTE}


def test_a_stale_cursor_adds_nothing_and_is_not_answered(conn: Conn) -> None:
    ids = _defs(conn, 3)
    assert _materialize(conn, ids) == {i: (1, None) for i in ids}
    assert _materialize(conn, ids) == {}, "the cursors moved on: a second call must be stale"
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 3


def test_the_notification_carries_the_earliest_new_run(db: Database, conn: Conn) -> None:
    ids = _defs(conn, 2)
    with db.connect() as listener:
        listener.execute("LISTEN jobs")
        _materialize(conn, ids)
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert notes and float(notes[0].payload) == pytest.approx(T0.timestamp())


@pytest.mark.parametrize("cause", ["trigger", "constraint", "refused value"])
def test_a_refused_definition_is_isolated_recorded_and_backed_off(conn: Conn, cause: str) -> None:
    """Forty definitions in one batch, one of them poisoned: the 39 others get their runs,
    the poisoned one keeps its cursor and says why in jobs.definition_health."""
    ids = _defs(conn, 40)
    poisoned = ids[17]
    run_ids = [i for i in ids]
    run_times = [T0 for _ in ids]
    if cause == "trigger":
        conn.execute(
            f"""
            CREATE FUNCTION public.audit_refuses() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.definition_id = {poisoned} THEN
                    RAISE EXCEPTION 'quota exceeded for definition %', NEW.definition_id;
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER audit_refuses BEFORE INSERT ON jobs.runs
                FOR EACH ROW EXECUTE FUNCTION public.audit_refuses();
            """
        )
        expected = "quota exceeded"
    elif cause == "constraint":
        conn.execute(
            f"ALTER TABLE jobs.runs ADD CONSTRAINT runs_operator_check CHECK (definition_id <> {poisoned})"
        )
        expected = "runs_operator_check"
    else:
        # A run time outside the definition's window is a value the database refuses.
        run_times[17] = T0 - timedelta(days=1)
        expected = "run_times"
    out = rows(
        conn,
        "SELECT * FROM jobs.materialize_many(%s, %s, %s, %s, %s, %s)",
        (ids, [T0] * 40, [T0 + MINUTE] * 40, [None] * 40, run_ids, run_times),
    )
    answer = {r["definition_id"]: (r["created"], r["error"]) for r in out}
    assert {i: v for i, v in answer.items() if i != poisoned} == {i: (1, None) for i in ids if i != poisoned}
    assert answer[poisoned][0] == 0 and expected in answer[poisoned][1]
    assert _occurrences(conn, poisoned) == []
    for i in ids:
        if i != poisoned:
            assert _occurrences(conn, i) == [T0], f"definition {i} lost its run beside the poisoned one"
    health = rows(
        conn,
        "SELECT name, materialize_error, materialize_failures, materialize_retry_at > now() AS backing_off,"
        " next_run_at FROM jobs.definition_health WHERE materialize_error IS NOT NULL",
    )
    assert len(health) == 1 and health[0]["name"] == "m-17", health
    assert expected in health[0]["materialize_error"]
    assert health[0]["materialize_failures"] == 1 and health[0]["backing_off"]
    assert health[0]["next_run_at"] == T0, "the poisoned cursor must stay for the retry"
    # Backing off: the leader does not see it as due until its retry time.
    due = rows(conn, "SELECT id FROM jobs.due_definitions(%s, 1000)", (T0 + timedelta(days=1),))
    assert poisoned not in {r["id"] for r in due}
    # A later success clears the record.
    conn.execute("DROP TRIGGER IF EXISTS audit_refuses ON jobs.runs")
    conn.execute("ALTER TABLE jobs.runs DROP CONSTRAINT IF EXISTS runs_operator_check")
    assert _materialize(conn, [poisoned]) == {poisoned: (1, None)}
    cleared = rows(
        conn,
        "SELECT materialize_error, materialize_failures FROM jobs.definitions WHERE id = %s",
        (poisoned,),
    )
    assert cleared == [{"materialize_error": None, "materialize_failures": 0}]


DECLARE_AGAIN = {
    "define": "SELECT jobs.define('m-0', 'k', schedule => '* * * * *')",
    "define_many": 'SELECT jobs.define_many(\'[{"name": "m-0", "kind": "k", "schedule": "* * * * *"}]\')',
}


@pytest.mark.parametrize("call", sorted(DECLARE_AGAIN))
def test_declaring_a_definition_again_ends_its_materialization_backoff(conn: Conn, call: str) -> None:
    ids = _defs(conn, 1)
    conn.execute(f"ALTER TABLE jobs.runs ADD CONSTRAINT no_runs CHECK (definition_id <> {ids[0]})")
    assert _materialize(conn, ids)[ids[0]][1] is not None
    conn.execute("ALTER TABLE jobs.runs DROP CONSTRAINT no_runs")
    # The operator fixed the cause and deploys the same declaration: the leader tries again at once.
    conn.execute(DECLARE_AGAIN[call])
    state = rows(
        conn,
        "SELECT materialize_error, materialize_failures, materialize_retry_at"
        " FROM jobs.definitions WHERE id = %s",
        (ids[0],),
    )
    assert state == [{"materialize_error": None, "materialize_failures": 0, "materialize_retry_at": None}]


def test_backoff_doubles_with_each_failure(conn: Conn) -> None:
    ids = _defs(conn, 1)
    conn.execute(f"ALTER TABLE jobs.runs ADD CONSTRAINT no_runs CHECK (definition_id <> {ids[0]})")
    waits = []
    for _ in range(3):
        assert _materialize(conn, ids)[ids[0]][1] is not None
        waits.append(
            scalar(conn, "SELECT extract(epoch FROM materialize_retry_at - now()) FROM jobs.definitions")
        )
    assert [round(float(w)) for w in waits] == [1, 2, 4]


@pytest.mark.parametrize(
    ("expected", "new_next", "run_time"),
    [
        (None, None, datetime(1, 1, 1, tzinfo=UTC)),  # no cursor either side
        (None, T0 + MINUTE, datetime(1, 1, 1, tzinfo=UTC)),
        (T0, None, datetime(9999, 12, 31, 12, tzinfo=UTC)),
        (T0 + MINUTE, T0, None),  # a cursor moved back
    ],
    ids=["year-1-no-cursors", "year-1-new-definition", "year-9999-schedule-ends", "cursor-moved-back"],
)
def test_times_no_driver_can_hold_are_refused_whatever_the_cursors(
    conn: Conn, expected: datetime | None, new_next: datetime | None, run_time: datetime | None
) -> None:
    """A run's start must be a time every driver can read back (a claim returning it would
    otherwise fail for the whole batch), and the window check holds when a cursor is NULL."""
    (good, poisoned) = _defs(conn, 2)
    if expected is None:
        conn.execute("UPDATE jobs.definitions SET next_run_at = NULL WHERE id = %s", (poisoned,))
    else:
        conn.execute("UPDATE jobs.definitions SET next_run_at = %s WHERE id = %s", (expected, poisoned))
    times = [T0] + ([run_time] if run_time is not None else [])
    out = rows(
        conn,
        "SELECT * FROM jobs.materialize_many(%s, %s, %s, %s, %s, %s)",
        (
            [good, poisoned],
            [T0, expected],
            [T0 + MINUTE, new_next],
            [None, None],
            [good] + ([poisoned] if run_time is not None else []),
            times,
        ),
    )
    answer = {r["definition_id"]: (r["created"], r["error"]) for r in out}
    assert answer[good] == (1, None)
    assert answer[poisoned][0] == 0 and "run_times must be finite, from 0001-01-02" in answer[poisoned][1]
    assert _occurrences(conn, poisoned) == []
    assert scalar(conn, "SELECT next_run_at FROM jobs.definitions WHERE id = %s", (poisoned,)) == expected


def test_bad_batches_are_refused_whole(conn: Conn) -> None:
    ids = _defs(conn, 2)
    call = "SELECT * FROM jobs.materialize_many(%s, %s, %s, %s, %s, %s)"
    expect_error(conn, call, ([ids[0], ids[0]], [T0] * 2, [T0] * 2, [None] * 2, [], []), "22023", "distinct")
    expect_error(conn, call, (ids, [T0], [T0] * 2, [None] * 2, [], []), "22023", "one element")
    expect_error(conn, call, (ids, [T0] * 2, [T0] * 2, [None] * 2, [999999], [T0]), "22023", "this batch")
    expect_error(conn, call, (None, [T0] * 2, [T0] * 2, [None] * 2, [], []), "22023", "NULL")
    assert scalar(conn, "SELECT count(*) FROM jobs.runs") == 0


def materialize_batch_loop(dsn: str, ids: list[int], rounds: int) -> tuple[int, int]:
    """One would-be leader: materialize the next minute of every definition, round after round,
    reading the cursors it expects (stale when the other got there first)."""
    import psycopg

    created = stale = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(rounds):
            cursors: dict[int, datetime] = dict(
                conn.execute(
                    "SELECT id, next_run_at FROM jobs.definitions WHERE id = ANY(%s)", (ids,)
                ).fetchall()
            )
            order = sorted(ids, key=lambda i: (cursors[i], -i))  # a different order than the other
            out = conn.execute(
                "SELECT definition_id, created FROM jobs.materialize_many(%s, %s, %s, %s, %s, %s)",
                (
                    order,
                    [cursors[i] for i in order],
                    [cursors[i] + MINUTE for i in order],
                    [None] * len(order),
                    order,
                    [cursors[i] for i in order],
                ),
            ).fetchall()
            created += sum(int(r[1]) for r in out)
            stale += len(order) - len(out)
    return created, stale


def test_two_leaders_materialize_many_each_occurrence_exactly_once(db: Database, conn: Conn) -> None:
    """Invariant 3 with batches: two processes hand overlapping batches to jobs.materialize_many
    at once; every occurrence exists exactly once, no gaps, no deadlock."""
    ids = _defs(conn, 200)
    results = run_in_processes(materialize_batch_loop, [(db.dsn, ids, 40), (db.dsn, ids, 40)])
    dupes = rows(
        conn,
        "SELECT definition_id, coalesce(occurrence_at, scheduled_for), count(*) AS n FROM jobs.runs"
        " WHERE origin = 'schedule' GROUP BY 1, 2 HAVING count(*) > 1",
    )
    assert dupes == [], f"occurrences materialized twice: {dupes[:5]}"
    total = 0
    for i in ids:
        times = _occurrences(conn, i)
        assert times == [T0 + k * MINUTE for k in range(len(times))], f"definition {i} has gaps: {times[:5]}"
        cursor = scalar(conn, "SELECT next_run_at FROM jobs.definitions WHERE id = %s", (i,))
        assert cursor == T0 + len(times) * MINUTE
        total += len(times)
    assert sum(r[0] for r in results) == total, f"reported {results}, {total} exist"
    # Rows the other process holds are skipped, not waited for: each round advances what it can.
    assert total >= 200, f"only {total} occurrences after 80 rounds"


def test_the_servers_trouble_fails_the_call_and_blames_no_definition(db: Database, conn: Conn) -> None:
    """A lock the insert cannot get within lock_timeout (here: another transaction's
    uncommitted run of the same occurrence) is the server's trouble, not the definition's: the
    call fails with its SQLSTATE and the leader's next tick tries again. Taken for a refusal, it
    was stored as the definition's materialize_error and backed it off."""
    (d,) = _defs(conn, 1)
    with db.connect(autocommit=False) as other:
        other.execute(
            "INSERT INTO jobs.runs (definition_id, kind, origin, scheduled_for, occurrence_at)"
            " VALUES (%s, 'k', 'schedule', %s, %s)",
            (d, T0, T0),
        )
        conn.execute("SET lock_timeout = '200ms'")
        expect_error(
            conn,
            "SELECT * FROM jobs.materialize_many(%s, %s, %s, %s, %s, %s)",
            ([d], [T0], [T0 + MINUTE], [None], [d], [T0]),
            "55P03",
        )
        conn.execute("RESET lock_timeout")
        other.rollback()
    state = rows(
        conn,
        "SELECT next_run_at, materialize_failures, materialize_error, materialize_retry_at"
        " FROM jobs.definitions WHERE id = %s",
        (d,),
    )
    assert state == [
        {
            "next_run_at": T0,
            "materialize_failures": 0,
            "materialize_error": None,
            "materialize_retry_at": None,
        }
    ]
    assert _materialize(conn, [d]) == {d: (1, None)}
