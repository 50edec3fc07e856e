"""sql/console.sql: what the operator's terminal calls, checked in SQL."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from harness import Database, claim, enqueue, expect_error, one, rows, scalar, spring_forward_zone

Conn = psycopg.Connection[Any]


def notices_of(conn: Conn) -> list[str]:
    found: list[str] = []
    conn.add_notice_handler(lambda d: found.append(d.message_primary or ""))
    return found


def test_enqueue_of_a_kind_no_worker_ever_registered_raises_a_notice_and_still_queues(conn: Conn) -> None:
    notices = notices_of(conn)
    run = scalar(conn, "SELECT id FROM jobs.enqueue('repotr')")
    assert scalar(conn, "SELECT status::text FROM jobs.runs WHERE id = %s", (run,)) == "QUEUED"
    assert notices == ["no worker has ever registered kind 'repotr': the run waits until one does"]
    conn.execute("SELECT jobs.register_worker('w1', '{report,repotr}', 'host', 1)")
    notices.clear()
    conn.execute("SELECT jobs.enqueue('repotr')")
    assert notices == [], "a registered kind: no notice"
    conn.execute("SELECT jobs.enqueue('reprot')")  # the session knows 'repotr': another kind is looked up
    assert notices == ["no worker has ever registered kind 'reprot': the run waits until one does"]
    notices.clear()
    conn.execute("SELECT jobs.enqueue('repotr')")
    assert notices == []


def test_enqueue_many_of_a_kind_no_worker_ever_registered_raises_the_notice_enqueue_does(conn: Conn) -> None:
    notices = notices_of(conn)
    queued = rows(conn, "SELECT status::text AS status FROM jobs.enqueue_many('repotr', '[{}, {}]')")
    assert [r["status"] for r in queued] == ["QUEUED", "QUEUED"]
    assert notices == ["no worker has ever registered kind 'repotr': the run waits until one does"], notices
    conn.execute("SELECT jobs.register_worker('w1', '{repotr}', 'host', 1)")
    notices.clear()
    conn.execute("SELECT jobs.enqueue_many('repotr', '[{}]')")
    assert notices == [], "a registered kind: no notice"


def test_workers_view_says_alive_stopped_or_lost_and_what_each_runs(conn: Conn) -> None:
    conn.execute("SELECT jobs.register_worker('w-alive', '{k}', 'host-a', 11)")
    conn.execute("SELECT jobs.register_worker('w-stopped', '{k}', 'host-b', 12)")
    conn.execute("SELECT jobs.worker_stopped('w-stopped')")
    conn.execute("SELECT jobs.register_worker('w-lost', '{k}', 'host-c', 13)")
    conn.execute(
        "UPDATE jobs.worker_registry SET last_seen_at = now() - interval '2 hours' WHERE worker = 'w-lost'"
    )
    run = enqueue(conn, "k")
    assert claim(conn, "w-alive") == [run]
    got = {
        r["worker"]: (r["state"], r["running"], r["run_ids"])
        for r in rows(conn, "SELECT worker, state, running, run_ids FROM jobs.workers")
    }
    assert got == {
        "w-alive": ("alive", 1, [run]),
        "w-stopped": ("stopped", 0, []),
        "w-lost": ("lost", 0, []),
    }
    assert scalar(conn, "SELECT jobs.worker_seen('w-lost')") is True
    assert scalar(conn, "SELECT state FROM jobs.workers WHERE worker = 'w-lost'") == "alive"
    assert scalar(conn, "SELECT jobs.worker_seen('nobody')") is None


def test_a_worker_is_alive_for_the_heartbeat_timeout_as_elapsed_time_whatever_the_sessions_time_zone(
    conn: Conn,
) -> None:
    """With a heartbeat timeout of a day, a worker seen 23 hours 30 minutes ago is alive for
    every caller. In a session whose zone sprang forward during that day, now() - interval
    '1 day' is only 23 hours back: read that way, jobs.workers called it lost, its kinds showed
    as without a worker, and the registry's prune could drop it."""
    conn.execute("UPDATE jobs.config SET heartbeat_timeout = '1 day'")
    conn.execute("SELECT jobs.register_worker('w-slow', '{k}', 'host', 1)")
    conn.execute(
        "UPDATE jobs.worker_registry SET last_seen_at = now() - interval '23 hours 30 minutes'"
        " WHERE worker = 'w-slow'"
    )
    enqueue(conn, "k")
    zone = spring_forward_zone(conn)
    conn.execute(f"SET TIME ZONE '{zone}'")
    assert scalar(conn, "SELECT state FROM jobs.workers WHERE worker = 'w-slow'") == "alive", zone
    assert scalar(conn, "SELECT count(*) FROM jobs.kinds_without_worker") == 0, zone
    assert one(conn, "SELECT * FROM jobs.prune_registry('1 hour')") == {"workers": 0, "kinds": 0}, zone
    assert scalar(conn, "SELECT count(*) FROM jobs.worker_registry WHERE worker = 'w-slow'") == 1


def test_a_worker_login_cannot_stamp_another_logins_worker_and_a_takeover_shows_its_login(
    db: Database, conn: Conn
) -> None:
    """Login B knows the worker id login A's worker registered: B's worker_seen cannot keep it
    alive once lost, nor B's worker_stopped show it stopped (both NULL, nothing changed); A's
    own calls still work. B registering that id takes the line over in plain sight: jobs.workers
    names B as its login."""
    with db.worker_login("reg_a") as a, db.worker_login("reg_b") as b:
        with psycopg.connect(db.dsn_as(a), autocommit=True) as as_a:
            as_a.execute("SELECT jobs.register_worker('w-a', '{k}', 'host-a', 1)")
        line = "SELECT state, login FROM jobs.workers WHERE worker = 'w-a'"
        assert one(conn, line) == {"state": "alive", "login": a}
        conn.execute(
            "UPDATE jobs.worker_registry SET last_seen_at = now() - interval '2 hours' WHERE worker = 'w-a'"
        )
        with psycopg.connect(db.dsn_as(b), autocommit=True) as as_b:
            assert scalar(as_b, "SELECT jobs.worker_seen('w-a')") is None
            assert one(conn, line) == {"state": "lost", "login": a}, "another login kept A's worker alive"
            assert scalar(as_b, "SELECT jobs.worker_stopped('w-a')") is None
            assert one(conn, line) == {"state": "lost", "login": a}, "another login marked A's worker stopped"
        with psycopg.connect(db.dsn_as(a), autocommit=True) as as_a:
            assert scalar(as_a, "SELECT jobs.worker_seen('w-a')") is True
            assert one(conn, line) == {"state": "alive", "login": a}
        with psycopg.connect(db.dsn_as(b), autocommit=True) as as_b:
            as_b.execute("SELECT jobs.register_worker('w-a', '{k}', 'host-b', 2)")
        assert one(conn, line) == {"state": "alive", "login": b}


def test_kinds_without_worker_lists_due_runs_no_live_worker_takes(conn: Conn) -> None:
    conn.execute("SELECT jobs.register_worker('w', '{mail}', 'h', 1)")
    enqueue(conn, "mail")
    enqueue(conn, "typo")
    enqueue(conn, "later", run_at="now() + interval '1 hour'")
    conn.execute("SELECT jobs.register_worker('old', '{report}', 'h', 2)")
    conn.execute("SELECT jobs.worker_stopped('old')")
    enqueue(conn, "report")
    got = rows(conn, "SELECT kind, queued, ever_registered FROM jobs.kinds_without_worker ORDER BY kind")
    assert got == [
        {"kind": "report", "queued": 1, "ever_registered": True},
        {"kind": "typo", "queued": 1, "ever_registered": False},
    ]


def test_kinds_without_worker_counts_only_the_workers_that_claim_from_the_runs_queue(conn: Conn) -> None:
    """A live worker of the kind that claims from other queues than a run's does not serve it:
    the kind is listed with the queues its unserved due runs wait in, until a worker of the kind
    claims from that queue or from every queue (queues NULL)."""
    conn.execute("SELECT jobs.register_worker('w-mail', '{mail}', 'h', 1, '{outbox}')")
    enqueue(conn, "mail", queue="'outbox'")
    enqueue(conn, "mail", queue="'bulk'")
    enqueue(conn, "mail", queue="'bulk'")
    enqueue(conn, "mail", queue="'archive'")
    listed = "SELECT kind, queued, ever_registered, queues FROM jobs.kinds_without_worker ORDER BY kind"
    assert rows(conn, listed) == [
        {"kind": "mail", "queued": 3, "ever_registered": True, "queues": ["archive", "bulk"]}
    ]
    assert one(conn, "SELECT queues FROM jobs.workers WHERE worker = 'w-mail'") == {"queues": ["outbox"]}
    conn.execute("SELECT jobs.register_worker('w-bulk', '{mail}', 'h', 2, '{bulk,archive}')")
    assert rows(conn, listed) == []
    conn.execute("SELECT jobs.worker_stopped('w-bulk')")
    assert rows(conn, listed) == [
        {"kind": "mail", "queued": 3, "ever_registered": True, "queues": ["archive", "bulk"]}
    ]
    conn.execute("SELECT jobs.register_worker('w-any', '{mail}', 'h', 3)")  # every queue
    assert rows(conn, listed) == []
    assert one(conn, "SELECT queues FROM jobs.workers WHERE worker = 'w-any'") == {"queues": None}


def test_register_worker_rejects_bad_queues_and_keeps_the_registration_before_it(conn: Conn) -> None:
    conn.execute("SELECT jobs.register_worker('w', '{k}', 'h', 1, '{a}')")
    expect_error(conn, "SELECT jobs.register_worker('w', '{k}', 'h', 1, '{}')", None, "22023", "queues")
    expect_error(
        conn, "SELECT jobs.register_worker('w', '{k}', 'h', 1, %s)", (["a", " "],), "22023", "queues[2]"
    )
    expect_error(
        conn, "SELECT jobs.register_worker('w', '{k}', 'h', 1, %s)", (["a\nb"],), "22023", "queues[1]"
    )
    assert one(conn, "SELECT kinds, queues FROM jobs.workers WHERE worker = 'w'") == {
        "kinds": ["k"],
        "queues": ["a"],
    }


def test_register_worker_rejects_bad_kinds(conn: Conn) -> None:
    expect_error(conn, "SELECT jobs.register_worker('w', NULL)", None, "22023", "kinds")
    expect_error(conn, "SELECT jobs.register_worker('w', %s)", ([""],), "22023", "kinds")
    expect_error(conn, "SELECT jobs.register_worker('', '{k}')", None, "22023", "worker")


def age_registry(conn: Conn, age: str, *, workers: Sequence[str] = (), kinds: Sequence[str] = ()) -> None:
    """Make these workers last seen (and stopped, if they stopped), and these kinds last
    registered, ``age`` ago."""
    conn.execute(
        "UPDATE jobs.worker_registry SET last_seen_at = now() - %(age)s::interval,"
        " stopped_at = CASE WHEN stopped_at IS NOT NULL THEN now() - %(age)s::interval END"
        " WHERE worker = ANY (%(workers)s)",
        {"age": age, "workers": list(workers)},
    )
    conn.execute(
        "UPDATE jobs.known_kinds SET last_registered_at = now() - %s::interval WHERE kind = ANY (%s)",
        (age, list(kinds)),
    )


def registry(conn: Conn) -> tuple[set[str], set[str]]:
    workers = {r["worker"] for r in rows(conn, "SELECT worker FROM jobs.worker_registry")}
    kinds = {r["kind"] for r in rows(conn, "SELECT kind FROM jobs.known_kinds")}
    return workers, kinds


def test_the_leaders_prune_removes_workers_and_kinds_past_the_retention_and_keeps_what_is_in_use(
    conn: Conn,
) -> None:
    """The leader's prune (jobs.prune(NULL, batch)) keeps the registry to jobs.config.retention:
    a stopped or lost worker not seen for longer goes, unless it still holds a RUNNING run; a
    kind last registered longer ago goes unless a registered worker lists it, a definition
    names it or a QUEUED or RUNNING run is of it. Nothing newer is touched."""
    conn.execute("UPDATE jobs.config SET retention = '14 days'")
    conn.execute("SELECT jobs.register_worker('w-stopped-old', '{k-stale,k-done}', 'h', 1)")
    conn.execute("SELECT jobs.worker_stopped('w-stopped-old')")
    conn.execute("SELECT jobs.register_worker('w-lost-old', '{k-stale}', 'h', 2)")
    conn.execute("SELECT jobs.register_worker('w-stopped-recent', '{k-recent-worker}', 'h', 3)")
    conn.execute("SELECT jobs.worker_stopped('w-stopped-recent')")
    conn.execute("SELECT jobs.register_worker('w-alive', '{k-alive}', 'h', 4)")
    conn.execute("SELECT jobs.register_worker('w-lost-holding', '{k-running}', 'h', 5)")
    conn.execute("SELECT jobs.register_worker('w-kinds', '{k-def,k-queued,k-fresh}', 'h', 6)")
    conn.execute("SELECT jobs.worker_stopped('w-kinds')")
    conn.execute("SELECT jobs.define('def', 'k-def', run_at => now() + interval '1 day')")
    enqueue(conn, "k-queued", run_at="now() + interval '1 day'")
    running = enqueue(conn, "k-running")
    assert claim(conn, "w-lost-holding") == [running]
    done = enqueue(conn, "k-done")
    assert claim(conn, "w-alive") == [done]
    assert scalar(conn, "SELECT jobs.complete(%s, 'w-alive')", (done,)) is True
    old = ["w-stopped-old", "w-lost-old", "w-lost-holding", "w-kinds"]
    age_registry(conn, "15 days", workers=old)
    age_registry(conn, "1 day", workers=["w-stopped-recent"])
    # A live worker registers its kinds only when it starts: one up for months keeps them.
    age_registry(conn, "15 days", kinds=["k-stale", "k-done", "k-alive", "k-running", "k-def", "k-queued"])
    age_registry(conn, "13 days", kinds=["k-fresh", "k-recent-worker"])

    conn.execute("SELECT jobs.prune(NULL, 10000)")

    workers, kinds = registry(conn)
    assert workers == {"w-stopped-recent", "w-alive", "w-lost-holding"}, workers
    assert kinds == {"k-alive", "k-running", "k-def", "k-queued", "k-fresh", "k-recent-worker"}, kinds
    line = "SELECT worker, state FROM jobs.workers ORDER BY worker"
    assert [(r["worker"], r["state"]) for r in rows(conn, line)] == [
        ("w-alive", "alive"),
        ("w-lost-holding", "lost"),
        ("w-stopped-recent", "stopped"),
    ]
    # Once its run has ended, the lost worker goes too, and the kind only it listed with it.
    conn.execute("SELECT jobs.fail(%s, 'w-lost-holding', '{Error}', 'gone')", (running,))
    assert one(conn, "SELECT * FROM jobs.prune_registry()") == {"workers": 1, "kinds": 1}
    assert registry(conn) == (
        {"w-stopped-recent", "w-alive"},
        {"k-alive", "k-def", "k-queued", "k-fresh", "k-recent-worker"},
    )
    assert one(conn, "SELECT * FROM jobs.prune_registry()") == {"workers": 0, "kinds": 0}


def test_prune_registry_follows_older_than_and_the_configured_retention(conn: Conn) -> None:
    """older_than overrides jobs.config.retention, as for jobs.prune; a worker seen within the
    heartbeat timeout is alive and stays whatever older_than says."""
    conn.execute("SELECT jobs.register_worker('w-old', '{k-old}', 'h', 1)")
    conn.execute("SELECT jobs.worker_stopped('w-old')")
    conn.execute("SELECT jobs.register_worker('w-alive', '{k-alive}', 'h', 2)")
    age_registry(conn, "3 days", workers=["w-old"], kinds=["k-old", "k-alive"])
    assert one(conn, "SELECT * FROM jobs.prune_registry()") == {"workers": 0, "kinds": 0}
    conn.execute("UPDATE jobs.config SET retention = '2 days'")
    assert one(conn, "SELECT * FROM jobs.prune_registry()") == {"workers": 1, "kinds": 1}
    assert registry(conn) == ({"w-alive"}, {"k-alive"})
    assert one(conn, "SELECT * FROM jobs.prune_registry('0 seconds')") == {"workers": 0, "kinds": 0}
    expect_error(conn, "SELECT jobs.prune_registry('-1 day')", None, "22023", "older_than")


def test_register_worker_takes_at_most_1000_kinds_per_call(conn: Conn) -> None:
    """One call registers at most as many kinds as jobs.claim takes: a login cannot add a
    million kinds to jobs.known_kinds in one statement."""
    kinds = [f"k{i}" for i in range(1001)]
    expect_error(conn, "SELECT jobs.register_worker('w', %s)", (kinds,), "22023", "kinds", "1000")
    assert registry(conn) == (set(), set())
    conn.execute("SELECT jobs.register_worker('w', %s)", (kinds[:1000],))
    assert scalar(conn, "SELECT count(*) FROM jobs.known_kinds") == 1000


def test_a_worker_login_cannot_write_escape_sequences_into_what_operators_read(db: Database) -> None:
    """Any jobs_worker login may register, and its worker id, kinds and host are shown to
    operators (jobs.workers, jobs.known_kinds, psql, the CLI): a terminal escape sequence, a
    line break or a text-direction override there is refused (22023, naming the field), and
    nothing is recorded."""
    hostile = [
        ("\x1b]0;owned\x07w", ["k"], "h", "worker"),
        ("w", ["report", "evil\x1b[2J"], "h", "kinds[2]"),
        ("w", ["re\u202eport"], "h", "kinds[1]"),
        ("w", ["   "], "h", "kinds[1]"),
        ("w", ["k"], "host\nworker=w-forged state=alive", "host"),
    ]
    with db.worker_login("hostile") as login, psycopg.connect(db.dsn_as(login), autocommit=True) as worker:
        for worker_id, kinds, host, field in hostile:
            expect_error(
                worker,
                "SELECT jobs.register_worker(%s, %s, %s, 1)",
                (worker_id, kinds, host),
                "22023",
                field,
            )
        worker.execute("SELECT jobs.register_worker('w-plain', '{report}', 'host-a', 1)")
    with db.connect() as conn:
        assert [r[0] for r in conn.execute("SELECT worker FROM jobs.worker_registry")] == ["w-plain"]
        assert [r[0] for r in conn.execute("SELECT kind FROM jobs.known_kinds")] == ["report"]


def test_run_detail_gives_the_attempt_chain_from_any_attempt(conn: Conn) -> None:
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 3, backoff_initial => '0')")
    first = enqueue(conn, "k")
    ids = [first]
    for attempt in range(3):
        assert claim(conn, "w") == [ids[-1]]
        nxt = one(conn, "SELECT (f).id, (f).status::text AS s FROM jobs.fail(%s, 'w', '{E}', %s) AS f",
                  (ids[-1], f"E: failure {attempt + 1}\nTraceback ..."))  # fmt: skip
        if nxt["s"] == "QUEUED":
            ids.append(nxt["id"])
    assert len(ids) == 3
    for run in ids:
        detail = one(conn, "SELECT * FROM jobs.run_detail(%s)", (run,))
        chain = [(a["id"], a["attempt"], a["status"], a["error"]) for a in detail["attempts"]]
        assert chain == [
            (ids[0], 1, "FAILED", "E: failure 1"),
            (ids[1], 2, "FAILED", "E: failure 2"),
            (ids[2], 3, "FAILED", "E: failure 3"),
        ], f"from run {run}: {chain}"
        assert detail["error"].endswith("\nTraceback ..."), "the error as stored"
    expect_error(conn, "SELECT * FROM jobs.run_detail(424242)", None, "P0002", "424242")


def test_run_detail_gives_the_attempts_left_when_the_first_ones_are_gone(conn: Conn) -> None:
    """A failed first attempt discarded, or pruned with its day of history, while its retries
    stay: the chain starts at the earliest attempt left, not nowhere."""
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 3, backoff_initial => '0', jitter => 0)")
    ids = [enqueue(conn, "k")]
    for _ in range(2):
        assert claim(conn, "w") == [ids[-1]]
        ids.append(scalar(conn, "SELECT id FROM jobs.fail(%s, 'w', '{E}', 'boom')", (ids[-1],)))
    conn.execute("UPDATE jobs.runs SET finished_at = now() - interval '3 days' WHERE id = %s", (ids[0],))
    assert scalar(conn, "SELECT jobs.archive()") == 1, "the first attempt moved to history"
    assert scalar(conn, "SELECT jobs.discard(%s)", ([ids[0]],)) == 1
    for run in ids[1:]:
        detail = one(conn, "SELECT * FROM jobs.run_detail(%s)", (run,))
        chain = [(a["id"], a["attempt"]) for a in detail["attempts"]]
        assert chain == [(ids[1], 2), (ids[2], 3)], f"from run {run}: {chain}"


def test_undefine_detail_cancels_queued_lets_running_finish_and_keeps_history(conn: Conn) -> None:
    conn.execute("SELECT jobs.define('d', 'k', schedule => '* * * * *')")
    done = scalar(conn, "SELECT id FROM jobs.run_now('d')")
    assert claim(conn, "w") == [done]
    conn.execute("SELECT jobs.complete(%s, 'w')", (done,))
    running = scalar(conn, "SELECT id FROM jobs.run_now('d')")
    assert claim(conn, "w") == [running]
    scalar(conn, "SELECT id FROM jobs.run_now('d')")
    got = one(conn, "SELECT * FROM jobs.undefine_detail('d')")
    assert got == {"definition": "d", "cancelled": 1, "still_running": [running], "history": 2}
    assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == 0
    assert scalar(conn, "SELECT jobs.complete(%s, 'w')", (running,)) is True, "the running run finishes"
    expect_error(conn, "SELECT * FROM jobs.undefine_detail('d')", None, "P0002", "'d'")


def test_prune_count_is_what_prune_deletes(conn: Conn) -> None:
    conn.execute(
        "INSERT INTO jobs.runs (kind, status, finished_at) SELECT 'k', 'COMPLETED', now() - interval '2 days'"
        " FROM generate_series(1, 7)"
    )
    enqueue(conn, "k")
    assert scalar(conn, "SELECT jobs.prune_count('1 day')") == 7
    assert scalar(conn, "SELECT jobs.prune_count('3 days')") == 0
    assert scalar(conn, "SELECT jobs.prune('1 day', 5)") == 5
    assert scalar(conn, "SELECT jobs.prune_count('1 day')") == 2
    expect_error(conn, "SELECT jobs.prune_count('-1 day')", None, "22023", "older_than")


@pytest.mark.parametrize(
    ("policy", "runs", "sentence"),
    [
        ("coalesce", 1, "caught up after 2m30s of downtime: 16 occurrences coalesced into 1"),
        ("catch_up", 15, "caught up after 2m20s of downtime: 15 occurrences run late (15 runs)"),
        ("skip", 0, "caught up after 2m30s of downtime: 16 occurrences skipped (past the misfire grace)"),
    ],
)
def test_record_catch_up_once_supersede_stale_runs_and_say_it_in_a_sentence(
    conn: Conn, policy: str, runs: int, sentence: str
) -> None:
    definition = scalar(conn, "SELECT id FROM jobs.define('d', 'k', schedule => '* * * * *')")
    now = scalar(conn, "SELECT now()")
    cursor = now + timedelta(seconds=50)
    conn.execute("UPDATE jobs.definitions SET next_run_at = %s", (cursor,))
    stale = scalar(
        conn,
        "INSERT INTO jobs.runs (definition_id, kind, origin, scheduled_for) VALUES (%s, 'k', 'schedule', %s)"
        " RETURNING id",
        (definition, now - timedelta(seconds=150)),
    )
    args = (definition, policy, now - timedelta(seconds=140), now - timedelta(seconds=10), runs, cursor)
    call = "SELECT jobs.record_catch_up(%s, %s, %s, %s, 15, %s, %s)"
    assert scalar(conn, call, (*args[:5], now)) is None, "a cursor elsewhere: stale, nothing recorded"
    said = scalar(conn, call, args)
    assert scalar(conn, call, args) is None, "a second leader's record adds nothing"
    described = scalar(conn, "SELECT last_catch_up FROM jobs.definition_health WHERE id = %s", (definition,))
    assert said == described
    # The downtime is measured up to this statement's now(): a second may have passed.
    assert described.replace("2m31s", "2m30s").replace("2m21s", "2m20s") == sentence, described
    assert scalar(conn, "SELECT count(*) FROM jobs.catch_ups") == 1
    status, error = one(conn, "SELECT status::text, error FROM jobs.runs WHERE id = %s", (stale,)).values()
    if policy == "catch_up":
        assert (status, error) == ("QUEUED", None), "catch_up runs every late occurrence"
    else:
        assert status == "CANCELLED" and error.startswith("skipped: "), error


@pytest.mark.parametrize("policy", ["coalesce", "skip"])
def test_a_catch_up_supersedes_late_occurrences_never_a_run_snoozed_since_it_began(
    conn: Conn, policy: str
) -> None:
    """coalesce and skip cancel the late occurrences that never started; a run that began and
    snoozed (jobs.snooze) asked to run later, and a catch-up leaves it to run."""
    definition = scalar(
        conn, "SELECT id FROM jobs.define('d', 'k', schedule => '* * * * *', jitter => '20 seconds')"
    )
    base = scalar(conn, "SELECT date_trunc('minute', now())")
    began, late = base - timedelta(minutes=10), base - timedelta(minutes=9)
    conn.execute("SELECT jobs.materialize(%s, NULL, '{}', %s)", (definition, began))
    conn.execute(
        "SELECT jobs.materialize(%s, %s, %s::timestamptz[], %s)",
        (definition, began, [began, late], late + timedelta(minutes=1)),
    )
    snoozed, stale = (
        int(r[0])
        for r in conn.execute(
            "SELECT id FROM jobs.runs WHERE definition_id = %s ORDER BY occurrence_at", (definition,)
        )
    )
    assert [r[0] for r in conn.execute("SELECT id FROM jobs.claim(1, 'w')")] == [snoozed]
    assert scalar(conn, "SELECT jobs.snooze(%s, 'w', '0 seconds')", (snoozed,)) is True
    now = scalar(conn, "SELECT now()")
    cursor = now + timedelta(minutes=2)
    conn.execute("UPDATE jobs.definitions SET next_run_at = %s WHERE id = %s", (cursor, definition))
    assert scalar(
        conn,
        "SELECT jobs.record_catch_up(%s, %s, %s, %s, 2, %s, %s)",
        (
            definition,
            policy,
            now + timedelta(seconds=1),
            now + timedelta(minutes=1),
            int(policy == "coalesce"),
            cursor,
        ),
    )
    got = {r[0]: r[1:] for r in conn.execute("SELECT id, status::text, failure_reason FROM jobs.runs")}
    assert got[snoozed] == ("QUEUED", None), got
    assert got[stale] == ("CANCELLED", "Skipped"), got


def test_record_catch_up_rejects_nonsense(conn: Conn) -> None:
    definition = scalar(conn, "SELECT id FROM jobs.define('d', 'k', schedule => '* * * * *')")
    bad = [
        ("now()", "NULL", "'coalesce'", "1", "first_late"),
        ("now()", "now() - interval '1 s'", "'coalesce'", "1", "first_late"),
        ("now()", "now()", "'coalesce'", "2", "runs"),
        ("now()", "now()", "'sometimes'", "1", "misfire_policy"),
    ]
    for first, last, policy, runs, field in bad:
        expect_error(
            conn,
            f"SELECT jobs.record_catch_up(%s, {policy}, {first}, {last}, 1, {runs}, NULL)",
            (definition,),
            "22023",
            field,
        )


def test_record_catch_up_counts_up_to_the_largest_integer(conn: Conn) -> None:
    """The most occurrences it takes, with runs superseded on top: recorded, the count held at
    the column's largest value rather than overflowing it."""
    definition = scalar(conn, "SELECT id FROM jobs.define('d', 'k', schedule => '* * * * *')")
    now = scalar(conn, "SELECT now()")
    cursor = now + timedelta(minutes=1)
    conn.execute("UPDATE jobs.definitions SET next_run_at = %s", (cursor,))
    conn.execute(
        "INSERT INTO jobs.runs (definition_id, kind, origin, scheduled_for) VALUES (%s, 'k', 'schedule', %s)",
        (definition, now - timedelta(minutes=10)),
    )
    said = scalar(
        conn,
        "SELECT jobs.record_catch_up(%s, 'coalesce', %s, %s, 2147483647, 1, %s)",
        (definition, now - timedelta(minutes=5), now, cursor),
    )
    assert said is not None
    recorded = one(conn, "SELECT occurrences, runs, superseded FROM jobs.catch_ups")
    assert recorded == {"occurrences": 2147483647, "runs": 1, "superseded": 1}, recorded


@pytest.mark.parametrize(
    ("interval", "text"),
    [
        ("0", "0s"),
        ("45 s", "45s"),
        ("150 s", "2m30s"),
        ("120 s", "2m"),
        ("3900 s", "1h05m"),
        ("100800 s", "1d4h"),
    ],
)
def test_compact_interval(conn: Conn, interval: str, text: str) -> None:
    from pgtick.terminal import compact_duration

    assert scalar(conn, "SELECT jobs.compact_interval(%s::interval)", (interval,)) == text
    seconds = scalar(conn, "SELECT extract(epoch FROM %s::interval)::float", (interval,))
    assert compact_duration(seconds) == text, "the CLI and SQL say durations the same way"
