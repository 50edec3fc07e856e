-- pgtick install: the one record of what is loaded and in which order.
-- Usage: psql -v ON_ERROR_STOP=1 -d DBNAME -f sql/install.sql
-- `pgtick migrate` reads this file and applies the same files in the same order;
-- `pgtick migrate --sql` prints it with every include inlined, as one script.
-- Safe to re-run: recorded migrations are skipped; functions and views are replaced.
--
-- Adding a migration: one `\set migration NNNN_name \ir ../migrations/apply.sql` line,
-- after the last one. Adding an area: one `\ir <area>.sql` line before roles.sql.
\set ON_ERROR_STOP on
SET client_min_messages = warning;
-- Only the system catalog on the search path while installing: a function another role put in
-- a schema of the caller's search path (public, say) cannot stand in for a built-in that a
-- migration calls unqualified and run with the installer's rights. String literals read as the
-- files write them, whatever the database's default (off reads '\m' as 'm' and refuses U&''),
-- and identifiers read back from the catalog unquoted. All three given back at the end.
SELECT current_setting('search_path') AS pgtick_search_path \gset
SELECT current_setting('standard_conforming_strings') AS pgtick_standard_conforming_strings \gset
SELECT current_setting('quote_all_identifiers') AS pgtick_quote_all_identifiers \gset
SET search_path = pg_catalog, pg_temp;
SET standard_conforming_strings = on;
SET quote_all_identifiers = off;

-- One transaction, from the migration lock to the functions and views: an install stopped
-- anywhere (an error, Ctrl-C, a lost connection) leaves the database as it was before it (no
-- jobs schema, no pgtick role or migration of it on a fresh database; the previous release's
-- schema, ledger and functions on an upgrade), and running it again applies it whole. Nothing
-- in the files needs a transaction of its own (no COMMIT, no CREATE INDEX CONCURRENTLY, no
-- enum value used after it is added). `psql -1` is not needed (given, psql only warns that a
-- transaction is already in progress, and at the end that none is).
-- Migrators run one at a time: advisory lock 'pgtickMG' (key table: sql/helpers.sql), held by
-- this transaction; `pgtick migrate` takes the same key for its session, so the two wait for
-- each other. Another migrator's turn is waited for as long as it takes, whatever lock_timeout
-- and statement_timeout the database sets; the install's statements keep them after it.
\set pgtick_migration_lock 8099570450837491015
SELECT current_setting('lock_timeout') AS pgtick_lock_timeout \gset
SELECT current_setting('statement_timeout') AS pgtick_statement_timeout \gset
BEGIN;
SET LOCAL lock_timeout = 0;
SET LOCAL statement_timeout = 0;
SELECT pg_advisory_xact_lock(:pgtick_migration_lock) AS pgtick_locked \gset
SELECT set_config('lock_timeout', :'pgtick_lock_timeout', true) AS pgtick_lock_timeout \gset
SELECT set_config('statement_timeout', :'pgtick_statement_timeout', true) AS pgtick_statement_timeout \gset

-- The jobs schema and the migration ledger.
\ir ../migrations/bootstrap.sql

-- Migrations, forward-only, in order; each applied once and recorded (apply.sql).
-- 0001: config, definitions, runs, retry policies, leases, leadership; types, indexes, roles.
\set migration 0001_initial \ir ../migrations/apply.sql
-- 0003: DST policy per definition; overlap, jitter, pause_after_failures, backfills.
\set migration 0003_time \ir ../migrations/apply.sql
-- 0004: named queues (pausable), limits per queue and kind, unique runs, dependencies.
\set migration 0004_flow_control \ir ../migrations/apply.sql
-- 0005: the audit log of operator actions.
\set migration 0005_dashboard \ir ../migrations/apply.sql
-- 0006: the worker registry, known kinds and the record of catch-ups.
\set migration 0006_operations \ir ../migrations/apply.sql
-- 0007: materialization health: a definition whose runs are refused is backed off.
\set migration 0007_on_time \ir ../migrations/apply.sql
-- 0008: the package version per migration and the trace context of runs.
\set migration 0008_integrations \ir ../migrations/apply.sql
-- 0009: cursor_from: a schedule change takes effect at the instant it is made.
\set migration 0009_schedule_changes \ir ../migrations/apply.sql
-- 0010: CHECK constraints: every stored duration and number within bounds.
\set migration 0010_bounds \ir ../migrations/apply.sql
-- 0011: claim tokens: a run fenced by the sha256 of its worker's secret.
\set migration 0011_claim_tokens \ir ../migrations/apply.sql
-- 0012: the blocked-runs index rebuilt without a GIN pending list.
\set migration 0012_steady \ir ../migrations/apply.sql
-- 0013: worker scopes: the kinds and queues a worker login may claim.
\set migration 0013_worker_scopes \ir ../migrations/apply.sql
-- 0014: the occurrence a scheduled run was made for, before its jitter.
\set migration 0014_occurrences \ir ../migrations/apply.sql
-- 0015: finished runs move to a history partitioned by day; retention drops whole days.
\set migration 0015_history \ir ../migrations/apply.sql
-- 0016: the bounds of a run's own fields as domains, checked only where a value is written.
\set migration 0016_run_domains \ir ../migrations/apply.sql
-- 0017: the capped definitions indexed, for the claim's check that none exists.
\set migration 0017_capped_index \ir ../migrations/apply.sql
-- 0018: a run's depends_on bound as a domain, shorter row rules: less to read at each UPDATE.
\set migration 0018_lean_updates \ir ../migrations/apply.sql
-- 0019: a scheduled run unique per occurrence, not per start (two jittered to one second).
\set migration 0019_occurrence_key \ir ../migrations/apply.sql
-- 0020: a new recurring definition starts at its creation, not at the scheduler's next tick.
\set migration 0020_new_definition_cursor \ir ../migrations/apply.sql
-- 0021: the occurrences in history indexed, so a past occurrence archived is not made again.
\set migration 0021_history_occurrences \ir ../migrations/apply.sql
-- 0022: every run that names dependencies indexed by them (and in history), not only the blocked.
\set migration 0022_dependents \ir ../migrations/apply.sql
-- 0023: the failures in history indexed by id and by kind, as jobs.runs indexes its own.
\set migration 0023_history_failures \ir ../migrations/apply.sql
-- 0024: the keys of the runs in history, in a table of their own.
\set migration 0024_history_keys \ir ../migrations/apply.sql
-- 0025: a trace context that is not a JSON object refused naming its setting.
\set migration 0025_trace_context_check \ir ../migrations/apply.sql
-- 0026: a blank idempotency, unique or concurrency key refused wherever it is written.
\set migration 0026_blank_keys \ir ../migrations/apply.sql
-- 0027: the login that registered each worker, shown in jobs.workers.
\set migration 0027_worker_logins \ir ../migrations/apply.sql
-- 0028: a lowered heartbeat timeout spares the runs last beaten before it, for the previous one's length.
\set migration 0028_heartbeat_grace \ir ../migrations/apply.sql
-- 0029: a rate limit's period at least a second in jobs.limits itself; shorter ones rescaled.
\set migration 0029_rate_period_bound \ir ../migrations/apply.sql
-- 0030: a rate limit's period is elapsed time (no day field) in jobs.limits itself.
\set migration 0030_rate_period_elapsed \ir ../migrations/apply.sql
-- 0031: the live one-shot definitions indexed by time, for the leader's one-shot phase.
\set migration 0031_one_shot_due_index \ir ../migrations/apply.sql
-- 0032: the durations stored in the settings tables have one sign.
\set migration 0032_one_sign_durations \ir ../migrations/apply.sql
-- 0033: the queues each worker claims from, for jobs.kinds_without_worker.
\set migration 0033_worker_queues \ir ../migrations/apply.sql
-- 0034: a retry delay's cap at least its first delay, in the tables themselves.
\set migration 0034_backoff_order \ir ../migrations/apply.sql

-- A schema that a newer pgtick migrated (the ledger holds a migration after the last one above)
-- keeps that pgtick's functions: these older ones are not put back over them.
SELECT EXISTS (
    SELECT FROM jobs.schema_migrations WHERE version > left(:'migration', 4)
) AS pgtick_newer \gset
\if :pgtick_newer
DO $newer$ BEGIN
    RAISE EXCEPTION 'the jobs schema has migrations this install does not know: a newer pgtick migrated it; nothing was applied'
        USING ERRCODE = '55000', HINT = 'Install with that pgtick (or a later one).';
END $newer$;
\endif

-- Functions and views, re-applied every time, in the same transaction (roles.sql grants on
-- all, so last).
\ir helpers.sql
\ir history.sql
\ir flow.sql
\ir enqueue.sql
\ir claim.sql
\ir worker.sql
\ir retry.sql
\ir cancel.sql
\ir reap.sql
\ir schedule.sql
\ir schedule_controls.sql
\ir materialize_many.sql
\ir define_many.sql
\ir leases.sql
\ir console.sql
\ir ops.sql
\ir dashboard.sql
\ir version.sql
\ir roles.sql
COMMIT;

SELECT set_config('search_path', :'pgtick_search_path', false) AS pgtick_search_path \gset
SELECT set_config('standard_conforming_strings', :'pgtick_standard_conforming_strings', false)
    AS pgtick_standard_conforming_strings \gset
SELECT set_config('quote_all_identifiers', :'pgtick_quote_all_identifiers', false)
    AS pgtick_quote_all_identifiers \gset
