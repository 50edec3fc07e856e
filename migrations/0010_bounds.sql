-- pgtick schema: every stored duration and number within bounds.
-- Forward-only: once released this file is never edited.
-- The API functions refuse out-of-range values with 22023 (bounds: jobs._duration_bounds in
-- sql/helpers.sql); these CHECK constraints say the same for a direct INSERT or UPDATE, so no
-- row can make the reaper, prune or a retry's backoff overflow, or hold a timeout a driver
-- cannot read. Rows written before are first clamped into the bounds, so the upgrade never fails.

-- ===========================================================================
-- jobs.config
-- ===========================================================================
UPDATE jobs.config SET
    heartbeat_timeout = least(greatest(heartbeat_timeout, '100 milliseconds'), '366 days'),
    orphan_timeout = least(greatest(orphan_timeout, '100 milliseconds'), '366 days'),
    retention = least(greatest(retention, '1 second'), '100 years'),
    backoff_initial = least(backoff_initial, '366 days'),
    backoff_max = least(backoff_max, '366 days');

ALTER TABLE jobs.config
DROP CONSTRAINT config_heartbeat_timeout_check,
ADD CONSTRAINT config_heartbeat_timeout_check
CHECK (heartbeat_timeout BETWEEN '100 milliseconds' AND '366 days'),
DROP CONSTRAINT config_orphan_timeout_check,
ADD CONSTRAINT config_orphan_timeout_check
CHECK (orphan_timeout BETWEEN '100 milliseconds' AND '366 days'),
DROP CONSTRAINT config_retention_check,
ADD CONSTRAINT config_retention_check CHECK (retention BETWEEN '1 second' AND '100 years'),
DROP CONSTRAINT config_backoff_initial_check,
ADD CONSTRAINT config_backoff_initial_check CHECK (backoff_initial BETWEEN '0' AND '366 days'),
DROP CONSTRAINT config_backoff_max_check,
ADD CONSTRAINT config_backoff_max_check CHECK (backoff_max BETWEEN '0' AND '366 days');

COMMENT ON COLUMN jobs.config.heartbeat_timeout IS
'A RUNNING run whose heartbeat is older than this is reaped as HeartbeatLost (per-run override: runs.heartbeat_timeout). 100 milliseconds to 366 days.';
COMMENT ON COLUMN jobs.config.orphan_timeout IS
'A RUNNING run that never heartbeated and started longer ago than this is reaped as Orphaned. 100 milliseconds to 366 days.';
COMMENT ON COLUMN jobs.config.retention IS
'How long finished runs are kept before jobs.prune() deletes them. 1 second to 100 years.';
COMMENT ON COLUMN jobs.config.backoff_initial IS
'Default first retry delay for kinds without a policy. 0 to 366 days.';
COMMENT ON COLUMN jobs.config.backoff_max IS
'Default cap on the retry delay for kinds without a policy. 0 to 366 days.';

-- ===========================================================================
-- jobs.definitions
-- ===========================================================================
UPDATE jobs.definitions SET timeout = least(greatest(timeout, '1 second'), '366 days')
WHERE timeout NOT BETWEEN '1 second' AND '366 days';
UPDATE jobs.definitions SET heartbeat_timeout = least(greatest(heartbeat_timeout, '100 milliseconds'), '366 days')
WHERE heartbeat_timeout NOT BETWEEN '100 milliseconds' AND '366 days';
UPDATE jobs.definitions SET max_concurrent_runs = 100000
WHERE max_concurrent_runs > 100000;

ALTER TABLE jobs.definitions
DROP CONSTRAINT definitions_timeout_check,
ADD CONSTRAINT definitions_timeout_check CHECK (timeout BETWEEN '1 second' AND '366 days'),
DROP CONSTRAINT definitions_heartbeat_timeout_check,
ADD CONSTRAINT definitions_heartbeat_timeout_check
CHECK (heartbeat_timeout BETWEEN '100 milliseconds' AND '366 days'),
DROP CONSTRAINT definitions_max_concurrent_runs_check,
ADD CONSTRAINT definitions_max_concurrent_runs_check CHECK (max_concurrent_runs BETWEEN 1 AND 100000);

COMMENT ON COLUMN jobs.definitions.timeout IS
'Longest a run may take, 1 second to 366 days; past it the reaper fails the run as Timeout. NULL = no limit.';
COMMENT ON COLUMN jobs.definitions.heartbeat_timeout IS
'Heartbeat staleness after which a run is reaped, 100 milliseconds to 366 days; NULL = jobs.config.heartbeat_timeout.';

-- ===========================================================================
-- jobs.runs (only rows out of bounds are rewritten)
-- ===========================================================================
UPDATE jobs.runs SET timeout = least(greatest(timeout, '1 second'), '366 days')
WHERE timeout NOT BETWEEN '1 second' AND '366 days';
UPDATE jobs.runs SET heartbeat_timeout = least(greatest(heartbeat_timeout, '100 milliseconds'), '366 days')
WHERE heartbeat_timeout NOT BETWEEN '100 milliseconds' AND '366 days';

ALTER TABLE jobs.runs
DROP CONSTRAINT runs_timeout_check,
ADD CONSTRAINT runs_timeout_check CHECK (timeout BETWEEN '1 second' AND '366 days'),
DROP CONSTRAINT runs_heartbeat_timeout_check,
ADD CONSTRAINT runs_heartbeat_timeout_check CHECK (heartbeat_timeout BETWEEN '100 milliseconds' AND '366 days');

COMMENT ON COLUMN jobs.runs.timeout IS
'Longest this run may take, 1 second to 366 days: the reaper fails it as Timeout once started_at + timeout has passed. NULL = no limit.';
COMMENT ON COLUMN jobs.runs.heartbeat_timeout IS
'Heartbeat staleness that reaps this run, 100 milliseconds to 366 days; NULL = jobs.config.';

-- ===========================================================================
-- jobs.retry_policies
-- ===========================================================================
UPDATE jobs.retry_policies SET
    backoff_initial = least(backoff_initial, '366 days'),
    backoff_max = least(backoff_max, '366 days'),
    backoff_factor = CASE WHEN backoff_factor = 'NaN' THEN 2 ELSE least(backoff_factor, 100) END
WHERE backoff_initial > '366 days' OR backoff_max > '366 days' OR NOT backoff_factor BETWEEN 1 AND 100;

-- NaN compares greater than every number in PostgreSQL, so BETWEEN refuses it (and infinities).
ALTER TABLE jobs.retry_policies
DROP CONSTRAINT retry_policies_backoff_initial_check,
ADD CONSTRAINT retry_policies_backoff_initial_check CHECK (backoff_initial BETWEEN '0' AND '366 days'),
DROP CONSTRAINT retry_policies_backoff_max_check,
ADD CONSTRAINT retry_policies_backoff_max_check CHECK (backoff_max BETWEEN '0' AND '366 days'),
DROP CONSTRAINT retry_policies_backoff_factor_check,
ADD CONSTRAINT retry_policies_backoff_factor_check CHECK (backoff_factor BETWEEN 1 AND 100);
