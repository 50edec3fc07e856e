"""Schema installation: versioned migrations plus re-applied functions and views.

``sql/install.sql`` is the one record of what is loaded and in which order: a
short psql file of ``\\ir`` lines. Two equal paths follow it:

* psql runs it directly (``psql -f sql/install.sql``);
* ``pgtick migrate`` (``apply``) reads the same lines (``install_plan``) and
  applies the same files over a psycopg connection.

``pgtick migrate --sql`` (``install_script``) prints the plan with every include
inlined, as one psql script; it is generated on demand, never committed.

Both paths take the advisory lock named in install.sql first (``apply`` for its
session, psql for its transaction), so concurrent migrators run one after the other;
a migration already recorded in ``jobs.schema_migrations`` is skipped (and recorded
in the transaction that applies it), and everything in ``sql/`` is ``CREATE OR REPLACE`` and re-applied
every time, in one transaction. The psql install (the file, or the printed script) is
one transaction from the lock to the functions: stopped anywhere, it leaves nothing.
``apply`` commits each migration on its own (the last with the functions), so that a
migration waiting for a lock on a live system can give way and try again.
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from pgtick import calls
from pgtick.db import behind_pooler
from pgtick.errors import PgtickError, SchemaMismatch

log = logging.getLogger("pgtick.migrate")

_LOCK_LINE = re.compile(r"^\\set\s+pgtick_migration_lock\s+(\d+)\s*$")
_MIGRATION_LINE = re.compile(
    r"^\\set\s+migration\s+(\d{4})_([a-z0-9_]+)\s+\\ir\s+\.\./migrations/apply\.sql\s*$"
)
_BOOTSTRAP_LINE = re.compile(r"^\\ir\s+\.\./migrations/bootstrap\.sql\s*$")
_SQL_LINE = re.compile(r"^\\ir\s+([a-z0-9_]+\.sql)\s*$")


class SchemaFilesMissing(PgtickError, RuntimeError):
    """The sql/ and migrations/ directories, or a file install.sql names, could not be found:
    a broken installation, which the CLI says in one line (exit code 1)."""


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    path: Path

    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")


@dataclass(frozen=True)
class InstallPlan:
    """What ``sql/install.sql`` loads, in order."""

    lock_key: int
    bootstrap: Path
    migrations: list[Migration]
    function_files: list[Path]


def schema_root() -> Path:
    """Directory holding ``sql/`` and ``migrations/``: the wheel's copy, else the checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_schema", here.parent.parent):
        if (candidate / "sql").is_dir() and (candidate / "migrations").is_dir():
            return candidate
    raise SchemaFilesMissing(f"cannot find sql/ and migrations/ near {here}")


def _existing(path: Path) -> Path:
    if not path.is_file():
        raise SchemaFilesMissing(f"sql/install.sql names a file that does not exist: {path}")
    return path


def install_plan(root: Path | None = None) -> InstallPlan:
    """Parse ``sql/install.sql``: the lock key, the bootstrap, migrations and sql files in order."""
    root = root or schema_root()
    lock_key: int | None = None
    bootstrap: Path | None = None
    found: list[Migration] = []
    files: list[Path] = []
    for line in (root / "sql" / "install.sql").read_text(encoding="utf-8").splitlines():
        if match := _LOCK_LINE.match(line):
            lock_key = int(match.group(1))
        elif _BOOTSTRAP_LINE.match(line):
            bootstrap = _existing(root / "migrations" / "bootstrap.sql")
        elif match := _MIGRATION_LINE.match(line):
            version, name = match.groups()
            found.append(Migration(version, name, _existing(root / "migrations" / f"{version}_{name}.sql")))
        elif match := _SQL_LINE.match(line):
            files.append(_existing(root / "sql" / match.group(1)))
        elif line.startswith("\\ir") or line.startswith("\\set migration"):
            raise SchemaFilesMissing(f"sql/install.sql: include not understood: {line!r}")
    if lock_key is None or bootstrap is None:
        raise SchemaFilesMissing("sql/install.sql must set pgtick_migration_lock and include the bootstrap")
    return InstallPlan(lock_key, bootstrap, found, files)


def migrations(root: Path | None = None) -> list[Migration]:
    return install_plan(root).migrations


def function_files(root: Path | None = None) -> list[Path]:
    return install_plan(root).function_files


def _record(migration: Migration) -> str:
    return (
        "INSERT INTO jobs.schema_migrations (version, name) "
        f"VALUES ('{migration.version}', '{migration.name}');\n"
    )


#: The search path while installing: only the system catalog (and the session's temporary
#: schema last), so that no function another role created in a schema of the caller's path
#: can stand in for a built-in a migration calls unqualified and run with the installer's
#: rights. Every pgtick object is named with its schema.
INSTALL_SEARCH_PATH = "pg_catalog, pg_temp"

#: The settings the install runs under, whatever the caller's session or database sets, each
#: given back at the end: the search path (above); string literals read as the schema files
#: write them (standard_conforming_strings off reads '\m' as 'm' and refuses U&'' literals);
#: identifiers that a migration reads back from the catalog unquoted (pg_get_constraintdef).
INSTALL_SETTINGS = {
    "search_path": INSTALL_SEARCH_PATH,
    "standard_conforming_strings": "on",
    "quote_all_identifiers": "off",
}


def install_script(root: Path | None = None) -> str:
    """``sql/install.sql`` with every include inlined: one psql script, same order."""
    plan = install_plan(root)
    out = [
        "-- pgtick install script for psql, printed by `pgtick migrate --sql` from sql/install.sql.\n",
        "-- Usage: psql -v ON_ERROR_STOP=1 -d DBNAME -f install.sql\n",
        "-- Safe to re-run: applied migrations are skipped; functions and views are replaced.\n",
        "\\set ON_ERROR_STOP on\n",
        "SET client_min_messages = warning;\n",
        *(f"SELECT current_setting('{name}') AS pgtick_{name} \\gset\n" for name in INSTALL_SETTINGS),
        *(f"SET {name} = {value};\n" for name, value in INSTALL_SETTINGS.items()),
        # One transaction, from the migration lock to the functions (as sql/install.sql): an
        # install stopped anywhere leaves the database as it was, and a rerun applies it whole.
        "SELECT current_setting('lock_timeout') AS pgtick_lock_timeout \\gset\n",
        "SELECT current_setting('statement_timeout') AS pgtick_statement_timeout \\gset\n",
        "BEGIN;\nSET LOCAL lock_timeout = 0;\nSET LOCAL statement_timeout = 0;\n",
        f"SELECT pg_advisory_xact_lock({plan.lock_key}) AS pgtick_locked \\gset\n",
        "SELECT set_config('lock_timeout', :'pgtick_lock_timeout', true) AS pgtick_lock_timeout \\gset\n",
        "SELECT set_config('statement_timeout', :'pgtick_statement_timeout', true)"
        " AS pgtick_statement_timeout \\gset\n",
        "\n-- migrations/bootstrap.sql\n",
        plan.bootstrap.read_text(encoding="utf-8"),
    ]
    for migration in plan.migrations:
        flag = f"pgtick_apply_{migration.version}"
        out += [
            f"\n-- migrations/{migration.path.name}\n",
            f"SELECT NOT EXISTS (SELECT FROM jobs.schema_migrations WHERE version = "
            f"'{migration.version}') AS {flag} \\gset\n",
            f"\\if :{flag}\n",
            migration.sql(),
            _record(migration),
            "\\endif\n",
        ]
    if any(m.version >= _FIRST_WITH_PACKAGE_VERSION for m in plan.migrations):
        out.append("\n-- the pgtick version that printed this script applied what it applied\n")
        for migration in plan.migrations:
            out.append(
                f"\\if :pgtick_apply_{migration.version}\n"
                f"UPDATE jobs.schema_migrations SET package_version = '{_package_version()}' "
                f"WHERE version = '{migration.version}';\n\\endif\n"
            )
    if plan.migrations:
        out += [
            "\n-- a schema a newer pgtick migrated keeps its functions\n",
            "SELECT EXISTS (SELECT FROM jobs.schema_migrations WHERE version > "
            f"'{plan.migrations[-1].version}') AS pgtick_newer \\gset\n",
            "\\if :pgtick_newer\n",
            "DO $newer$ BEGIN\n"
            "    RAISE EXCEPTION 'the jobs schema has migrations this install does not know: a newer pgtick"
            " migrated it; nothing was applied'\n"
            "        USING ERRCODE = '55000', HINT = 'Install with that pgtick (or a later one).';\n"
            "END $newer$;\n",
            "\\endif\n",
        ]
    out.append("\n-- functions and views (re-applied every time), in the same transaction\n")
    for path in plan.function_files:
        out += [f"\n-- sql/{path.name}\n", path.read_text(encoding="utf-8")]
    out += [
        "COMMIT;\n",
        *(
            f"SELECT set_config('{name}', :'pgtick_{name}', false) AS pgtick_{name} \\gset\n"
            for name in INSTALL_SETTINGS
        ),
    ]
    return "".join(out)


#: The migration that adds jobs.schema_migrations.package_version.
_FIRST_WITH_PACKAGE_VERSION = "0008"


def _package_version() -> str:
    from pgtick import __version__

    return __version__


def applied_versions(conn: psycopg.Connection[Any]) -> set[str]:
    if not calls.migration_ledger_exists(conn):
        return set()
    return calls.applied_migrations(conn)


def check_schema(conn: psycopg.Connection[Any], root: Path | None = None) -> str | None:
    """Whether this database's jobs schema is the one this driver needs, for a process that
    is about to work on it (``pgtick run``, the ASGI integration).

    Raises ``SchemaMismatch`` (one line, saying to run ``pgtick migrate``) when the schema is
    not installed or lacks a migration this driver's ``sql/install.sql`` lists. Returns a
    warning when the database records migrations this driver does not know (a newer pgtick
    migrated it): the driver still starts, since during a rolling upgrade the schema is
    migrated before every process runs the new release, and migrations only add. A login
    that may not read the ledger (a worker-only login) is checked for the functions a worker
    calls instead."""
    if not calls.schema_installed(conn):
        raise SchemaMismatch("the jobs schema is not installed: run `pgtick migrate` first")
    try:
        plan = install_plan(root)
    except SchemaFilesMissing:  # nothing to compare with: the calls themselves will tell
        return None
    applied = calls.readable_migrations(conn)
    if applied is None:
        missing_calls = calls.missing_functions(conn)
        if missing_calls:
            raise SchemaMismatch(
                f"the jobs schema is older than pgtick {_package_version()}: it has no"
                f" {_some(missing_calls)}; run `pgtick migrate` (as a login that may install)"
            )
        return None
    missing = [f"{m.version}_{m.name}" for m in plan.migrations if m.version not in applied]
    if missing:
        lacks = (
            f"migration {missing[0]}"
            if len(missing) == 1
            else f"{len(missing)} migrations ({_some(missing)})"
        )
        raise SchemaMismatch(
            f"the jobs schema is older than pgtick {_package_version()}: it lacks {lacks};"
            " run `pgtick migrate`"
        )
    unknown = _unknown(applied, plan)
    if unknown:
        return (
            f"the jobs schema has migrations pgtick {_package_version()} does not know"
            f" ({_some(unknown)}): a newer pgtick migrated it; upgrade this one"
        )
    return None


def _unknown(applied: set[str], plan: InstallPlan) -> list[str]:
    """The recorded migrations this driver's plan does not list (a newer pgtick's)."""
    return sorted(applied - {m.version for m in plan.migrations})


def _refuse_newer(applied: set[str], plan: InstallPlan) -> None:
    """Raise SchemaMismatch when a newer pgtick migrated the schema: its functions stay,
    rather than this driver's older ones put back over them."""
    unknown = _unknown(applied, plan)
    if unknown:
        raise SchemaMismatch(
            f"the jobs schema has migrations pgtick {_package_version()} does not know"
            f" ({_some(unknown)}): a newer pgtick migrated it; nothing was applied:"
            " migrate with that one (or a later one)"
        )


def _some(names: list[str], shown: int = 3) -> str:
    """``a, b, c`` or, for a longer list, ``a, b, … z`` (the first ones and the last)."""
    if len(names) <= shown + 1:
        return ", ".join(names)
    return f"{', '.join(names[:shown])}, … {names[-1]}"


def _say_warning(diag: psycopg.errors.Diagnostic) -> None:
    """A WARNING the install raised (a role it found existing and uses), logged as one line
    with its hint: the install runs with client_min_messages = warning, so nothing less
    arrives."""
    if diag.severity_nonlocalized == "WARNING":
        hint = f" ({diag.message_hint})" if diag.message_hint else ""
        log.warning("%s%s", diag.message_primary, hint)


def apply(
    conn: psycopg.Connection[Any],
    root: Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[str]:
    """Apply pending migrations and re-apply functions; returns the versions applied now.

    ``progress(step, done, total)`` is called after each migration and once for the
    functions (the CLI draws a progress bar with it). A WARNING the install raises (a
    pgtick role that existed already and that pgtick did not create) is logged to
    ``pgtick.migrate``.

    ``conn`` must be in autocommit mode: each migration is its own transaction,
    and the advisory lock is held by the session across all of them. Each transaction waits
    at most LOCK_WAIT for a table lock, and is rolled back and tried again when it would wait
    longer (a warning on ``pgtick.migrate``), so that no worker queues behind it meanwhile.
    """
    conn.add_notice_handler(_say_warning)
    try:
        return _apply(conn, root, progress)
    finally:
        conn.remove_notice_handler(_say_warning)


def _apply(
    conn: psycopg.Connection[Any],
    root: Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[str]:
    if not conn.autocommit:
        raise ValueError("migrate needs an autocommit connection")
    plan = install_plan(root)
    if behind_pooler(conn):
        return _apply_in_one_transaction(conn, plan)
    done: list[str] = []
    conn.execute("SET client_min_messages = warning")
    caller = {name: _setting(conn, name) for name in INSTALL_SETTINGS}
    for name, value in INSTALL_SETTINGS.items():
        conn.execute(f"SET {name} = {value}")  # our names and values, not input
    # Another migrator's turn is waited for as long as it takes, whatever lock_timeout and
    # statement_timeout the database or role sets: the session lock, taken in a transaction
    # whose SET LOCAL ends with it, outlives the transaction.
    with conn.transaction():
        conn.execute("SET LOCAL lock_timeout = 0")
        conn.execute("SET LOCAL statement_timeout = 0")
        calls.advisory_lock(conn, plan.lock_key)
    try:
        conn.execute(plan.bootstrap.read_bytes())
        already = applied_versions(conn)
        _refuse_newer(already, plan)
        longest = _longest_lock_wait(conn)
        pending = [m for m in plan.migrations if m.version not in already]
        total = len(pending) + 1
        # The last pending migration commits with the functions: a migrator stopped between
        # them (Ctrl-C, a lost connection) leaves a ledger that still lacks a migration, so
        # `pgtick run` says to migrate, rather than a complete ledger over missing functions.
        # Each transaction bounds its lock waits and is tried again when it gives up
        # (_retrying_on_locks): a migration held up by another session's lock must not hold
        # up, behind it, every worker that touches the same table.
        for migration in pending[:-1]:

            def apply_one(migration: Migration = migration) -> None:
                _run_file(conn, migration.path)
                calls.record_migration(conn, migration.version, migration.name)

            _retrying_on_locks(conn, f"migration {migration.version}_{migration.name}", apply_one, longest)
            done.append(migration.version)
            if progress is not None:
                progress(f"{migration.version}_{migration.name}", len(done), total)
        last_version = [m.version for m in pending[-1:]]

        def apply_last_and_functions() -> None:
            for migration in pending[-1:]:
                _run_file(conn, migration.path)
                calls.record_migration(conn, migration.version, migration.name)
            for path in plan.function_files:
                _run_file(conn, path)
            if done or last_version:
                calls.record_package_version(conn, _package_version(), done + last_version)

        step = f"migration {pending[-1].version}_{pending[-1].name} with" if pending else "re-applying"
        _retrying_on_locks(conn, f"{step} the functions and views", apply_last_and_functions, longest)
        done += last_version
        if progress is not None:
            if pending:
                last = pending[-1]
                progress(f"{last.version}_{last.name}", len(done), total)
            progress("functions and views", total, total)
    except BaseException:
        # Stopped (Ctrl-C in the middle of a statement, a lost connection, an error): the lock
        # and the settings are given back if the connection still takes a statement, and its
        # close releases them otherwise; a failure to give them back never hides why it stopped.
        with contextlib.suppress(psycopg.Error):
            _give_back_all(conn, plan.lock_key, caller)
        raise
    _give_back_all(conn, plan.lock_key, caller)
    return done


def _give_back_all(conn: psycopg.Connection[Any], lock_key: int, caller: dict[str, str | bytes]) -> None:
    """Release the migration lock and give the caller's settings back."""
    calls.advisory_unlock(conn, lock_key)
    if not conn.closed and not conn.broken:
        for name, theirs in caller.items():
            _give_back(conn, name, theirs)


def _run_file(conn: psycopg.Connection[Any], path: Path) -> None:
    """Run one file of the schema. An error the server raises carries a note naming the file and
    the line of the statement it stopped at (or, in a function body, the server's own context):
    "syntax error at end of input" alone does not say where."""
    text = path.read_text(encoding="utf-8")
    try:
        conn.execute(text.encode())
    except psycopg.Error as exc:
        if exc.sqlstate is not None:
            where = f"{path.parent.name}/{path.name}"
            position = exc.diag.statement_position
            if position is not None and position.isdigit():
                where += f", line {text[: int(position) - 1].count(chr(10)) + 1}"
            context = (exc.diag.context or "").strip().splitlines()
            if context:
                where += f": {context[-1]}"
            exc.add_note(f"in {where}")
        raise


#: Longest wait (seconds) of a migration's statement for a table lock before the migration's
#: transaction gives up, rolls back and is tried again. A migration waiting in a table's lock
#: queue, or holding a table while it waits for another, stops every session that touches that
#: table: the heartbeats of a worker of the previous release (it stamps itself seen in the
#: worker registry before it stamps its runs, and waits for the registry as long as it takes)
#: would stop for as long as an operator's transaction holds the migration up, and the reaper
#: of that release, which goes on meanwhile, would take the worker's runs. Rolled back, the
#: migration lets them through; tried again, it commits once nobody holds what it needs.
LOCK_WAIT = 0.5

#: The longest wait (seconds) of a migration that keeps giving up: each try waits twice as long
#: as the one before, from LOCK_WAIT up to this or to a quarter of the shortest heartbeat timeout
#: of a queued or running run, whichever is shorter (never under LOCK_WAIT). A session whose
#: every statement holds what the migration needs for longer than LOCK_WAIT (slow reads of a
#: view the install re-creates, one after the other) would otherwise hold it up for ever; a
#: heartbeat queued behind the migration's wait still arrives well within its timeout.
LOCK_WAIT_MAX = 5.0

#: How long (seconds, the upper bound of a random pause) a migration that gave up waiting for a
#: lock lets the sessions that queued behind it run before it tries again.
LOCK_RETRY_PAUSE = 0.5

#: How often (seconds) a migration that keeps finding a lock held says so again.
LOCK_RETRY_LOG_EVERY = 10.0


def _retrying_on_locks(
    conn: psycopg.Connection[Any], step: str, work: Callable[[], None], longest: float = LOCK_WAIT
) -> None:
    """``work`` in one transaction whose lock waits are bounded; a transaction that gave up
    waiting, or that the server chose to end a deadlock with (re-creating a view a claim in
    progress reads, say), is rolled back (nothing of it applied) and tried again after a short
    pause, each try waiting twice as long as the one before, from LOCK_WAIT up to ``longest``
    (``_longest_lock_wait``). Logged once and then every LOCK_RETRY_LOG_EVERY seconds while it
    goes on, with the session most likely to hold it up (``_likely_holder``)."""
    since = time.monotonic()
    logged = 0.0
    wait = LOCK_WAIT
    while True:
        try:
            _in_one_transaction(conn, wait, work)
            return
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
            waited = time.monotonic() - since
            if not logged or waited - logged >= LOCK_RETRY_LOG_EVERY:
                logged = max(waited, 1e-9)
                log.warning(
                    "%s waits for a lock another session holds (%s%s); rolled back, trying again"
                    " (waiting %.0fs so far)",
                    step,
                    exc.diag.message_primary,
                    _likely_holder(conn, wait),
                    waited,
                )
            time.sleep(random.uniform(LOCK_RETRY_PAUSE / 2, LOCK_RETRY_PAUSE))
            wait = min(max(longest, LOCK_WAIT), wait * 2)


def _in_one_transaction(conn: psycopg.Connection[Any], wait: float, work: Callable[[], None]) -> None:
    """``work`` in a transaction whose lock waits are bounded by ``wait`` seconds: committed, or
    rolled back when it fails. Interrupted (Ctrl-C) while a statement is still in flight, it is
    not rolled back here (the ROLLBACK would only fail on the busy connection and hide why it
    stopped): closing the connection, as the caller does, rolls it back."""
    conn.execute("BEGIN")
    try:
        calls.local_lock_timeout(conn, wait)
        work()
    except BaseException:
        if conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.ACTIVE:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _longest_lock_wait(conn: psycopg.Connection[Any]) -> float:
    """LOCK_WAIT_MAX, or a quarter of the shortest heartbeat timeout of a run that is running
    or may start (the server's, or a queued or running run's own) when that is shorter."""
    heartbeat_timeout = calls.shortest_heartbeat_timeout(conn)
    if heartbeat_timeout is None:
        return LOCK_WAIT_MAX
    return max(LOCK_WAIT, min(LOCK_WAIT_MAX, heartbeat_timeout / 4))


def _likely_holder(conn: psycopg.Connection[Any], waited: float) -> str:
    """``; the oldest transaction holding a jobs lock: pid 123 (pgtick-leader vm-1, active 52s:
    SELECT …)``: the session of this database whose transaction, open for longer than the
    migration waited, is the oldest to hold a lock on the jobs schema; empty when there is none,
    or when this login may not look (the warning says what it knows without it)."""
    try:
        row = calls.oldest_jobs_lock_holder(conn, waited)
    except psycopg.Error:
        return ""
    if row is None:
        return ""
    pid, application, state, seconds, query = row
    who = f"{application}, " if application else ""
    state = state or "open"  # another role's session, to a login that may not see its state
    doing = f": {query}" if query else ""
    return f"; the oldest transaction holding a jobs lock: pid {pid} ({who}{state} {seconds:.0f}s{doing})"


def _setting(conn: psycopg.Connection[Any], name: str) -> str | bytes:
    row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    assert row is not None
    value: str | bytes = row[0]
    return value


def _give_back(conn: psycopg.Connection[Any], name: str, value: str | bytes) -> None:
    """Set ``name`` back to the caller's ``value`` as ``current_setting`` read it: bytes in a
    SQL_ASCII database, whose text psycopg does not decode (and would send back as bytea)."""
    if isinstance(value, bytes):
        conn.execute("SELECT set_config(%s, convert_from(%s, 'SQL_ASCII'), false)", (name, value))
    else:
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))


def _apply_in_one_transaction(conn: psycopg.Connection[Any], plan: InstallPlan) -> list[str]:
    """``apply`` through a transaction-mode pooler: one transaction under the transaction
    form of the migration lock, since a session lock (and a session SET) would stay on a
    server connection that other clients share."""
    done: list[str] = []

    def apply_all() -> None:
        done.clear()
        conn.execute("SET LOCAL client_min_messages = warning")
        for name, value in INSTALL_SETTINGS.items():
            conn.execute(f"SET LOCAL {name} = {value}")
        # Another migrator's turn is waited for as long as it takes (only the table locks
        # after it are bounded, by _retrying_on_locks), whatever statement_timeout is set;
        # the caller's statement_timeout is given back to the install after it.
        conn.execute("SET LOCAL lock_timeout = 0")
        conn.execute(
            "SELECT set_config('pgtick.statement_timeout', current_setting('statement_timeout'), true)"
        )
        conn.execute("SET LOCAL statement_timeout = 0")
        calls.advisory_xact_lock(conn, plan.lock_key)
        conn.execute(
            "SELECT set_config('statement_timeout', current_setting('pgtick.statement_timeout'), true)"
        )
        calls.local_lock_timeout(conn, LOCK_WAIT)
        conn.execute(plan.bootstrap.read_bytes())
        already = applied_versions(conn)
        _refuse_newer(already, plan)
        for migration in plan.migrations:
            if migration.version in already:
                continue
            _run_file(conn, migration.path)
            calls.record_migration(conn, migration.version, migration.name)
            done.append(migration.version)
        for path in plan.function_files:
            _run_file(conn, path)
        if done:
            calls.record_package_version(conn, _package_version(), done)

    _retrying_on_locks(conn, "the install (one transaction, through a pooler)", apply_all)
    return done
