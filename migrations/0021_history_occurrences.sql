-- pgtick 0021: the occurrences in history, indexed.
-- The scheduler materializes an occurrence at most once: jobs.runs holds that by its
-- occurrence index, and an occurrence older than now is also looked up in history, where its
-- run may have moved (a backfilled window run and archived while the cursor still lay behind
-- it). This index makes that lookup one probe per day of history it may lie in.

CREATE INDEX run_history_occurrence_idx ON jobs.run_history (definition_id, (coalesce(occurrence_at, scheduled_for)))
WHERE origin = 'schedule';
COMMENT ON INDEX jobs.run_history_occurrence_idx IS
'The scheduled first attempts in history by definition and occurrence: a past occurrence whose run was archived is not materialized again.';
