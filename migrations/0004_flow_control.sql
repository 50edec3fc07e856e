-- pgtick schema: flow control. Named queues (pausable), limits per queue and kind (running
-- and rate, optionally per concurrency key), unique jobs, and dependencies between runs.
-- Forward-only: once released this file is never edited.

-- ===========================================================================
-- Queues and concurrency keys on definitions and runs
-- ===========================================================================
ALTER TABLE jobs.definitions
ADD COLUMN queue text NOT NULL DEFAULT 'default' CHECK (length(queue) BETWEEN 1 AND 200),
ADD COLUMN concurrency_key text CHECK (length(concurrency_key) BETWEEN 1 AND 200);
COMMENT ON COLUMN jobs.definitions.queue IS
'Queue its runs go to (default ''default''); jobs.pause_queue() and queue limits act on it.';
COMMENT ON COLUMN jobs.definitions.concurrency_key IS
'Concurrency key its runs carry (a tenant, customer, account): per_key limits count each key separately. NULL = none.';

ALTER TABLE jobs.runs
ADD COLUMN queue text NOT NULL DEFAULT 'default' CHECK (length(queue) BETWEEN 1 AND 200),
ADD COLUMN concurrency_key text CHECK (length(concurrency_key) BETWEEN 1 AND 200),
ADD COLUMN unique_key text CHECK (length(unique_key) BETWEEN 1 AND 200),
ADD COLUMN depends_on bigint[] CHECK (cardinality(depends_on) BETWEEN 1 AND 1000),
ADD COLUMN blocked boolean NOT NULL DEFAULT FALSE;
COMMENT ON COLUMN jobs.runs.queue IS
'Queue of this run (default ''default''); claim skips paused queues and honours queue limits.';
COMMENT ON COLUMN jobs.runs.concurrency_key IS
'Tenant/customer/account key: a per_key limit holds for each distinct key separately. NULL = none.';
COMMENT ON COLUMN jobs.runs.unique_key IS
'Unique-job key (per kind): while a run with the same kind and key is in the unique_while states, jobs.enqueue adds no other.';
COMMENT ON COLUMN jobs.runs.depends_on IS
'Runs that must COMPLETE (by their retry chain''s final outcome) before this one is claimable; NULL = none.';
COMMENT ON COLUMN jobs.runs.blocked IS
'True while some run in depends_on has not completed: jobs.claim skips it (see the jobs.blocked view).';

-- DependencyFailed: cancelled because a run it depends on failed for good or was cancelled.
ALTER TABLE jobs.runs DROP CONSTRAINT runs_failure_reason_check;
ALTER TABLE jobs.runs ADD CONSTRAINT runs_failure_reason_check
CHECK (failure_reason IN ('Error', 'HeartbeatLost', 'Orphaned', 'Timeout', 'Skipped', 'DependencyFailed'));
COMMENT ON COLUMN jobs.runs.failure_reason IS
'Error, HeartbeatLost, Orphaned, Timeout, Skipped or DependencyFailed.';

-- The idempotency key is per kind: two kinds may use the same key.
DROP INDEX jobs.runs_idempotency_uniq;
CREATE UNIQUE INDEX runs_idempotency_uniq ON jobs.runs (kind, idempotency_key)
WHERE idempotency_key IS NOT NULL;
COMMENT ON COLUMN jobs.runs.idempotency_key IS
'Optional caller key, unique per kind: a second enqueue of the kind with it returns this run.';

-- (Live RUNNING counts per queue or kind use runs_running_idx: the RUNNING set is small,
-- and every index on jobs.runs costs each claim and each completion an insert.)
-- Unique jobs: the runs of a kind with a unique key, newest first.
CREATE INDEX runs_unique_idx ON jobs.runs (kind, unique_key, id)
WHERE unique_key IS NOT NULL;
-- Dependencies: the waiting runs of a dependency (release on completion, cascade on failure).
CREATE INDEX runs_blocked_deps_idx ON jobs.runs USING gin (depends_on)
WHERE blocked;
-- Whether anything waits at all: completions skip the dependency work when nothing does.
CREATE INDEX runs_blocked_idx ON jobs.runs (id)
WHERE blocked;

-- ===========================================================================
-- Paused queues
-- ===========================================================================
CREATE TABLE jobs.paused_queues (
    name text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    paused_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE jobs.paused_queues IS
'Queues nothing is claimed from (jobs.pause_queue / jobs.resume_queue); RUNNING runs finish.';
COMMENT ON COLUMN jobs.paused_queues.name IS 'Queue name.';
COMMENT ON COLUMN jobs.paused_queues.paused_at IS 'When it was paused.';

-- ===========================================================================
-- Limits per queue and per kind
-- ===========================================================================
CREATE TABLE jobs.limits (
    scope text NOT NULL CHECK (scope IN ('queue', 'kind')),
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    max_running integer CHECK (max_running BETWEEN 1 AND 1000000),
    rate_limit integer CHECK (rate_limit BETWEEN 1 AND 1000000),
    rate_period interval CHECK (rate_period > '0' AND rate_period <= '1 day'),
    per_key boolean NOT NULL DEFAULT FALSE,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, name),
    CONSTRAINT limits_rate_needs_period CHECK ((rate_limit IS NULL) = (rate_period IS NULL)),
    CONSTRAINT limits_something_limited CHECK (max_running IS NOT NULL OR rate_limit IS NOT NULL)
);
COMMENT ON TABLE jobs.limits IS
'Limits enforced by jobs.claim across all workers, per queue or per kind (written by jobs.set_limit).';
COMMENT ON COLUMN jobs.limits.scope IS 'queue or kind.';
COMMENT ON COLUMN jobs.limits.name IS 'The queue or kind name.';
COMMENT ON COLUMN jobs.limits.max_running IS 'At most this many RUNNING at once; NULL = no running limit.';
COMMENT ON COLUMN jobs.limits.rate_limit IS 'At most this many starts per trailing rate_period; NULL = no rate limit.';
COMMENT ON COLUMN jobs.limits.rate_period IS 'The trailing window of the rate limit (up to 1 day).';
COMMENT ON COLUMN jobs.limits.per_key IS
'true: the limit holds for each distinct concurrency_key separately (runs without a key share one slot group).';
COMMENT ON COLUMN jobs.limits.updated_at IS 'Last change.';

-- ===========================================================================
-- Private: starts per rate-limited group, for the trailing-window counts
-- ===========================================================================
CREATE TABLE jobs._rate_starts (
    label text NOT NULL,
    started_at timestamptz NOT NULL,
    starts integer NOT NULL CHECK (starts > 0)
);
CREATE INDEX rate_starts_label_idx ON jobs._rate_starts (label, started_at);
COMMENT ON TABLE jobs._rate_starts IS
'Private: how many runs jobs.claim started per rate-limited group and instant (a row per claim and group); rows older than the window are deleted by later claims.';
COMMENT ON COLUMN jobs._rate_starts.label IS
'The group: JSON array [scope, name] or, per key, [scope, name, concurrency_key].';
COMMENT ON COLUMN jobs._rate_starts.started_at IS 'When they started (the runs'' started_at).';
COMMENT ON COLUMN jobs._rate_starts.starts IS 'How many of the group''s runs that claim started.';

-- ===========================================================================
-- Functions whose signature grows (absent on a fresh install; re-created by sql/*.sql)
-- ===========================================================================
DROP FUNCTION IF EXISTS jobs.claim(integer, text, text[], boolean);
DROP FUNCTION IF EXISTS jobs.enqueue(text, jsonb, timestamptz, integer, text, integer, interval, interval);
DROP FUNCTION IF EXISTS jobs.define(
    text, text, text, text, timestamptz, jsonb, boolean, integer, integer, integer, text, text,
    interval, interval
);

-- ===========================================================================
-- Private: one capped group of a claim's pool (a definition with a cap, or a limit,
-- per concurrency key where the limit is per_key), with its lock and its room
-- ===========================================================================
CREATE TYPE jobs._claim_group AS (
    label text,
    lock_key bigint,
    scope text,
    name text,
    ckey text,
    per_key boolean,
    definition_id bigint,
    max_running integer,
    rate_limit integer,
    rate_period interval,
    skip boolean,
    shared boolean,
    locked boolean,
    free integer
);
COMMENT ON TYPE jobs._claim_group IS
'Private: a group jobs.claim must keep within its limit: its label, dispatch lock key, limit, whether its lock is taken shared (a roomy limit), and the room counted under the lock.';
