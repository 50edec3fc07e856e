-- pgtick 0016: the bounds of a run's own fields move from table CHECK constraints of jobs.runs
-- to domains, one per column, whose constraints keep the old names.
-- Every UPDATE of jobs.runs (a claim, a completion, a heartbeat) re-read and re-planned each
-- table CHECK constraint, whatever columns it changed: with seventeen of them, about a tenth of
-- the server's CPU in a claim-and-complete loop. A domain's constraint is checked only where a
-- value of the column is written, from a plan the server keeps, so a status change checks
-- only the three rules that tie columns together (still table constraints). A direct write
-- out of bounds is refused as before: 23514, naming the same constraint (runs_kind_check...).
-- The domains are created empty, the columns moved onto them (no table rewrite: the values
-- stay as they are), then the constraints are added NOT VALID: every stored value already
-- passed the same check as a table constraint.
-- The views over jobs.runs are dropped first (a column a view reads cannot change type); the
-- function files that follow every migration create them again.

DROP VIEW IF EXISTS jobs.queues;
DROP VIEW IF EXISTS jobs.queue_stats;
DROP VIEW IF EXISTS jobs.blocked;
DROP VIEW IF EXISTS jobs.definition_health;
DROP VIEW IF EXISTS jobs.kinds_without_worker;
DROP VIEW IF EXISTS jobs.run_list;
DROP VIEW IF EXISTS jobs.running;
DROP VIEW IF EXISTS jobs.runs_all;
DROP VIEW IF EXISTS jobs.schedule_backlog;
DROP VIEW IF EXISTS jobs.workers;
DROP VIEW IF EXISTS jobs._claimable;

CREATE DOMAIN jobs.run_kind AS text;
CREATE DOMAIN jobs.run_payload AS jsonb;
CREATE DOMAIN jobs.run_attempt AS integer;
CREATE DOMAIN jobs.run_max_attempts AS integer;
CREATE DOMAIN jobs.run_priority AS integer;
CREATE DOMAIN jobs.run_origin AS text;
CREATE DOMAIN jobs.run_failure_reason AS text;
CREATE DOMAIN jobs.run_idempotency_key AS text;
CREATE DOMAIN jobs.run_timeout AS interval;
CREATE DOMAIN jobs.run_heartbeat_timeout AS interval;
CREATE DOMAIN jobs.run_queue AS text;
CREATE DOMAIN jobs.run_concurrency_key AS text;
CREATE DOMAIN jobs.run_unique_key AS text;

ALTER TABLE jobs.runs
ALTER COLUMN kind TYPE jobs.run_kind,
ALTER COLUMN payload TYPE jobs.run_payload,
ALTER COLUMN attempt TYPE jobs.run_attempt,
ALTER COLUMN max_attempts TYPE jobs.run_max_attempts,
ALTER COLUMN priority TYPE jobs.run_priority,
ALTER COLUMN origin TYPE jobs.run_origin,
ALTER COLUMN failure_reason TYPE jobs.run_failure_reason,
ALTER COLUMN idempotency_key TYPE jobs.run_idempotency_key,
ALTER COLUMN timeout TYPE jobs.run_timeout,
ALTER COLUMN heartbeat_timeout TYPE jobs.run_heartbeat_timeout,
ALTER COLUMN queue TYPE jobs.run_queue,
ALTER COLUMN concurrency_key TYPE jobs.run_concurrency_key,
ALTER COLUMN unique_key TYPE jobs.run_unique_key,
DROP CONSTRAINT runs_kind_check,
DROP CONSTRAINT runs_payload_check,
DROP CONSTRAINT runs_attempt_check,
DROP CONSTRAINT runs_max_attempts_check,
DROP CONSTRAINT runs_priority_check,
DROP CONSTRAINT runs_origin_check,
DROP CONSTRAINT runs_failure_reason_check,
DROP CONSTRAINT runs_idempotency_key_check,
DROP CONSTRAINT runs_timeout_check,
DROP CONSTRAINT runs_heartbeat_timeout_check,
DROP CONSTRAINT runs_queue_check,
DROP CONSTRAINT runs_concurrency_key_check,
DROP CONSTRAINT runs_unique_key_check;

ALTER DOMAIN jobs.run_kind
ADD CONSTRAINT runs_kind_check CHECK (length(value) BETWEEN 1 AND 200) NOT VALID;
ALTER DOMAIN jobs.run_payload
ADD CONSTRAINT runs_payload_check CHECK (jsonb_typeof(value) = 'object') NOT VALID;
ALTER DOMAIN jobs.run_attempt
ADD CONSTRAINT runs_attempt_check CHECK (value >= 1) NOT VALID;
ALTER DOMAIN jobs.run_max_attempts
ADD CONSTRAINT runs_max_attempts_check CHECK (value BETWEEN 1 AND 1000) NOT VALID;
ALTER DOMAIN jobs.run_priority
ADD CONSTRAINT runs_priority_check CHECK (value BETWEEN -1000 AND 1000) NOT VALID;
ALTER DOMAIN jobs.run_origin
ADD CONSTRAINT runs_origin_check CHECK (value IN ('schedule', 'manual', 'retry')) NOT VALID;
ALTER DOMAIN jobs.run_failure_reason
ADD CONSTRAINT runs_failure_reason_check CHECK (
    value IN ('Error', 'HeartbeatLost', 'Orphaned', 'Timeout', 'Skipped', 'DependencyFailed')
) NOT VALID;
ALTER DOMAIN jobs.run_idempotency_key
ADD CONSTRAINT runs_idempotency_key_check CHECK (length(value) BETWEEN 1 AND 200) NOT VALID;
ALTER DOMAIN jobs.run_timeout
ADD CONSTRAINT runs_timeout_check CHECK (value BETWEEN interval '1 second' AND interval '366 days') NOT VALID;
ALTER DOMAIN jobs.run_heartbeat_timeout
ADD CONSTRAINT runs_heartbeat_timeout_check CHECK (
    value BETWEEN interval '100 milliseconds' AND interval '366 days'
) NOT VALID;
ALTER DOMAIN jobs.run_queue
ADD CONSTRAINT runs_queue_check CHECK (length(value) BETWEEN 1 AND 200) NOT VALID;
ALTER DOMAIN jobs.run_concurrency_key
ADD CONSTRAINT runs_concurrency_key_check CHECK (length(value) BETWEEN 1 AND 200) NOT VALID;
ALTER DOMAIN jobs.run_unique_key
ADD CONSTRAINT runs_unique_key_check CHECK (length(value) BETWEEN 1 AND 200) NOT VALID;

COMMENT ON DOMAIN jobs.run_kind IS 'jobs.runs.kind: 1 to 200 characters.';
COMMENT ON DOMAIN jobs.run_payload IS 'jobs.runs.payload: a JSON object.';
COMMENT ON DOMAIN jobs.run_attempt IS 'jobs.runs.attempt: 1 for the first attempt.';
COMMENT ON DOMAIN jobs.run_max_attempts IS 'jobs.runs.max_attempts: 1 to 1000.';
COMMENT ON DOMAIN jobs.run_priority IS 'jobs.runs.priority: -1000 to 1000.';
COMMENT ON DOMAIN jobs.run_origin IS 'jobs.runs.origin: schedule, manual or retry.';
COMMENT ON DOMAIN jobs.run_failure_reason IS 'jobs.runs.failure_reason: Error, HeartbeatLost, Orphaned, Timeout, Skipped or DependencyFailed.';
COMMENT ON DOMAIN jobs.run_idempotency_key IS 'jobs.runs.idempotency_key: 1 to 200 characters.';
COMMENT ON DOMAIN jobs.run_timeout IS 'jobs.runs.timeout: 1 second to 366 days.';
COMMENT ON DOMAIN jobs.run_heartbeat_timeout IS 'jobs.runs.heartbeat_timeout: 100 milliseconds to 366 days.';
COMMENT ON DOMAIN jobs.run_queue IS 'jobs.runs.queue: 1 to 200 characters.';
COMMENT ON DOMAIN jobs.run_concurrency_key IS 'jobs.runs.concurrency_key: 1 to 200 characters.';
COMMENT ON DOMAIN jobs.run_unique_key IS 'jobs.runs.unique_key: 1 to 200 characters.';
