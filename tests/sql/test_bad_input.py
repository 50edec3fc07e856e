"""Bad input: every public call, the flow-control API (queues, limits, unique jobs,
enqueue_many, snooze, unclaim, dependencies) included, refuses it with a SQLSTATE (class 22, 23 or P0)
and a message naming the field, and never half-applies (the database is byte-for-byte the same
afterwards: runs, definitions, policies, config, leases, limits and paused queues)."""

from __future__ import annotations

import unicodedata
from typing import Any

import psycopg
import pytest

from harness import Conn, add_definition, add_runs, digest, expect_error, scalar
from pgtick.terminal import HIDDEN_CHARACTERS

BIG = 1_100_000  # characters: a payload over the default 1 MiB jobs.config.max_payload_bytes
INVALID = "22023"
NOT_FOUND = "P0002"
INJECTION = "x'); DROP TABLE jobs.runs; --"
SCHEDULE_CONTROL = "schedule must not contain control characters"
MIXED = "must not mix positive and negative parts (months, days, time)"

Case = tuple[str, tuple[Any, ...] | None, str, str]


def bad(sql: str, mention: str, sqlstate: str = INVALID, params: tuple[Any, ...] | None = None) -> Case:
    """A call refused with ``sqlstate`` and a message naming ``mention``; ``params`` may name a
    seeded run by its state ("RUNNING", "QUEUED"...)."""
    return (sql, params, sqlstate, mention)


CASES: list[Case] = [
    # jobs.enqueue
    bad("SELECT jobs.enqueue(NULL)", "kind"),
    bad("SELECT jobs.enqueue('')", "kind"),
    bad("SELECT jobs.enqueue(repeat('k', 201))", "kind"),
    bad("SELECT jobs.enqueue('   ')", "kind must not be blank"),
    bad("SELECT jobs.enqueue(U&'\\00A0\\3000')", "kind must not be blank"),
    bad("SELECT jobs.enqueue_many(' ', '[{}]')", "kind must not be blank"),
    bad("SELECT jobs.enqueue('k', queue => '  ')", "queue must not be blank"),
    bad("SELECT jobs.enqueue(E'k\\n')", "kind must not contain control characters"),
    bad("SELECT jobs.enqueue(E'\\t')", "kind must not contain control characters"),
    bad("SELECT jobs.enqueue('k', queue => E'q\\u001b')", "queue must not contain control characters"),
    bad(
        "SELECT jobs.enqueue(U&'pay\\202Eyal')",
        "kind must not contain invisible or text-direction characters, got U+202E",
    ),
    bad(
        "SELECT jobs.enqueue('k', queue => U&'a\\2028b')",
        "queue must not contain invisible or text-direction",
    ),
    bad("SELECT jobs.define(U&'\\FEFFnightly', 'k', run_at => now())", "name must not contain invisible"),
    # marks that turn text around, format characters and fillers that show nothing: a name
    # holding one reads as another name, or (U+3164 alone) as no name at all
    bad(
        "SELECT jobs.enqueue(U&'report\\200F-2')",
        "kind must not contain invisible or text-direction characters, got U+200F",
    ),
    bad(
        "SELECT jobs.enqueue('k', queue => U&'\\3164')",
        "queue must not contain invisible or text-direction characters, got U+3164",
    ),
    bad("SELECT jobs.define(U&'night\\00ADly', 'k', run_at => now())", "name must not contain invisible"),
    bad("SELECT jobs.set_limit('kind', U&'k\\061C', max_running => 1)", "got U+061C at character 2"),
    bad(
        "SELECT * FROM jobs.claim(1, U&'web\\+01D1731')",
        "worker must not contain invisible or text-direction characters, got U+1D173 at character 4",
    ),
    bad("SELECT jobs.set_limit('queue', U&'q\\2066x', max_running => 1)", "name must not contain invisible"),
    bad("SELECT jobs.define('  ', 'k', run_at => now())", "name must not be blank"),
    bad(
        'SELECT jobs.define_many(\'[{"name": " ", "kind": "k", "run_at": "2030-01-01T00:00:00Z"}]\')',
        "not blank",
    ),
    bad("SELECT jobs.enqueue('k', NULL)", "payload"),
    bad("SELECT jobs.enqueue('k', '[1, 2]')", "payload"),
    bad("SELECT jobs.enqueue('k', '\"text\"')", "payload"),
    bad("SELECT jobs.enqueue('k', '42')", "payload"),
    bad("SELECT jobs.enqueue('k', 'null'::jsonb)", "payload"),
    bad(
        "SELECT jobs.enqueue('k', jsonb_build_object('x', repeat('a', %s)))",
        "max_payload_bytes",
        params=(BIG,),
    ),
    bad(
        "SELECT jobs.enqueue('k', ('{\"a\": ' || repeat('[', 150) || repeat(']', 150) || '}')::jsonb)",
        "payload nests deeper than 100 levels",
    ),
    bad("SELECT jobs.enqueue('k', run_at => 'infinity')", "got infinity"),
    bad("SELECT jobs.enqueue('k', run_at => '-infinity')", "got -infinity"),
    bad("SELECT jobs.enqueue('k', run_at => NULL)", "run_at"),
    bad("SELECT jobs.enqueue('k', priority => 1001)", "priority"),
    bad("SELECT jobs.enqueue('k', priority => -1001)", "priority"),
    bad("SELECT jobs.enqueue('k', priority => NULL)", "priority"),
    bad("SELECT jobs.enqueue('k', idempotency_key => '')", "idempotency_key"),
    bad("SELECT jobs.enqueue('k', idempotency_key => repeat('x', 201))", "idempotency_key"),
    bad("SELECT jobs.enqueue('k', max_attempts => 0)", "max_attempts"),
    bad("SELECT jobs.enqueue('k', max_attempts => -1)", "max_attempts"),
    bad("SELECT jobs.enqueue('k', max_attempts => 1001)", "max_attempts"),
    bad("SELECT jobs.enqueue('k', timeout => '-1 second')", "timeout"),
    bad("SELECT jobs.enqueue('k', timeout => '0')", "timeout"),
    bad("SELECT jobs.enqueue('k', heartbeat_timeout => '-5 minutes')", "heartbeat_timeout"),
    bad("SELECT jobs.enqueue('k', unique_for => '1 hour')", "need a unique_key"),
    bad("SELECT jobs.enqueue('k', on_conflict => 'replace')", "need a unique_key"),
    bad("SELECT jobs.enqueue('k', unique_while => 'ever')", "need a unique_key"),
    bad("SELECT jobs.set_retry_policy('k', allow => '{NULL}')", "allow[1]"),
    bad("SELECT jobs.set_retry_policy('k', deny => ARRAY['E', ''])", "deny[2]"),
    # an element is named by the list's own subscripts, not by its position from 1
    bad("SELECT jobs.set_retry_policy('k', allow => '[5:6]={E,\"\"}')", "allow[6] must be a non-empty text"),
    bad("SELECT jobs.set_retry_policy('k', deny => ARRAY[repeat('E', 201)])", "deny[1]"),
    bad("SELECT jobs.acquire_lease(E'nightly\\n', 'o', '1 minute')", "control characters"),
    bad("SELECT jobs.define('d', 'k', '0 9 * * *', timezone => NULL)", "timezone NULL is not"),
    bad(
        "SELECT jobs.define('d', 'k', '0 9 * * *', timezone => 'Mars/Olympus')",
        "timezone 'Mars/Olympus' is not",
    ),
    bad(
        "SELECT jobs.define('d', 'k', '0 9 * * *', timezone => 'CET')",
        "also the abbreviation of a fixed offset",
    ),
    bad("SELECT jobs.define('d', 'k', '0 9 * * *', timezone => 'WET')", "such as Europe/Paris"),
    bad(
        'SELECT jobs.define_many(\'[{"name": "d", "kind": "k", "schedule": "0 9 * * *",'
        ' "timezone": "EET"}]\')',
        "also the abbreviation of a fixed offset",
    ),
    # a schedule's control characters would reach every terminal that shows it: only the
    # line breaks between the lines of an RRULE text (and tabs) are taken
    bad("SELECT jobs.define('d', 'k', E'FREQ=DAILY;X-A=\\u001b[2J')", SCHEDULE_CONTROL),
    bad("SELECT jobs.define('d', 'k', E'0 9 * * *\\u0007')", SCHEDULE_CONTROL),
    bad("SELECT jobs.define('d', 'k', E'FREQ=DAILY\\u009b2J')", SCHEDULE_CONTROL),
    bad(
        'SELECT jobs.define_many(\'[{"name": "d", "kind": "k", "schedule": "FREQ=DAILY;X-A=\\u001b"}]\')',
        "definitions[0] (d): schedule must not contain control characters",
    ),
    # an interval whose months, days and time differ in sign compares as one length (a month as
    # 30 days) but lasts another from each date it is added to, even less than nothing: a lease
    # of '-11 months 331 days' (a day as compared) expired days before it was taken
    bad(
        "SELECT jobs.acquire_lease('l', 'o', '-11 months 331 days')",
        f"ttl {MIXED}, got -11 mons +331 days: its length would depend on the date; give it in parts"
        " of one sign, such as 1 day",
    ),
    bad("SELECT jobs.renew_lease('l', 'o', '1 day -23 hours')", f"ttl {MIXED}, got 1 day -23:00:00"),
    bad("SELECT jobs.enqueue('k', timeout => '-1 month 31 days')", f"timeout {MIXED}, got -1 mons +31 days"),
    bad("SELECT jobs.enqueue('k', heartbeat_timeout => '1 day -1 second')", f"heartbeat_timeout {MIXED}"),
    bad("SELECT jobs.enqueue('k', unique_key => 'u', unique_for => '1 month -1 day')", f"unique_for {MIXED}"),
    bad("SELECT jobs.enqueue_many('k', '[{}]', timeout => '-1 month 31 days')", f"timeout {MIXED}"),
    bad("SELECT jobs.define('d', 'k', '0 9 * * *', jitter => '1 day -1 hour')", f"jitter {MIXED}"),
    bad("SELECT jobs.define('d', 'k', '0 9 * * *', timeout => '-1 month 31 days')", f"timeout {MIXED}"),
    bad(
        'SELECT jobs.define_many(\'[{"name": "d", "kind": "k", "schedule": "0 9 * * *",'
        ' "jitter": "1 day -1 hour"}]\')',
        f"definitions[0] (d): jitter {MIXED}",
    ),
    bad(
        'SELECT jobs.define_many(\'[{"name": "d", "kind": "k", "schedule": "0 9 * * *",'
        ' "heartbeat_timeout": "-1 month 31 days"}]\')',
        f"definitions[0] (d): heartbeat_timeout {MIXED}",
    ),
    bad("SELECT jobs.snooze(%s, 'w1', '1 day -1 hour')", f"delay {MIXED}", params=("RUNNING",)),
    bad(
        "SELECT jobs.set_limit('kind', 'k', rate_limit => 1, rate_period => '1 day -1 hour')",
        f"rate_period {MIXED}",
    ),
    # kept as elapsed time (a year as 365.25 days): an hour as compared, minus 125 hours as stored
    bad(
        "SELECT jobs.set_limit('kind', 'k', rate_limit => 1, rate_period => '-1 year 360 days 1 hour')",
        f"rate_period {MIXED}",
    ),
    bad("SELECT jobs.set_retry_policy('k', backoff_max => '1 month -1 day')", f"backoff_max {MIXED}"),
    bad("SELECT jobs.prune('-11 months 331 days')", f"older_than {MIXED}"),
    bad("SELECT jobs.materialize_one_shots('1 day -1 hour')", f"lookahead {MIXED}"),
    bad("UPDATE jobs.config SET retention = '-11 months 331 days'", f"jobs.config.retention {MIXED}"),
    # jobs.run_now
    bad("SELECT jobs.run_now(NULL)", "name"),
    bad("SELECT jobs.run_now('no-such-definition')", "no-such-definition", NOT_FOUND),
    bad("SELECT jobs.run_now('defined', '[]')", "payload"),
    # jobs.claim
    bad("SELECT * FROM jobs.claim(0)", "batch_size"),
    bad("SELECT * FROM jobs.claim(-1)", "batch_size"),
    bad("SELECT * FROM jobs.claim(1001)", "batch_size"),
    bad("SELECT * FROM jobs.claim(NULL)", "batch_size"),
    bad("SELECT * FROM jobs.claim(1, '')", "worker"),
    bad("SELECT * FROM jobs.claim(1, repeat('w', 201))", "worker"),
    # the id is written on the runs, which operators read: no escape sequence, no forged line
    bad("SELECT * FROM jobs.claim(1, E'w\\x1b[2Jx')", "worker must not contain control"),
    bad("SELECT * FROM jobs.claim(1, E'web-1\\n  forged')", "worker must not contain control"),
    bad("SELECT * FROM jobs.claim(1, U&'web\\202E1')", "worker must not contain invisible"),
    bad("SELECT * FROM jobs.claim(1, '   ')", "worker must not be blank"),
    bad("SELECT * FROM jobs.claim(1, 'w', '{NULL}')", "kinds"),
    bad("SELECT * FROM jobs.claim(1, 'w', '{}')", "kinds"),
    bad("SELECT * FROM jobs.claim(1, 'w', ARRAY['k', ''])", "non-empty kind names"),
    bad(
        "SELECT * FROM jobs.claim(1, 'w', '{{a}}')",
        "kinds must hold 1 to 1000 non-empty kind names without NULLs in one list",
    ),
    bad("SELECT * FROM jobs.claim(1, 'w', queues => '{{a, b}}')", "queues must hold 1 to 1000"),
    # jobs.heartbeat
    bad("SELECT * FROM jobs.heartbeat(NULL, 'w1')", "run_ids"),
    bad("SELECT * FROM jobs.heartbeat('{1}', NULL)", "worker"),
    bad("SELECT * FROM jobs.heartbeat('{1}', '')", "worker"),
    bad("SELECT * FROM jobs.heartbeat(array(SELECT generate_series(1, 10001)::bigint), 'w1')", "run_ids"),
    # jobs.complete / complete_many
    bad("SELECT jobs.complete(NULL, 'w1')", "run_id"),
    bad("SELECT jobs.complete(0, 'w1')", "run_id"),
    bad("SELECT jobs.complete(-7, 'w1')", "run_id"),
    bad("SELECT jobs.complete(%s, NULL)", "worker", params=("RUNNING",)),
    bad("SELECT jobs.complete(%s, '')", "worker", params=("RUNNING",)),
    bad(
        "SELECT jobs.complete(%s, 'w1', jsonb_build_object('x', repeat('a', %s)))",
        "result",
        params=("RUNNING", BIG),
    ),
    bad(
        "SELECT jobs.complete(%s, 'w1', ('{\"a\": ' || repeat('[', 150) || repeat(']', 150) || '}')::jsonb)",
        "result nests deeper than 100 levels",
        params=("RUNNING",),
    ),
    bad("SELECT * FROM jobs.complete_many(NULL, 'w1')", "run_ids"),
    bad("SELECT * FROM jobs.complete_many(%s, NULL)", "worker", params=("RUNNING[]",)),
    # jobs.fail
    bad("SELECT jobs.fail(NULL, 'w1')", "run_id"),
    bad("SELECT jobs.fail(-1, 'w1')", "run_id"),
    bad("SELECT jobs.fail(%s, NULL)", "worker", params=("RUNNING",)),
    bad("SELECT jobs.fail(%s, 'w1', '{}', 'm', 'Bogus')", "reason", params=("RUNNING",)),
    bad("SELECT jobs.fail(%s, 'w1', '{}', 'm', NULL)", "reason", params=("RUNNING",)),
    bad("SELECT jobs.fail(%s, 'w1', '{}', 'm', 'HeartbeatLost')", "reason", params=("RUNNING",)),
    bad("SELECT jobs.fail(%s, 'w1', ARRAY['E', NULL])", "error_classes", params=("RUNNING",)),
    bad("SELECT jobs.fail(%s, 'w1', ARRAY[''])", "error_classes", params=("RUNNING",)),
    bad("SELECT jobs.fail(%s, 'w1', '{{E}}')", "error_classes must hold", params=("RUNNING",)),
    bad(
        "SELECT jobs.fail(%s, 'w1', array(SELECT 'E' || g FROM generate_series(1, 101) g))",
        "error_classes",
        params=("RUNNING",),
    ),
    # jobs.acknowledge_cancel
    bad("SELECT jobs.acknowledge_cancel(NULL, 'w1')", "run_id"),
    bad("SELECT jobs.acknowledge_cancel(%s, NULL)", "worker", params=("RUNNING",)),
    # jobs.cancel / cancel_queued
    bad("SELECT jobs.cancel(NULL)", "run_id"),
    bad("SELECT jobs.cancel(987654321)", "987654321", NOT_FOUND),
    bad("SELECT jobs.cancel(-1)", "-1", NOT_FOUND),
    bad("SELECT jobs.cancel_queued('no-such-definition')", "no-such-definition", NOT_FOUND),
    # jobs.retry
    bad("SELECT jobs.retry(NULL)", "run_id"),
    bad("SELECT jobs.retry(987654321)", "987654321", NOT_FOUND),
    bad("SELECT jobs.retry(%s)", "QUEUED", params=("QUEUED",)),
    bad("SELECT jobs.retry(%s)", "RUNNING", params=("RUNNING",)),
    # jobs.set_retry_policy
    bad("SELECT jobs.set_retry_policy(NULL)", "kind"),
    bad("SELECT jobs.set_retry_policy('k', max_attempts => 0)", "max_attempts"),
    bad("SELECT jobs.set_retry_policy('k', max_attempts => NULL)", "max_attempts"),
    bad("SELECT jobs.set_retry_policy('k', backoff_initial => '-1 second')", "backoff_initial"),
    bad("SELECT jobs.set_retry_policy('k', backoff_max => NULL)", "backoff_max"),
    bad("SELECT jobs.set_retry_policy('k', backoff_factor => 0.5)", "backoff_factor"),
    bad("SELECT jobs.set_retry_policy('k', backoff_factor => 'NaN')", "backoff_factor"),
    bad("SELECT jobs.set_retry_policy('k', backoff_factor => 'Infinity')", "backoff_factor"),
    bad("SELECT jobs.set_retry_policy('k', jitter => 1.5)", "jitter"),
    bad("SELECT jobs.set_retry_policy('k', jitter => -0.1)", "jitter"),
    bad("SELECT jobs.set_retry_policy('k', jitter => 'NaN')", "jitter"),
    # validation comes before the lookup: these name runs that do not exist
    bad("SELECT jobs.fail(1, 'w', '{}', 'm', 'Oops')", "reason"),
    bad("SELECT jobs.fail(1, 'w', ARRAY[NULL]::text[], 'm')", "error_classes"),
    # more limits
    bad("SELECT jobs.enqueue('k', jsonb_build_object('a', repeat('x', 2000000)))", "payload"),
    bad("SELECT jobs.enqueue('k', priority => 100000)", "priority"),
    # jobs.define / pause (an injection attempt is only a name that is not there)
    bad("SELECT jobs.define(NULL, 'k', '* * * * *')", "name"),
    bad("SELECT jobs.define('d', 'k', '* * * * *', %s)", "timezone", params=(INJECTION,)),
    bad("SELECT jobs.define('d', 'k', run_at => 'infinity')", "run_at"),
    bad("SELECT jobs.pause(%s)", "DROP TABLE", NOT_FOUND, params=(INJECTION,)),
    # a definition's name: NULL or empty is no name, not a name that is missing
    bad("SELECT jobs.pause(NULL)", "name must be a non-empty text"),
    bad("SELECT jobs.resume('')", "name must be a non-empty text"),
    bad("SELECT jobs.undefine(NULL)", "name must be a non-empty text"),
    bad("SELECT jobs.cancel_queued('')", "name must be a non-empty text"),
    bad("SELECT jobs.backfill(NULL, now() - interval '1 day', now())", "name must be a non-empty text"),
    # jobs.acquire_lease
    bad("SELECT jobs.acquire_lease('l', 'o', '0')", "ttl"),
    bad("SELECT jobs.acquire_lease('l', 'o', '-1 minute')", "ttl"),
    bad("SELECT jobs.acquire_lease('l', NULL, '1 minute')", "owner"),
    # jobs.renew_lease: the same ttl rule, naming the value
    bad(
        "SELECT jobs.renew_lease('l', 'o', '2 years')",
        "ttl must be a positive interval of at most a year, got 2 years",
    ),
    # jobs.renew_lease / jobs.release_lease: the name and owner as jobs.acquire_lease takes them
    bad("SELECT jobs.renew_lease(NULL, 'o', '1 minute')", "name"),
    bad("SELECT jobs.renew_lease('l', '', '1 minute')", "owner"),
    bad("SELECT jobs.release_lease(NULL, 'o')", "name"),
    bad("SELECT jobs.release_lease('l', NULL)", "owner"),
    # time zones that name no place: the host's own, the placeholder, the posix/ and right/ copies
    # (a server built with its own time zone files may not know them at all)
    bad("SELECT jobs.define('d', 'k', '0 9 * * *', timezone => 'localtime')", "timezone 'localtime'"),
    bad("SELECT jobs.define('d', 'k', '0 9 * * *', timezone => 'Factory')", "timezone 'Factory'"),
    bad(
        "SELECT jobs.define('d', 'k', '0 9 * * *', timezone => 'posix/Europe/Sofia')",
        "timezone 'posix/Europe/Sofia'",
    ),
    bad(
        'SELECT jobs.define_many(\'[{"name": "d", "kind": "k", "schedule": "0 9 * * *",'
        ' "timezone": "posixrules"}]\')',
        "definitions[0] (d): timezone 'posixrules'",
    ),
    # jitter delays the occurrences of a schedule; a one-shot runs at its run_at
    bad(
        "SELECT jobs.define('d', 'k', run_at => now() + interval '1 day', jitter => '1 minute')",
        "jitter applies to a recurring schedule",
    ),
    bad(
        'SELECT jobs.define_many(\'[{"name": "d", "kind": "k", "run_at": "2030-01-01T00:00:00Z",'
        ' "jitter": 60}]\')',
        "definitions[0] (d): jitter applies to a recurring schedule",
    ),
    # jobs.prune
    bad("SELECT jobs.prune('-1 day')", "older_than"),
    bad("SELECT jobs.prune('1 day', 0)", "batch_size"),
    # jobs.materialize / materialize_one_shots
    bad("SELECT jobs.materialize(NULL, NULL, '{}', NULL)", "definition_id"),
    bad("SELECT jobs.materialize_one_shots('-1 s')", "lookahead"),
    # --- flow control: queues, limits, unique jobs, enqueue_many, snooze, dependencies ---
    # jobs.enqueue: queue, concurrency_key, unique_*, on_conflict, depends_on
    bad("SELECT jobs.enqueue('k', queue => NULL)", "queue"),
    bad("SELECT jobs.enqueue('k', queue => '')", "queue"),
    bad("SELECT jobs.enqueue('k', queue => repeat('q', 201))", "queue"),
    bad("SELECT jobs.enqueue('k', concurrency_key => '')", "concurrency_key"),
    bad("SELECT jobs.enqueue('k', concurrency_key => repeat('c', 201))", "concurrency_key"),
    bad("SELECT jobs.enqueue('k', unique_key => '')", "unique_key"),
    bad("SELECT jobs.enqueue('k', unique_key => repeat('u', 201))", "unique_key"),
    bad("SELECT jobs.enqueue('k', unique_key => 'u', unique_while => 'forever')", "unique_while"),
    bad("SELECT jobs.enqueue('k', unique_key => 'u', unique_while => NULL)", "unique_while"),
    bad("SELECT jobs.enqueue('k', unique_key => 'u', unique_for => '-1 hour')", "unique_for"),
    bad("SELECT jobs.enqueue('k', unique_key => 'u', unique_for => '0')", "unique_for"),
    bad("SELECT jobs.enqueue('k', unique_key => 'u', on_conflict => 'merge')", "on_conflict"),
    bad("SELECT jobs.enqueue('k', unique_key => 'u', on_conflict => NULL)", "on_conflict"),
    bad("SELECT jobs.enqueue('k', unique_key => 'u', idempotency_key => 'i')", "unique_key"),
    bad("SELECT jobs.enqueue('k', depends_on => '{}')", "depends_on"),
    bad("SELECT jobs.enqueue('k', depends_on => ARRAY[NULL]::bigint[])", "depends_on"),
    bad("SELECT jobs.enqueue('k', depends_on => %s::bigint[])", "depends_on", params=("RUNNING[][]",)),
    bad(
        "SELECT jobs.enqueue('k', depends_on => ('[5:5]={' || %s || '}')::bigint[])",
        "depends_on",
        params=("RUNNING",),
    ),
    bad(
        "SELECT jobs.enqueue_many('k', '[{}]', depends_on => %s::bigint[])",
        "depends_on",
        params=("RUNNING[][]",),
    ),
    bad("SELECT jobs.enqueue('k', depends_on => ARRAY[987654321]::bigint[])", "depends_on", NOT_FOUND),
    bad("SELECT jobs.enqueue('k', depends_on => %s)", "987654321", NOT_FOUND, params=("QUEUED+missing",)),
    # jobs.enqueue_many
    bad("SELECT jobs.enqueue_many(NULL, '[{}]')", "kind"),
    bad("SELECT jobs.enqueue_many('k', NULL)", "payloads"),
    bad("SELECT jobs.enqueue_many('k', '{}')", "payloads"),
    bad("SELECT jobs.enqueue_many('k', '[]')", "payloads"),
    bad("SELECT jobs.enqueue_many('k', '[{}, 1]')", "payloads[1]"),
    bad("SELECT jobs.enqueue_many('k', '[{}]', run_at => 'infinity')", "run_at"),
    bad("SELECT jobs.enqueue_many('k', '[{}]', priority => 5000)", "priority"),
    bad("SELECT jobs.enqueue_many('k', '[{}]', queue => '')", "queue"),
    bad("SELECT jobs.enqueue_many('k', '[{}]', concurrency_key => '')", "concurrency_key"),
    bad("SELECT jobs.enqueue_many('k', '[{}]', max_attempts => 0)", "max_attempts"),
    bad("SELECT jobs.enqueue_many('k', '[{}]', timeout => '0')", "timeout"),
    bad(
        "SELECT jobs.enqueue_many('k', '[{}]', depends_on => ARRAY[987654321]::bigint[])",
        "depends_on",
        NOT_FOUND,
    ),
    # jobs.claim(queues => ...)
    bad("SELECT * FROM jobs.claim(1, 'w', queues => '{}')", "queues"),
    bad("SELECT * FROM jobs.claim(1, 'w', queues => ARRAY[NULL]::text[])", "queues"),
    bad("SELECT * FROM jobs.claim(1, 'w', queues => ARRAY[''])", "queues"),
    # jobs.pause_queue / jobs.resume_queue
    bad("SELECT jobs.pause_queue(NULL)", "name"),
    bad("SELECT jobs.pause_queue('')", "name"),
    bad("SELECT jobs.resume_queue(repeat('q', 201))", "name"),
    # jobs.set_limit / jobs.remove_limit
    bad("SELECT jobs.set_limit('tenant', 'x', max_running => 1)", "scope"),
    bad("SELECT jobs.set_limit(NULL, 'x', max_running => 1)", "scope"),
    bad("SELECT jobs.set_limit('queue', '', max_running => 1)", "name"),
    bad("SELECT jobs.set_limit('queue', NULL, max_running => 1)", "name"),
    bad("SELECT jobs.set_limit('queue', 'x', max_running => 0)", "max_running"),
    bad("SELECT jobs.set_limit('queue', 'x', max_running => -3)", "max_running"),
    bad("SELECT jobs.set_limit('queue', 'x')", "max_running"),
    bad("SELECT jobs.set_limit('queue', 'x', rate_limit => 0, rate_period => '1 s')", "rate_limit"),
    bad("SELECT jobs.set_limit('queue', 'x', rate_limit => 5)", "rate_period"),
    bad("SELECT jobs.set_limit('queue', 'x', rate_period => '1 s')", "rate_limit"),
    bad("SELECT jobs.set_limit('queue', 'x', rate_limit => 5, rate_period => '0')", "rate_period"),
    bad("SELECT jobs.set_limit('queue', 'x', rate_limit => 5, rate_period => '2 days')", "rate_period"),
    bad("SELECT jobs.set_limit('queue', 'x', max_running => 1, per_key => NULL)", "per_key"),
    bad("SELECT jobs.remove_limit('tenant', 'x')", "scope"),
    bad("SELECT jobs.remove_limit('kind', '')", "name"),
    # jobs.snooze
    bad("SELECT jobs.snooze(NULL, 'w1', '1 minute')", "run_id"),
    bad("SELECT jobs.snooze(%s, NULL, '1 minute')", "worker", params=("RUNNING",)),
    bad("SELECT jobs.snooze(%s, 'w1', NULL)", "delay", params=("RUNNING",)),
    bad("SELECT jobs.snooze(%s, 'w1', '-1 minute')", "delay", params=("RUNNING",)),
    bad("SELECT jobs.snooze(%s, 'w1', '400 days')", "delay", params=("RUNNING",)),
    # jobs.unclaim
    bad("SELECT * FROM jobs.unclaim(NULL, 'w1')", "run_ids"),
    bad("SELECT * FROM jobs.unclaim(array(SELECT generate_series(1, 10001)::bigint), 'w1')", "run_ids"),
    bad("SELECT * FROM jobs.unclaim(%s, NULL)", "worker", params=("RUNNING[]",)),
    bad("SELECT * FROM jobs.unclaim(%s, '')", "worker", params=("RUNNING[]",)),
    bad("SELECT * FROM jobs.unclaim(%s, 'w1', claim_token => 'short')", "claim_token", params=("RUNNING[]",)),
    # jobs.hand_back_unheld: a NULL among the held ids would match no run, and hand back none
    bad("SELECT * FROM jobs.hand_back_unheld(ARRAY[NULL]::bigint[], 'w1')", "held must not contain NULL"),
    bad("SELECT * FROM jobs.hand_back_unheld(ARRAY[1, NULL], 'w1')", "held must not contain NULL"),
    # jobs.next_due: kinds and queues as jobs.claim takes them
    bad("SELECT * FROM jobs.next_due(ARRAY[NULL]::text[])", "kinds[1]"),
    bad("SELECT * FROM jobs.next_due(queues => '{}')", "queues"),
    bad("SELECT * FROM jobs.next_due(ARRAY['k', ''])", "kinds[2]"),
    bad("SELECT * FROM jobs.next_due(queues => ARRAY[''])", "queues[1]"),
    bad("SELECT * FROM jobs.next_due('{{a}}')", "kinds must be a list of names"),
    bad("SELECT * FROM jobs.next_due(queues => '{{a, b}}')", "queues must be a list of names"),
    # jobs.register_worker: no more kinds than jobs.claim takes
    bad(
        "SELECT jobs.register_worker('w', array(SELECT 'k' || g FROM generate_series(1, 1001) AS g))",
        "kinds must be an array of at most 1000 names",
    ),
    # ... and each kind a name jobs.enqueue would take: jobs.workers shows them
    bad("SELECT jobs.register_worker('w', ARRAY['ok', NULL])", "kinds[2]"),
    bad("SELECT jobs.register_worker('w', ARRAY['  '])", "kinds[1] must not be blank"),
    bad("SELECT jobs.register_worker('w', ARRAY[E'mail\\nreport'])", "kinds[1] must not contain control"),
    bad("SELECT jobs.register_worker('w', ARRAY[U&'mail\\202Etroper'])", "kinds[1] must not contain invis"),
    # jobs.audit: an entry of the log, not a document
    bad(
        "SELECT jobs.audit('me', 'act', NULL, jsonb_build_object('x', repeat('a', %s)))",
        "detail",
        params=(BIG,),
    ),
    # jobs.define: queue, concurrency_key
    bad("SELECT jobs.define('d', 'k', run_at => now(), queue => '')", "queue"),
    bad("SELECT jobs.define('d', 'k', run_at => now(), concurrency_key => '')", "concurrency_key"),
    # a key of only spaces is no key, as an empty one: every enqueue with it would be one job
    bad("SELECT jobs.enqueue('k', idempotency_key => '  ')", "idempotency_key must not be blank"),
    bad("SELECT jobs.enqueue('k', unique_key => U&'\\00A0\\3000')", "unique_key must not be blank"),
    bad("SELECT jobs.enqueue('k', concurrency_key => ' ')", "concurrency_key must not be blank"),
    bad("SELECT jobs.enqueue_many('k', '[{}]', concurrency_key => '   ')", "concurrency_key must not be"),
    bad(
        "SELECT jobs.define('d', 'k', run_at => now(), concurrency_key => ' ')",
        "concurrency_key must not be blank",
    ),
    bad(
        'SELECT jobs.define_many(\'[{"name": "d", "kind": "k", "run_at": "2030-01-01T00:00:00Z",'
        ' "concurrency_key": " "}]\')',
        "definitions[0] (d): concurrency_key must not be blank",
    ),
]


def _label(sql: str, params: tuple[Any, ...] | None) -> str:
    call = sql.removeprefix("SELECT ").removeprefix("* FROM ").removeprefix("jobs.")
    if params:
        call += " % " + ",".join(str(p)[:12] for p in params)
    return call[:90]


def _seed(conn: Conn) -> dict[str, Any]:
    """One run in each interesting state, a definition, a policy, a limit, a paused queue."""
    add_definition(conn, "defined", cap=2)
    conn.execute("SELECT jobs.set_retry_policy('k', max_attempts => 3)")
    conn.execute("SELECT jobs.set_limit('queue', 'x', max_running => 7)")
    conn.execute("SELECT jobs.pause_queue('held')")
    queued, running = add_runs(conn, 2)
    conn.execute("UPDATE jobs.runs SET scheduled_for = now() + interval '1 day' WHERE id = %s", (queued,))
    assert conn.execute("SELECT id FROM jobs.claim(1, 'w1')").fetchall() == [(running,)]
    return {
        "QUEUED": queued,
        "RUNNING": running,
        "RUNNING[]": [running],
        "RUNNING[][]": [[running], [running]],
        "QUEUED+missing": [queued, 987654321],
    }


@pytest.mark.parametrize(
    ("sql", "params", "sqlstate", "mention"), CASES, ids=[_label(c[0], c[1]) for c in CASES]
)
def test_bad_input_is_refused_by_name_and_changes_nothing(
    conn: Conn, sql: str, params: tuple[Any, ...] | None, sqlstate: str, mention: str
) -> None:
    assert sqlstate[:2] in ("22", "23", "P0"), sqlstate
    ids = _seed(conn)
    bound = None if params is None else tuple(ids.get(p, p) if isinstance(p, str) else p for p in params)
    before = digest(conn)
    expect_error(conn, sql, bound, sqlstate, mention)
    assert digest(conn) == before, f"{sql}: changed the database"


def test_claim_of_too_many_kinds_says_so_in_a_short_message(conn: Conn) -> None:
    """1,001 kinds are refused naming kinds, not by repeating the array: a worker's log line,
    not kilobytes of names."""
    many = [f"kind-{i}" for i in range(1001)]
    err = expect_error(conn, "SELECT * FROM jobs.claim(1, 'w', %s)", (many,), "22023", "kinds")
    assert len(err.diag.message_primary or "") < 400, err.diag.message_primary


def test_payload_limit_follows_config(conn: Conn) -> None:
    """max_payload_bytes is read at call time: lower it and a modest payload is refused."""
    conn.execute("UPDATE jobs.config SET max_payload_bytes = 100")
    before = digest(conn)
    expect_error(
        conn, "SELECT jobs.enqueue('k', jsonb_build_object('x', repeat('a', 200)))", None, INVALID, "payload"
    )
    assert digest(conn) == before
    assert scalar(conn, "SELECT id FROM jobs.enqueue('k', '{\"x\": 1}')") is not None


def test_wrong_worker_and_unknown_ids_are_no_ops(conn: Conn) -> None:
    """Not errors: fencing answers. complete/fail/acknowledge with the wrong worker or an unknown
    id say no (false / NULL / empty) and change nothing."""
    ids = _seed(conn)
    running = ids["RUNNING"]
    before = digest(conn)
    assert scalar(conn, "SELECT jobs.complete(%s, 'w2')", (running,)) is False
    assert scalar(conn, "SELECT jobs.complete(987654321, 'w1')") is False
    assert scalar(conn, "SELECT jobs.complete(%s, 'w1')", (ids["QUEUED"],)) is False
    assert scalar(conn, "SELECT (jobs.fail(%s, 'w2')).id IS NULL", (running,)) is True
    assert scalar(conn, "SELECT (jobs.fail(987654321, 'w1')).id IS NULL") is True
    assert conn.execute("SELECT * FROM jobs.heartbeat(%s, 'w2')", ([running],)).fetchall() == []
    assert conn.execute("SELECT * FROM jobs.heartbeat('{987654321}', 'w1')").fetchall() == []
    assert conn.execute("SELECT * FROM jobs.heartbeat('{}', 'w1')").fetchall() == []
    assert conn.execute("SELECT * FROM jobs.complete_many(%s, 'w2')", ([running],)).fetchall() == []
    assert scalar(conn, "SELECT jobs.acknowledge_cancel(%s, 'w2')", (running,)) is False
    assert digest(conn) == before


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_claim_refuses_snapshot_isolation(conn: Conn, isolation: str) -> None:
    """claim needs a fresh snapshot per step: under REPEATABLE READ / SERIALIZABLE it raises
    25000 instead of silently counting RUNNING rows from a stale snapshot."""
    add_runs(conn, 3)
    before = digest(conn)
    with pytest.raises(psycopg.Error) as info, conn.transaction():
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        conn.execute("SELECT * FROM jobs.claim(1, 'w1')")
    assert info.value.sqlstate == "25000", info.value
    assert "READ COMMITTED" in str(info.value)
    assert digest(conn) == before


def test_injection_attempts_are_stored_as_data(conn: psycopg.Connection[Any]) -> None:
    payload = '{"k\\"ey\'); DROP TABLE jobs.runs; --": "v"}'
    run = conn.execute("SELECT id, kind FROM jobs.enqueue(%s, %s::jsonb)", (INJECTION, payload)).fetchone()
    assert run is not None and run[1] == INJECTION
    conn.execute("SELECT jobs.define(%s, %s, '* * * * *')", (INJECTION, INJECTION))
    conn.execute("SELECT jobs.pause(%s)", (INJECTION,))
    assert conn.execute(
        "SELECT jobs.acquire_lease(%s, %s, '1 minute')", (INJECTION, INJECTION)
    ).fetchone() == (True,)
    row = conn.execute("SELECT payload FROM jobs.runs WHERE id = %s", (run[0],)).fetchone()
    assert row is not None and list(row[0]) == ["k\"ey'); DROP TABLE jobs.runs; --"]
    assert conn.execute("SELECT count(*) FROM jobs.definitions WHERE name = %s", (INJECTION,)).fetchone() == (
        1,
    )
    assert conn.execute("SELECT to_regclass('jobs.runs') IS NOT NULL").fetchone() == (True,)


def test_extreme_but_valid_timestamps(conn: psycopg.Connection[Any]) -> None:
    far = conn.execute("SELECT scheduled_for FROM jobs.enqueue('k', run_at => '9999-12-30 23:59:59+00')")
    assert far.fetchone() is not None
    conn.execute("SELECT jobs.define('far', 'k', run_at => '9999-12-30 00:00+00')")
    assert conn.execute("SELECT jobs.materialize_one_shots()").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM jobs.claim(10)").fetchone() == (0,)
    past = conn.execute("SELECT id FROM jobs.enqueue('k', run_at => '0001-01-02 00:00+00')").fetchone()
    claimed = conn.execute("SELECT id FROM jobs.claim(10, 'w')").fetchall()
    assert past is not None and [r[0] for r in claimed] == [past[0]]


def test_names_in_any_script_are_taken(conn: Conn) -> None:
    """Only characters that hide or turn text around are refused in names: accents, other
    scripts, the zero-width non-joiner Persian writes with, emoji joined by U+200D, variation
    selectors and the tags of a region's flag are names."""
    names = [
        "été",
        "отчёт",
        "\u06af\u0632\u0627\u0631\u0634\u200c\u0647\u0627",
        "日報",
        "👩\u200d💻-build",
        "❤\ufe0f-digest",  # a variation selector
        # a region's flag, spelled with tags
        "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f-sales",
    ]
    for name in names:
        conn.execute("SELECT jobs.enqueue(%s, queue => %s)", (name, name))
        conn.execute("SELECT jobs.define(%s, %s, run_at => now() + interval '1 day')", (name, name))
    assert sorted(r[0] for r in conn.execute("SELECT kind FROM jobs.runs").fetchall()) == sorted(names)
    assert scalar(conn, "SELECT count(*) FROM jobs.definitions") == len(names)


def test_the_driver_refuses_in_names_the_characters_the_sql_api_refuses(conn: Conn) -> None:
    """pgtick.terminal.HIDDEN_CHARACTERS (job kinds, the dashboard's forms) is the set
    jobs._hidden_character finds, over every code point: a name one side takes, the other takes."""
    refused = {
        chr(cp)
        for (cp,) in conn.execute(
            "SELECT cp FROM generate_series(1, 1114111) AS cp"
            " WHERE cp NOT BETWEEN 55296 AND 57343 AND jobs._hidden_character(chr(cp)) IS NOT NULL"
        ).fetchall()
    }
    assert refused == HIDDEN_CHARACTERS, (
        f"only SQL: {sorted(f'U+{ord(c):04X}' for c in refused - HIDDEN_CHARACTERS)}, "
        f"only the driver: {sorted(f'U+{ord(c):04X}' for c in HIDDEN_CHARACTERS - refused)}"
    )


ECHOED = [
    ("SELECT jobs.enqueue('k', unique_key => 'u', unique_while => %(v)s)", "unique_while must be"),
    ("SELECT jobs.enqueue('k', unique_key => 'u', on_conflict => %(v)s)", "on_conflict must be"),
    ("SELECT jobs.define('d', 'k', '0 9 * * *', misfire_policy => %(v)s)", "misfire_policy must be"),
    ("SELECT jobs.define('d', 'k', '0 9 * * *', overlap_policy => %(v)s)", "overlap_policy must be"),
    ("SELECT jobs.define('d', 'k', '0 9 * * *', dst_gap => %(v)s)", "dst_gap must be"),
    ("SELECT jobs.define('d', 'k', '0 9 * * *', dst_repeat => %(v)s)", "dst_repeat must be"),
    ("SELECT jobs.define('d', 'k', '0 9 * * *', timezone => %(v)s)", "timezone '"),
    ("SELECT jobs.define('d', 'k', 'x' || %(v)s)", "schedule "),
    ("SELECT jobs.fail(%(RUNNING)s, 'w1', reason => %(v)s)", "reason must be"),
    ("SELECT jobs.set_limit(%(v)s, 'x', max_running => 1)", "scope must be"),
    ("SELECT jobs.remove_limit(%(v)s, 'x')", "scope must be"),
    ("SELECT * FROM jobs.claim(1, 'w', kinds => ARRAY[%(v)s, NULL])", "kinds must hold"),
    (
        "SELECT jobs.define_many(jsonb_build_array(jsonb_build_object("
        "'name', 'd', 'kind', 'k', 'run_at', 'x' || %(v)s::text)))",
        "run_at must be a timestamp, got 'x",
    ),
    (
        "SELECT jobs.define_many(jsonb_build_array(jsonb_build_object("
        "'name', 'd', 'kind', 'k', 'schedule', '0 9 * * *', 'timeout', %(v)s::text)))",
        "timeout must be a number of seconds or an interval",
    ),
    (
        "SELECT jobs.define_many(jsonb_build_array(jsonb_build_object("
        "'name', 'd', 'kind', 'k', 'schedule', '0 9 * * *', 'jitter', %(v)s::text)))",
        "jitter must be a number of seconds or an interval",
    ),
]


@pytest.mark.parametrize(("sql", "mention"), ECHOED, ids=[_label(c[0], None) for c in ECHOED])
@pytest.mark.parametrize(
    "value",
    ["x" * 10_000_000, "later\n2026-12-07 ERROR:  forged", "pay\u202eyal"],
    ids=["10MB", "newline", "U+202E"],
)
def test_a_refused_value_is_shown_in_one_short_line_as_sent(
    conn: Conn, sql: str, mention: str, value: str
) -> None:
    """A message that shows the value it refuses shows at most 100 characters of it (then how
    many there were), with line breaks and invisible or text-direction characters escaped: a
    10 MB value makes no 10 MB message (in the server log, on a terminal), a line break
    forges no log line, a U+202E turns no text around."""
    ids = _seed(conn)
    before = digest(conn)
    err = expect_error(conn, sql, {"v": value, "RUNNING": ids["RUNNING"]}, INVALID, mention)
    message = err.diag.message_primary or ""
    assert len(message) < 400, f"{sql}: a message of {len(message)} characters"
    hidden = [c for c in message if unicodedata.category(c) in ("Cc", "Cf") or c in HIDDEN_CHARACTERS]
    assert not hidden, f"{sql}: the message holds {hidden!r}: {message!r}"
    assert digest(conn) == before, f"{sql}: changed the database"
