-- pgtick schema v1: tables, types, indexes and roles.
-- Forward-only: once released this file is never edited; changes go into 0002_... .
-- Applied by sql/install.sql (psql) or `pgtick migrate`, inside one transaction,
-- under the migration advisory lock, and recorded in jobs.schema_migrations.

-- ===========================================================================
-- Roles (cluster-wide, so created only when missing)
-- ===========================================================================
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'jobs_reader') THEN
        CREATE ROLE jobs_reader NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'jobs_worker') THEN
        CREATE ROLE jobs_worker NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'jobs_operator') THEN
        CREATE ROLE jobs_operator NOLOGIN;
    END IF;
END
$roles$;

REVOKE ALL ON SCHEMA jobs FROM public;
GRANT USAGE ON SCHEMA jobs TO jobs_reader, jobs_worker, jobs_operator;

-- ===========================================================================
-- Types
-- ===========================================================================
CREATE TYPE jobs.run_status AS ENUM ('QUEUED', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED');
COMMENT ON TYPE jobs.run_status IS
'Life cycle of one execution attempt: QUEUED -> RUNNING -> COMPLETED | FAILED | CANCELLED.';

-- ===========================================================================
-- Settings: one row, edited by operators with UPDATE
-- ===========================================================================
CREATE TABLE jobs.config (
    singleton boolean PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    heartbeat_timeout interval NOT NULL DEFAULT '1 minute'
    CHECK (heartbeat_timeout > '0'),
    orphan_timeout interval NOT NULL DEFAULT '1 hour'
    CHECK (orphan_timeout > '0'),
    max_payload_bytes integer NOT NULL DEFAULT 1048576
    CHECK (max_payload_bytes BETWEEN 2 AND 268435456),
    retention interval NOT NULL DEFAULT '14 days'
    CHECK (retention > '0'),
    max_attempts integer NOT NULL DEFAULT 1 CHECK (max_attempts BETWEEN 1 AND 1000),
    backoff_initial interval NOT NULL DEFAULT '10 seconds'
    CHECK (backoff_initial >= '0'),
    backoff_max interval NOT NULL DEFAULT '1 hour' CHECK (backoff_max >= '0')
);
INSERT INTO jobs.config DEFAULT VALUES;
COMMENT ON TABLE jobs.config IS
'Instance-wide settings (exactly one row). Change with UPDATE jobs.config SET ...';
COMMENT ON COLUMN jobs.config.singleton IS 'Always true: keeps the table at one row.';
COMMENT ON COLUMN jobs.config.heartbeat_timeout IS
'A RUNNING run whose heartbeat is older than this is reaped as HeartbeatLost (per-run override: runs.heartbeat_timeout).';
COMMENT ON COLUMN jobs.config.orphan_timeout IS
'A RUNNING run that never heartbeated and started longer ago than this is reaped as Orphaned.';
COMMENT ON COLUMN jobs.config.max_payload_bytes IS 'Largest accepted payload, in bytes of its JSON text.';
COMMENT ON COLUMN jobs.config.retention IS 'How long finished runs are kept before jobs.prune() deletes them.';
COMMENT ON COLUMN jobs.config.max_attempts IS 'Attempts for kinds that have no row in jobs.retry_policies.';
COMMENT ON COLUMN jobs.config.backoff_initial IS 'Default first retry delay for kinds without a policy.';
COMMENT ON COLUMN jobs.config.backoff_max IS 'Default cap on the retry delay for kinds without a policy.';

-- ===========================================================================
-- Definitions: durable intent, one row per schedule
-- ===========================================================================
CREATE TABLE jobs.definitions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    kind text NOT NULL CHECK (length(kind) BETWEEN 1 AND 200),
    schedule text CHECK (length(schedule) BETWEEN 1 AND 4000),
    timezone text NOT NULL DEFAULT 'UTC',
    run_at timestamptz,
    next_run_at timestamptz,
    payload jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(payload) = 'object'),
    enabled boolean NOT NULL DEFAULT TRUE,
    max_concurrent_runs integer CHECK (max_concurrent_runs > 0),
    priority integer NOT NULL DEFAULT 0 CHECK (priority BETWEEN -1000 AND 1000),
    max_attempts integer CHECK (max_attempts BETWEEN 1 AND 1000),
    misfire_policy text NOT NULL DEFAULT 'coalesce'
    CHECK (misfire_policy IN ('coalesce', 'catch_up', 'skip')),
    overlap_policy text NOT NULL DEFAULT 'queue'
    CHECK (overlap_policy IN ('queue', 'skip')),
    timeout interval CHECK (timeout > '0'),
    heartbeat_timeout interval CHECK (heartbeat_timeout > '0'),
    revision integer NOT NULL DEFAULT 1,
    schedule_error text,
    finished_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT definitions_one_shot_xor_recurring
    CHECK ((schedule IS NULL) <> (run_at IS NULL))
);
COMMENT ON TABLE jobs.definitions IS
'Durable intent: one row per schedule (recurring) or one-shot task. Runs are materialized from here.';
COMMENT ON COLUMN jobs.definitions.id IS 'Surrogate key; runs.definition_id points here.';
COMMENT ON COLUMN jobs.definitions.name IS 'Unique human handle; jobs.define() upserts by it.';
COMMENT ON COLUMN jobs.definitions.kind IS 'Which job code runs (the worker registry key).';
COMMENT ON COLUMN jobs.definitions.schedule IS
'RFC 5545 RRULE text or a 5-field cron expression; NULL for a one-shot.';
COMMENT ON COLUMN jobs.definitions.timezone IS
'IANA time zone the schedule is read in (BYHOUR=8 means 08:00 here, all year).';
COMMENT ON COLUMN jobs.definitions.run_at IS 'When a one-shot runs; NULL for a recurring schedule.';
COMMENT ON COLUMN jobs.definitions.next_run_at IS
'Materialization cursor: the earliest occurrence not yet turned into a run. NULL: not initialized yet (or finished).';
COMMENT ON COLUMN jobs.definitions.payload IS 'JSON object handed to every run of this definition.';
COMMENT ON COLUMN jobs.definitions.enabled IS 'false = paused: no new occurrences are materialized.';
COMMENT ON COLUMN jobs.definitions.max_concurrent_runs IS
'Global cap on RUNNING runs of this definition across all workers; NULL = unlimited.';
COMMENT ON COLUMN jobs.definitions.priority IS 'Higher runs first (-1000..1000).';
COMMENT ON COLUMN jobs.definitions.max_attempts IS
'Attempts per occurrence; NULL = the kind''s retry policy (or jobs.config.max_attempts).';
COMMENT ON COLUMN jobs.definitions.misfire_policy IS
'After downtime: coalesce (one run for the missed window), catch_up (each missed occurrence), skip (none).';
COMMENT ON COLUMN jobs.definitions.overlap_policy IS
'queue: an occurrence at cap waits for capacity; skip: it is recorded as a CANCELLED run with reason Skipped.';
COMMENT ON COLUMN jobs.definitions.timeout IS 'Longest a run may take; NULL = no limit.';
COMMENT ON COLUMN jobs.definitions.heartbeat_timeout IS
'Heartbeat staleness after which a run is reaped; NULL = jobs.config.heartbeat_timeout.';
COMMENT ON COLUMN jobs.definitions.revision IS
'Bumped whenever the schedule, zone or run_at changes; fences stale materializers.';
COMMENT ON COLUMN jobs.definitions.schedule_error IS
'Why the scheduler could not read this schedule (set by the leader, cleared by jobs.define); NULL when fine.';
COMMENT ON COLUMN jobs.definitions.finished_at IS
'Set when the schedule is exhausted (COUNT/UNTIL reached) or the one-shot was materialized.';
COMMENT ON COLUMN jobs.definitions.created_at IS 'When the definition was first defined.';
COMMENT ON COLUMN jobs.definitions.updated_at IS 'When jobs.define() last changed it.';

CREATE INDEX definitions_due_idx ON jobs.definitions (next_run_at)
WHERE enabled AND finished_at IS NULL;

-- ===========================================================================
-- Runs: one execution attempt each, never rewritten into another attempt
-- ===========================================================================
-- fillfactor leaves room on each page so heartbeat and claim updates can stay
-- HOT (heap-only tuples): heartbeat_at is deliberately not indexed.
CREATE TABLE jobs.runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    definition_id bigint,
    kind text NOT NULL CHECK (length(kind) BETWEEN 1 AND 200),
    payload jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(payload) = 'object'),
    status jobs.run_status NOT NULL DEFAULT 'QUEUED',
    attempt integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    max_attempts integer CHECK (max_attempts BETWEEN 1 AND 1000),
    retry_of bigint,
    scheduled_for timestamptz NOT NULL DEFAULT now(),
    priority integer NOT NULL DEFAULT 0 CHECK (priority BETWEEN -1000 AND 1000),
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    heartbeat_at timestamptz,
    finished_at timestamptz,
    worker text,
    origin text NOT NULL DEFAULT 'manual' CHECK (origin IN ('schedule', 'manual', 'retry')),
    cancel_requested boolean NOT NULL DEFAULT FALSE,
    failure_reason text
    CHECK (failure_reason IN ('Error', 'HeartbeatLost', 'Orphaned', 'Timeout', 'Skipped')),
    error text,
    result jsonb,
    idempotency_key text CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    timeout interval CHECK (timeout > '0'),
    heartbeat_timeout interval CHECK (heartbeat_timeout > '0'),
    CONSTRAINT runs_retry_links_previous CHECK ((attempt = 1) = (retry_of IS NULL)),
    CONSTRAINT runs_finished_have_time
    CHECK ((status IN ('COMPLETED', 'FAILED', 'CANCELLED')) = (finished_at IS NOT NULL)),
    CONSTRAINT runs_failed_have_reason CHECK ((status = 'FAILED') <= (failure_reason IS NOT NULL))
) WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05
);
COMMENT ON TABLE jobs.runs IS
'One execution attempt per row. A retry is a new row (attempt n+1, retry_of = previous id).';
COMMENT ON COLUMN jobs.runs.id IS 'Run id.';
COMMENT ON COLUMN jobs.runs.definition_id IS
'The definition this run belongs to; NULL for ad-hoc runs (jobs.enqueue). Kept after the definition is deleted.';
COMMENT ON COLUMN jobs.runs.kind IS 'Which job code runs.';
COMMENT ON COLUMN jobs.runs.payload IS 'JSON object handed to the job.';
COMMENT ON COLUMN jobs.runs.status IS 'QUEUED, RUNNING, COMPLETED, FAILED or CANCELLED.';
COMMENT ON COLUMN jobs.runs.attempt IS '1-based attempt number of this occurrence.';
COMMENT ON COLUMN jobs.runs.max_attempts IS 'Attempt budget; NULL = the kind''s retry policy.';
COMMENT ON COLUMN jobs.runs.retry_of IS 'The previous attempt''s run id (NULL for attempt 1).';
COMMENT ON COLUMN jobs.runs.scheduled_for IS
'Not claimable before this instant (occurrence time, or now() + backoff for a retry).';
COMMENT ON COLUMN jobs.runs.priority IS 'Higher is claimed first.';
COMMENT ON COLUMN jobs.runs.created_at IS 'Insert time.';
COMMENT ON COLUMN jobs.runs.started_at IS 'When a worker claimed it.';
COMMENT ON COLUMN jobs.runs.heartbeat_at IS 'Last heartbeat from the owning worker (not indexed, so heartbeats stay HOT).';
COMMENT ON COLUMN jobs.runs.finished_at IS 'When it reached a terminal status.';
COMMENT ON COLUMN jobs.runs.worker IS 'Id of the worker that claimed it; fences complete/fail/heartbeat.';
COMMENT ON COLUMN jobs.runs.origin IS 'schedule (materialized occurrence), manual (enqueue/run_now) or retry.';
COMMENT ON COLUMN jobs.runs.cancel_requested IS 'Set by jobs.cancel() on a RUNNING run; delivered via heartbeats.';
COMMENT ON COLUMN jobs.runs.failure_reason IS 'Error, HeartbeatLost, Orphaned, Timeout or Skipped.';
COMMENT ON COLUMN jobs.runs.error IS 'Error message of a failed or cancelled run.';
COMMENT ON COLUMN jobs.runs.result IS 'JSON result reported by jobs.complete().';
COMMENT ON COLUMN jobs.runs.idempotency_key IS 'Optional caller key: a second enqueue with it returns this run.';
COMMENT ON COLUMN jobs.runs.timeout IS 'Longest this run may take; NULL = no limit.';
COMMENT ON COLUMN jobs.runs.heartbeat_timeout IS 'Heartbeat staleness that reaps this run; NULL = jobs.config.';

-- Claim: the QUEUED frontier in claim order. Stays small however long the history.
CREATE INDEX runs_claim_idx ON jobs.runs (priority DESC, scheduled_for, id)
WHERE status = 'QUEUED';
-- Caps and reaping: the live RUNNING set, by definition.
CREATE INDEX runs_running_idx ON jobs.runs (definition_id)
WHERE status = 'RUNNING';
-- Exactly-once materialization: one first attempt per definition and occurrence.
CREATE UNIQUE INDEX runs_occurrence_uniq ON jobs.runs (definition_id, scheduled_for)
WHERE origin = 'schedule';
-- At most one next attempt per attempt (retries are never inserted twice).
CREATE UNIQUE INDEX runs_retry_of_uniq ON jobs.runs (retry_of)
WHERE retry_of IS NOT NULL;
-- Idempotent enqueue.
CREATE UNIQUE INDEX runs_idempotency_uniq ON jobs.runs (idempotency_key)
WHERE idempotency_key IS NOT NULL;
-- History per definition (health, last outcome) and pruning by age.
CREATE INDEX runs_definition_history_idx ON jobs.runs (definition_id, id)
WHERE definition_id IS NOT NULL;
CREATE INDEX runs_finished_idx ON jobs.runs (finished_at)
WHERE finished_at IS NOT NULL;

-- ===========================================================================
-- Retry policies, per kind
-- ===========================================================================
CREATE TABLE jobs.retry_policies (
    kind text PRIMARY KEY CHECK (length(kind) BETWEEN 1 AND 200),
    allow text[],
    deny text[] NOT NULL DEFAULT '{}',
    max_attempts integer NOT NULL DEFAULT 3 CHECK (max_attempts BETWEEN 1 AND 1000),
    backoff_initial interval NOT NULL DEFAULT '10 seconds' CHECK (backoff_initial >= '0'),
    backoff_factor double precision NOT NULL DEFAULT 2 CHECK (backoff_factor >= 1),
    backoff_max interval NOT NULL DEFAULT '1 hour' CHECK (backoff_max >= '0'),
    jitter double precision NOT NULL DEFAULT 0.2 CHECK (jitter BETWEEN 0 AND 1),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE jobs.retry_policies IS
'Per-kind retry rules. jobs.fail() checks deny first (deny always wins), then allow.';
COMMENT ON COLUMN jobs.retry_policies.kind IS 'The job kind this policy governs.';
COMMENT ON COLUMN jobs.retry_policies.allow IS
'Error class names that may be retried; NULL = every class not denied.';
COMMENT ON COLUMN jobs.retry_policies.deny IS 'Error class names never retried; wins over allow.';
COMMENT ON COLUMN jobs.retry_policies.max_attempts IS 'Total attempts including the first.';
COMMENT ON COLUMN jobs.retry_policies.backoff_initial IS 'Delay before attempt 2.';
COMMENT ON COLUMN jobs.retry_policies.backoff_factor IS 'Each further delay is this times the previous one.';
COMMENT ON COLUMN jobs.retry_policies.backoff_max IS 'Cap on any one delay (before jitter).';
COMMENT ON COLUMN jobs.retry_policies.jitter IS 'Random spread as a fraction of the delay (0.2 = +-20%).';
COMMENT ON COLUMN jobs.retry_policies.updated_at IS 'Last change.';

-- ===========================================================================
-- Leases: TTL locks with an owner (skip-if-running for any command)
-- ===========================================================================
CREATE TABLE jobs.leases (
    name text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    owner text CHECK (length(owner) BETWEEN 1 AND 200),
    acquired_at timestamptz,
    expires_at timestamptz NOT NULL DEFAULT '-infinity',
    consecutive_skips integer NOT NULL DEFAULT 0,
    last_skipped_at timestamptz
);
COMMENT ON TABLE jobs.leases IS
'TTL locks: acquire succeeds if free or expired; renew and release only by the owner.';
COMMENT ON COLUMN jobs.leases.name IS 'Lease name.';
COMMENT ON COLUMN jobs.leases.owner IS 'Current holder; NULL when released.';
COMMENT ON COLUMN jobs.leases.acquired_at IS 'When the current holder acquired it.';
COMMENT ON COLUMN jobs.leases.expires_at IS 'Held until this instant unless renewed.';
COMMENT ON COLUMN jobs.leases.consecutive_skips IS 'Acquire attempts refused in a row; reset on success.';
COMMENT ON COLUMN jobs.leases.last_skipped_at IS 'Last refused acquire.';

-- ===========================================================================
-- Time zone names, cached from pg_timezone_names (which reads every zone file)
-- ===========================================================================
CREATE TABLE jobs._zones (
    name text PRIMARY KEY
);
COMMENT ON TABLE jobs._zones IS
'Private: IANA zone names accepted by jobs.define(); refreshed from pg_timezone_names on every migrate.';
COMMENT ON COLUMN jobs._zones.name IS 'Zone name, e.g. Europe/Sofia.';

-- ===========================================================================
-- Leadership bookkeeping (the lock itself is a session advisory lock)
-- ===========================================================================
CREATE TABLE jobs._leadership (
    singleton boolean PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    pid integer NOT NULL,
    owner text,
    since timestamptz NOT NULL
);
COMMENT ON TABLE jobs._leadership IS
'Private: when the current leader backend took the leader lock (pg_locks has no acquisition time).';
COMMENT ON COLUMN jobs._leadership.singleton IS 'Always true: one row.';
COMMENT ON COLUMN jobs._leadership.pid IS 'Backend pid that took the leader lock.';
COMMENT ON COLUMN jobs._leadership.owner IS 'Process-supplied identity of the leader.';
COMMENT ON COLUMN jobs._leadership.since IS 'When that backend took the lock.';
