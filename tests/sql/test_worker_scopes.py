"""Worker scopes: an operator gives a worker login only the kinds or queues it serves.

jobs.claim intersects what its caller asks for with the scope of session_user (the login
the worker connected as), so a scoped login never gets a run outside its scope, whatever
kinds or queues it passes and whatever role it SETs. Each test logs in as real LOGIN roles.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness import Conn, Database, expect_error, scalar

KINDS = ("a", "b", "c")
QUEUES = ("q1", "q2")


@pytest.fixture
def logins(db: Database) -> Iterator[tuple[str, str]]:
    """Two LOGIN roles that are members of jobs_worker only (dropped at the end)."""
    with db.worker_login("scope_a") as a, db.worker_login("scope_b") as b:
        yield a, b


def _fill(conn: Conn, per_pair: int = 2) -> None:
    """per_pair due QUEUED runs of every kind in every queue."""
    conn.execute(
        """
        INSERT INTO jobs.runs (kind, queue, scheduled_for)
        SELECT k, q, now() - interval '1 hour'
          FROM unnest(%s::text[]) AS k, unnest(%s::text[]) AS q, generate_series(1, %s)
        """,
        (list(KINDS), list(QUEUES), per_pair),
    )


def _claim(
    worker: Conn, kinds: list[str] | None = None, queues: list[str] | None = None
) -> set[tuple[str, str]]:
    """Claim up to 100 runs; the (kind, queue) pairs claimed."""
    got = worker.execute(
        "SELECT kind, queue FROM jobs.claim(100, 'w', kinds => %s, queues => %s)", (kinds, queues)
    ).fetchall()
    return {(k, q) for k, q in got}


def _scopes(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT role::text, kinds, queues FROM jobs.worker_scopes ORDER BY role").fetchall()


def test_a_scoped_login_claims_only_within_its_scope(
    db: Database, conn: Conn, logins: tuple[str, str]
) -> None:
    """Scoped to kinds a,b in queue q1: asking for everything gets only those; asking for an
    out-of-scope kind or queue gets nothing; an unscoped login still gets the rest."""
    scoped, free = logins
    _fill(conn)
    conn.execute("SELECT jobs.scope_worker(%s, '{a,b}', '{q1}')", (scoped,))
    with db.connect(user=scoped) as w:
        for kinds, queues in ((["c"], None), (None, ["q2"]), (["c"], ["q2"]), (["a"], ["q2"])):
            got = _claim(w, kinds, queues)
            assert got == set(), f"kinds={kinds} queues={queues} outside the scope claimed {got}"
        got = _claim(w, ["a", "c"], None)
        assert got == {("a", "q1")}, f"kinds a,c: expected only (a, q1), got {got}"
        got = _claim(w)
        assert got == {("b", "q1")}, f"everything asked: expected the rest of the scope (b, q1), got {got}"
    left = conn.execute(
        "SELECT count(*) FROM jobs.runs"
        " WHERE status = 'RUNNING' AND NOT (kind IN ('a', 'b') AND queue = 'q1')"
    ).fetchone()
    assert left == (0,), f"runs outside the scope were claimed: {left}"
    with db.connect(user=free) as w:
        got = _claim(w)
    expected = {(k, q) for k in KINDS for q in QUEUES} - {("a", "q1"), ("b", "q1")}
    assert got == expected, f"an unscoped login got {got}, expected {expected}"


def test_a_scope_of_kinds_alone_leaves_every_queue(db: Database, conn: Conn, logins: tuple[str, str]) -> None:
    scoped, _ = logins
    _fill(conn, per_pair=1)
    conn.execute("SELECT jobs.scope_worker(%s, kinds => '{c}')", (scoped,))
    with db.connect(user=scoped) as w:
        got = _claim(w)
    assert got == {("c", "q1"), ("c", "q2")}, f"scoped to kind c (any queue), got {got}"


# The claim's paths: its one statement when nothing is capped, its two statements under only
# roomy limits, its two statements under only capped definitions (one defined, with no run of
# its own queued), and its steps under a tight limit; each with the session hint its settings
# read leaves.
PATHS = {
    "nothing-capped": (None, "off"),
    "roomy-limit": ("SELECT jobs.set_limit('queue', 'q1', max_running => 10000)", "roomy"),
    "tight-limit": ("SELECT jobs.set_limit('queue', 'q2', max_running => 50)", "on"),
    "capped-definition": (
        "SELECT jobs.define(name => 'capped', kind => 'z', schedule => '@yearly', max_concurrent_runs => 1)",
        "defs",
    ),
}


def _claim_on_path(worker: Conn, hint: str) -> set[tuple[str, str]]:
    """Claim everything in batches of 10 (the roomy path takes batches of up to 20) as a session
    that has claimed before: the first claim, of a kind nobody queued, reads the settings and
    leaves the hint that the later ones follow."""
    worker.execute("SELECT jobs.claim(10, 'w', kinds => '{none}')").fetchall()
    left = scalar(worker, "SELECT coalesce(nullif(current_setting('pgtick.claim_steps', true), ''), 'off')")
    assert left == hint, f"the settings read left the hint {left!r}, expected {hint!r}"
    got: set[tuple[str, str]] = set()
    while batch := worker.execute("SELECT kind, queue FROM jobs.claim(10, 'w')").fetchall():
        got |= {(k, q) for k, q in batch}
    return got


@pytest.mark.parametrize("path", list(PATHS))
def test_scope_and_paused_queues_hold_on_every_claim_path(
    db: Database, conn: Conn, logins: tuple[str, str], path: str
) -> None:
    """Whichever way the claim goes, a scoped login gets only its scope and nobody gets a run of
    a paused queue. The scope here was written to the table directly with a NULL among its kinds
    (jobs.scope_worker refuses one): a NULL names no kind, so it opens nothing."""
    scoped, free = logins
    setup, hint = PATHS[path]
    if setup:
        conn.execute(setup)
    _fill(conn, per_pair=12)
    conn.execute(
        "INSERT INTO jobs.worker_scopes (role, kinds, queues) VALUES (%s, '{a,NULL}', NULL)", (scoped,)
    )
    conn.execute("SELECT jobs.pause_queue('q2')")
    with db.connect(user=scoped) as w:
        got = _claim_on_path(w, hint)
    assert got == {("a", "q1")}, f"{path}: scoped to kinds {{a,NULL}} with q2 paused, got {got}"
    with db.connect(user=free) as w:
        got = _claim_on_path(w, hint)
    assert got == {("b", "q1"), ("c", "q1")}, f"{path}: unscoped with q2 paused, got {got}"
    conn.execute("SELECT jobs.resume_queue('q2')")
    with db.connect(user=free) as w:
        got = _claim_on_path(w, hint)
    assert got == {(k, "q2") for k in KINDS}, f"{path}: once q2 resumed, got {got}"


def test_set_role_does_not_widen_a_scope(db: Database, conn: Conn, logins: tuple[str, str]) -> None:
    """The scoped login may SET ROLE to an unscoped role it is a member of (another worker
    login, jobs_worker): the scope follows the login, not the current role."""
    scoped, free = logins
    _fill(conn, per_pair=1)
    conn.execute(f'GRANT "{free}" TO "{scoped}"')
    conn.execute("SELECT jobs.scope_worker(%s, '{a}', '{q1}')", (scoped,))
    with db.connect(user=scoped) as w:
        for role in (free, "jobs_worker"):
            w.execute(f'SET ROLE "{role}"')
            assert scalar(w, "SELECT current_user") == role
            got = _claim(w, ["b", "c"])
            assert got == set(), f"as {role}, kinds b,c outside the scope claimed {got}"
            w.execute("RESET ROLE")
        w.execute(f'SET ROLE "{free}"')
        got = _claim(w)
    assert got == {("a", "q1")}, f"after SET ROLE {free}, expected only (a, q1), got {got}"


def test_unscope_restores_every_run(db: Database, conn: Conn, logins: tuple[str, str]) -> None:
    scoped, _ = logins
    _fill(conn, per_pair=1)
    assert (scalar(conn, "SELECT (jobs.scope_worker(%s, '{a}')).kinds", (scoped,))) == ["a"]
    assert scalar(conn, "SELECT jobs.unscope_worker(%s)", (scoped,)) is True
    assert scalar(conn, "SELECT jobs.unscope_worker(%s)", (scoped,)) is False, "unscoped twice"
    with db.connect(user=scoped) as w:
        got = _claim(w)
    expected = {(k, q) for k in KINDS for q in QUEUES}
    assert got == expected, f"after unscope, expected every run, got {got}"


def test_a_new_scope_replaces_the_old_one(db: Database, conn: Conn, logins: tuple[str, str]) -> None:
    scoped, _ = logins
    conn.execute("SELECT jobs.scope_worker(%s, '{a}', '{q1}')", (scoped,))
    conn.execute("SELECT jobs.scope_worker(%s, queues => '{q2}')", (scoped,))
    assert _scopes(conn) == [(scoped, None, ["q2"])], _scopes(conn)
    listed = conn.execute(
        "SELECT role::text, kinds, queues, role_exists FROM jobs.worker_scope_list"
    ).fetchall()
    assert listed == [(scoped, None, ["q2"], True)], listed


BAD = [
    # (role, kinds, queues, the field named)
    ("pgtick_t_no_such_role", ["a"], None, "role"),
    ("jobs_worker", ["a"], None, "role"),  # a group role cannot log in: the scope would never bind
    (None, ["a"], None, "role"),
    ("", ["a"], None, "role"),
    ("{scoped}", None, None, "kinds"),
    ("{scoped}", [], None, "kinds"),
    ("{scoped}", None, [], "queues"),
    ("{scoped}", ["a", None], None, "kinds[2]"),
    ("{scoped}", ["a", ""], None, "kinds[2]"),
    ("{scoped}", ["a"], ["q\n1"], "queues[1]"),
    ("{scoped}", ["a\x1b[31m"], None, "kinds[1]"),
    ("{scoped}", ["k" * 201], None, "kinds[1]"),
    ("{scoped}", [f"k{i}" for i in range(1001)], None, "kinds"),
    ("{scoped}", None, [f"q{i}" for i in range(1001)], "queues"),
]


@pytest.mark.parametrize(("role", "kinds", "queues", "field"), BAD)
def test_bad_scope_input_is_refused_naming_the_field(
    db: Database,
    conn: Conn,
    logins: tuple[str, str],
    role: str | None,
    kinds: list[str | None] | None,
    queues: list[str] | None,
    field: str,
) -> None:
    """22023 naming the field, from an operator login, and the scope already set is unchanged."""
    scoped, _ = logins
    if role == "{scoped}":
        role = scoped
    conn.execute("SELECT jobs.scope_worker(%s, '{a}', '{q1}')", (scoped,))
    before = _scopes(conn)
    with db.connect(user="pgtick_t_operator") as op:
        expect_error(op, "SELECT jobs.scope_worker(%s, %s, %s)", (role, kinds, queues), "22023", field)
    assert _scopes(conn) == before, f"a refused scope_worker({role!r}) changed the scopes: {_scopes(conn)}"


def test_only_operators_may_scope(db: Database, conn: Conn, logins: tuple[str, str]) -> None:
    """A worker (even the scoped one) cannot widen or lift its scope, nor read the scopes;
    a reader can read them; an operator login can set and lift them."""
    scoped, _ = logins
    conn.execute("SELECT jobs.scope_worker(%s, '{a}')", (scoped,))
    before = _scopes(conn)
    for user in (scoped, "pgtick_t_worker", "pgtick_t_reader"):
        with db.connect(user=user) as c:
            expect_error(c, "SELECT jobs.scope_worker(%s, '{a,b,c}')", (scoped,), "42501", "scope_worker")
            expect_error(c, "SELECT jobs.unscope_worker(%s)", (scoped,), "42501", "unscope_worker")
    with db.connect(user=scoped) as c:
        expect_error(c, "SELECT * FROM jobs.worker_scope_list", None, "42501", "worker_scope_list")
    assert _scopes(conn) == before, f"a non-operator changed the scopes: {_scopes(conn)}"
    with db.connect(user="pgtick_t_reader") as c:
        assert scalar(c, "SELECT count(*) FROM jobs.worker_scope_list") == 1
    with db.connect(user="pgtick_t_operator") as op:
        assert scalar(op, "SELECT (jobs.scope_worker(%s, '{b}')).kinds", (scoped,)) == ["b"]
        assert scalar(op, "SELECT jobs.unscope_worker(%s)", (scoped,)) is True


def test_next_due_reports_only_what_the_worker_could_claim(
    db: Database, conn: Conn, logins: tuple[str, str]
) -> None:
    """An idle worker sleeps until jobs.next_due's instant. It names the earliest future run the
    caller could claim: of its kinds and queues, within its login's scope, not in a paused queue,
    not waiting on a dependency. A run it could never claim must not wake it."""
    scoped, free = logins
    at = {
        name: scalar(conn, "SELECT now() + %s::interval", (offset,))
        for name, offset in (
            ("blocked", "1 min"),
            ("paused", "2 min"),
            ("b", "3 min"),
            ("q2", "4 min"),
            ("a", "5 min"),
        )
    }
    parent = scalar(
        conn, "SELECT id FROM jobs.enqueue('a', run_at => now() + interval '1 day', queue => 'q1')"
    )
    conn.execute(
        "SELECT jobs.enqueue('a', run_at => %s, queue => 'q1', depends_on => ARRAY[%s]::bigint[])",
        (at["blocked"], parent),
    )
    conn.execute("SELECT jobs.enqueue('a', run_at => %s, queue => 'held')", (at["paused"],))
    conn.execute("SELECT jobs.pause_queue('held')")
    conn.execute("SELECT jobs.enqueue('b', run_at => %s, queue => 'q1')", (at["b"],))
    conn.execute("SELECT jobs.enqueue('a', run_at => %s, queue => 'q2')", (at["q2"],))
    conn.execute("SELECT jobs.enqueue('a', run_at => %s, queue => 'q1')", (at["a"],))
    conn.execute("SELECT jobs.scope_worker(%s, '{a}', '{q1}')", (scoped,))

    def next_due(user: str, kinds: list[str] | None = None, queues: list[str] | None = None) -> object:
        with db.connect(user=user) as w:
            return scalar(w, "SELECT next_at FROM jobs.next_due(%s, %s)", (kinds, queues))

    cases = [
        (free, None, None, at["b"]),
        (free, ["a"], None, at["q2"]),
        (free, ["a"], ["q1"], at["a"]),
        (free, None, ["q2"], at["q2"]),
        (scoped, None, None, at["a"]),
        (scoped, ["b"], None, None),
    ]
    wrong = [(u, k, q, next_due(u, k, q), want) for u, k, q, want in cases if next_due(u, k, q) != want]
    assert not wrong, f"(login, kinds, queues, got, expected): {wrong}"
    conn.execute("SELECT jobs.resume_queue('held')")
    assert next_due(free) == at["paused"], "a resumed queue's run is due again"
