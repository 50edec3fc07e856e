-- pgtick 0014: a scheduled run knows the occurrence it was made for.
-- * jobs.runs.occurrence_at: the occurrence (before its jitter) of a run materialized from a
--   schedule. A schedule change drops the runs materialized ahead for occurrences at or after
--   the instant the new schedule takes over, whatever their jittered start, and keeps those of
--   earlier occurrences that start after the change.
-- Runs materialized before this migration have none; for them a change keeps the rule it had
-- (dropped when it starts later than the change plus the old jitter).

ALTER TABLE jobs.runs ADD COLUMN occurrence_at timestamptz;
COMMENT ON COLUMN jobs.runs.occurrence_at IS
'For a run materialized from a schedule, and its retries: the occurrence it is for, before the definition''s jitter (a first attempt''s scheduled_for = occurrence_at + jobs.jitter_offset). NULL for other runs.';
