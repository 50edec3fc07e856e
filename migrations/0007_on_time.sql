-- pgtick schema: definitions whose run inserts fail are isolated and retried with backoff.

-- ===========================================================================
-- Materialization health per definition
-- ===========================================================================
-- A definition whose runs the database refuses (an operator's trigger, a
-- constraint, a refused value) is recorded here and retried with backoff;
-- the other definitions in the same batch are materialized as usual.
ALTER TABLE jobs.definitions
ADD COLUMN materialize_error text,
ADD COLUMN materialize_failures integer NOT NULL DEFAULT 0,
ADD COLUMN materialize_retry_at timestamptz;
COMMENT ON COLUMN jobs.definitions.materialize_error IS
'Why the last attempt to insert this definition''s runs failed (message and SQLSTATE); NULL once one succeeds.';
COMMENT ON COLUMN jobs.definitions.materialize_failures IS
'Failed attempts in a row to insert this definition''s runs; 0 after a success.';
COMMENT ON COLUMN jobs.definitions.materialize_retry_at IS
'The scheduler does not try this definition again before this instant (exponential backoff after failures).';

-- The leader's due query: live recurring definitions by cursor.
CREATE INDEX definitions_live_due_idx ON jobs.definitions (next_run_at)
WHERE schedule IS NOT NULL AND enabled AND finished_at IS NULL AND schedule_error IS NULL;
