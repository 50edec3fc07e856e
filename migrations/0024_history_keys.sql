-- pgtick 0024: the keys of the runs in history, in one table of their own.
-- An enqueue with an idempotency key, or with a unique key kept 'ever', looks the key up among
-- the runs that moved to history. Read from jobs.run_history, that lookup planned and locked
-- every day of history with its indexes, about ten locks a day, in the caller's transaction:
-- with a long retention a few such enqueues at once filled PostgreSQL's lock table, and each
-- cost more the more days there were. This table holds the keys of the moved runs that have
-- one, and when each run finished (which names its day): the lookup reads it, then that day.

CREATE TABLE jobs.run_history_keys (
    run_id bigint PRIMARY KEY,
    kind text NOT NULL,
    idempotency_key text,
    unique_key text,
    created_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL
);
COMMENT ON TABLE jobs.run_history_keys IS
'Private: the idempotency and unique keys of the runs in jobs.run_history that have one, with when each run was created and finished (its day of history). jobs.archive adds them, jobs.prune and jobs.discard remove them with their runs.';

COMMENT ON COLUMN jobs.run_history_keys.run_id IS 'The moved run (jobs.run_history.id).';
COMMENT ON COLUMN jobs.run_history_keys.kind IS 'Its kind: keys are per kind.';
COMMENT ON COLUMN jobs.run_history_keys.idempotency_key IS 'Its idempotency key, if any.';
COMMENT ON COLUMN jobs.run_history_keys.unique_key IS 'Its unique key, if any.';
COMMENT ON COLUMN jobs.run_history_keys.created_at IS 'When it was created (unique_for counts from it).';
COMMENT ON COLUMN jobs.run_history_keys.finished_at IS 'When it finished: the partition key of jobs.run_history, so the one day to read it from.';

CREATE INDEX run_history_keys_idempotency_idx ON jobs.run_history_keys (kind, idempotency_key)
WHERE idempotency_key IS NOT NULL;
COMMENT ON INDEX jobs.run_history_keys_idempotency_idx IS
'A moved run by its idempotency key: an enqueue of the key returns it.';

CREATE INDEX run_history_keys_unique_idx ON jobs.run_history_keys (kind, unique_key, run_id)
WHERE unique_key IS NOT NULL;
COMMENT ON INDEX jobs.run_history_keys_unique_idx IS
'The moved runs of a unique key, newest last: an enqueue of a key kept ''ever'' returns the newest.';

CREATE INDEX run_history_keys_finished_idx ON jobs.run_history_keys (finished_at);
COMMENT ON INDEX jobs.run_history_keys_finished_idx IS
'The keys of a day of history: jobs.prune removes them with the day.';

INSERT INTO jobs.run_history_keys (run_id, kind, idempotency_key, unique_key, created_at, finished_at)
SELECT
    h.id,
    h.kind,
    h.idempotency_key,
    h.unique_key,
    h.created_at,
    h.finished_at
FROM jobs.run_history AS h
WHERE h.idempotency_key IS NOT NULL OR h.unique_key IS NOT NULL;
