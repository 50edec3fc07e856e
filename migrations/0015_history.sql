-- pgtick 0015: finished runs move to a history partitioned by day, so the queue's table stays
-- the size of its live runs and recent history, and retention drops whole days.
-- * jobs.config.archive_after: how long a finished run stays in jobs.runs (NULL: always).
-- * jobs.run_history: the runs moved out of jobs.runs, same columns in the same order,
--   partitioned by range on finished_at, one partition per UTC day (created as runs arrive).
-- Every column added to jobs.runs from here on is added to jobs.run_history as well.

ALTER TABLE jobs.config
ADD COLUMN archive_after interval DEFAULT '1 day'
CONSTRAINT config_archive_after_check CHECK (archive_after BETWEEN '1 hour' AND '3660 days');
COMMENT ON COLUMN jobs.config.archive_after IS
'How long a finished run stays in jobs.runs before the leader moves it to jobs.run_history (NULL: never moved).';

CREATE TABLE jobs.run_history (LIKE jobs.runs INCLUDING COMMENTS) PARTITION BY RANGE (finished_at);
ALTER TABLE jobs.run_history ALTER COLUMN finished_at SET NOT NULL;
COMMENT ON TABLE jobs.run_history IS
'Finished runs older than jobs.config.archive_after, moved out of jobs.runs: the same columns, one partition per UTC day of finished_at (jobs.run_history_YYYYMMDD). jobs.prune drops whole days. jobs.runs_all reads both.';

-- What reads history by key: a run by id, the next attempt of a run, a definition's runs,
-- and the idempotency and unique keys that hold across a run's whole life.
CREATE INDEX run_history_id_idx ON jobs.run_history (id);
CREATE INDEX run_history_retry_of_idx ON jobs.run_history (retry_of)
WHERE retry_of IS NOT NULL;
CREATE INDEX run_history_definition_idx ON jobs.run_history (definition_id, id)
WHERE definition_id IS NOT NULL;
CREATE INDEX run_history_idempotency_idx ON jobs.run_history (kind, idempotency_key)
WHERE idempotency_key IS NOT NULL;
CREATE INDEX run_history_unique_idx ON jobs.run_history (kind, unique_key, id)
WHERE unique_key IS NOT NULL;
