"""Queues: every run has one; jobs.claim(queues => ...) claims only from those; a paused
queue starts nothing from the next claim call on, its RUNNING runs finish, and resuming
restores claiming. Definitions, run_now, retries and materialized runs carry the queue."""

from __future__ import annotations

from harness import NEVER, Conn, Database, run_row, scalar


def _enqueue(conn: Conn, kind: str, queue: str, n: int = 1) -> list[int]:
    return [
        int(
            scalar(
                conn,
                "SELECT id FROM jobs.enqueue(%s, queue => %s, run_at => now() - interval '1 s')",
                (kind, queue),
            )
        )
        for _ in range(n)
    ]


def test_runs_default_to_the_default_queue(conn: Conn) -> None:
    run_id = int(scalar(conn, "SELECT id FROM jobs.enqueue('k')"))
    assert run_row(conn, run_id)["queue"] == "default"


def test_claim_with_queues_takes_only_those_queues(conn: Conn) -> None:
    """claim(queues => ['a']) never returns a run of queue b; NULL takes from all."""
    a = set(_enqueue(conn, "k", "a", 3))
    b = set(_enqueue(conn, "k", "b", 3))
    got = {int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(10, 'w', queues => '{a}')")}
    assert got == a, f"claimed {sorted(got)}, queue a holds {sorted(a)}"
    got = {int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(10, 'w')")}
    assert got == b


def test_pause_stops_claims_from_the_next_call_and_resume_restores(conn: Conn) -> None:
    """After pause_queue commits, the very next claim takes nothing from that queue (other
    queues still flow); a RUNNING run of it can still complete; resume_queue restores."""
    first = _enqueue(conn, "k", "mail", 1)
    got = [int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(1, 'w', queues => '{mail}')")]
    assert got == first
    waiting = set(_enqueue(conn, "k", "mail", 5))
    other = set(_enqueue(conn, "k", "other", 2))

    assert scalar(conn, "SELECT jobs.pause_queue('mail')") is True
    assert scalar(conn, "SELECT jobs.pause_queue('mail')") is False  # already paused
    got_after = {int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(10, 'w')")}
    assert got_after == other, (
        f"claimed {sorted(got_after)} from a paused queue (mail holds {sorted(waiting)})"
    )
    assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (first[0],)) is True
    paused = conn.execute("SELECT paused, queued FROM jobs.queues WHERE name = 'mail'").fetchone()
    assert paused == (True, 5), paused

    assert scalar(conn, "SELECT jobs.resume_queue('mail')") is True
    assert scalar(conn, "SELECT jobs.resume_queue('mail')") is False
    resumed = {int(r[0]) for r in conn.execute("SELECT id FROM jobs.claim(10, 'w')")}
    assert resumed == waiting


def test_pause_is_seen_by_a_claimer_on_another_connection(db: Database, conn: Conn) -> None:
    """The pause is committed data: another session's next claim sees it at once."""
    _enqueue(conn, "k", "q", 4)
    conn.execute("SELECT jobs.pause_queue('q')")
    with db.connect() as other:
        assert other.execute("SELECT id FROM jobs.claim(10, 'w2')").fetchall() == []
        conn.execute("SELECT jobs.resume_queue('q')")
        assert len(other.execute("SELECT id FROM jobs.claim(10, 'w2')").fetchall()) == 4


def test_definitions_run_now_materialize_and_retries_carry_the_queue(conn: Conn) -> None:
    conn.execute(
        "SELECT jobs.define('nightly', 'report', run_at => %s, queue => 'reports',"
        " concurrency_key => 'tenant-1')",
        (NEVER,),
    )
    run = conn.execute("SELECT id, queue, concurrency_key FROM jobs.run_now('nightly')").fetchone()
    assert run is not None and run[1:] == ("reports", "tenant-1"), run
    conn.execute(
        "SELECT jobs.set_retry_policy('report', max_attempts => 2, backoff_initial => '0', jitter => 0)"
    )
    claimed = conn.execute("SELECT id FROM jobs.claim(1, 'w', queues => '{reports}')").fetchall()
    assert [int(r[0]) for r in claimed] == [run[0]]
    retry = conn.execute(
        "SELECT id, queue, concurrency_key FROM jobs.fail(%s, 'w', '{E}', 'x')", (run[0],)
    ).fetchone()
    assert retry is not None and retry[0] != run[0] and retry[1:] == ("reports", "tenant-1"), retry

    did = scalar(
        conn,
        "SELECT id FROM jobs.define('every-minute', 'tick', schedule => '* * * * *', queue => 'ticks')",
    )
    conn.execute(
        "SELECT jobs.materialize(%s, NULL, ARRAY[now() - interval '1 minute'], now())",
        (did,),
    )
    assert scalar(conn, "SELECT queue FROM jobs.runs WHERE definition_id = %s", (did,)) == "ticks"


def test_queues_view_lists_queues_in_use(conn: Conn) -> None:
    _enqueue(conn, "k", "a", 2)
    conn.execute("SELECT jobs.set_limit('queue', 'limited', max_running => 3)")
    conn.execute("SELECT jobs.pause_queue('idle')")
    rows = {r[0]: r[1:] for r in conn.execute("SELECT name, paused, queued, max_running FROM jobs.queues")}
    assert rows["a"] == (False, 2, None)
    assert rows["limited"] == (False, 0, 3)
    assert rows["idle"] == (True, 0, None)


def test_pausing_a_queue_nothing_uses_raises_a_notice_and_pauses_it(conn: Conn) -> None:
    """A queue no live run, definition or limit uses may be a typo: the pause is made, with a
    NOTICE naming it; a queue in use, or one paused already, gets none."""
    _enqueue(conn, "k", "mail", 1)
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    assert scalar(conn, "SELECT jobs.pause_queue('mial')") is True
    assert notices == [
        "no queued or running run, definition or limit uses queue 'mial': it is paused for the runs to come"
    ], notices
    assert scalar(conn, "SELECT count(*) FROM jobs.paused_queues WHERE name = 'mial'") == 1
    notices.clear()
    assert scalar(conn, "SELECT jobs.pause_queue('mial')") is False
    conn.execute("SELECT jobs.define('nightly', 'k', '0 3 * * *', queue => 'reports')")
    assert scalar(conn, "SELECT jobs.pause_queue('mail')") is True
    assert scalar(conn, "SELECT jobs.pause_queue('reports')") is True
    assert notices == [], notices
