-- pgtick 0009: a schedule change takes effect at the instant it is made.
-- * jobs.definitions.cursor_from: where a reset cursor starts. jobs.define sets it when the
--   schedule, zone, DST policy or one-shot time changes (and jobs.resume when a paused
--   definition resumes); the scheduler initializes the cursor from it rather than from the
--   moment its next tick happens to run, so an occurrence between the change and that tick
--   is neither lost nor materialized twice. NULL (a new definition): the scheduler's now.

ALTER TABLE jobs.definitions ADD COLUMN cursor_from timestamptz;
COMMENT ON COLUMN jobs.definitions.cursor_from IS
'Where a reset cursor (next_run_at NULL) starts: the instant the schedule last changed or the definition resumed; NULL = the scheduler''s now (a new definition).';
