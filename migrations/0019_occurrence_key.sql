-- pgtick 0019: a scheduled run is unique per occurrence, not per start time.
-- With a jitter, two occurrences of one definition can start in the same second (12:39 delayed
-- 19:36 and 12:40 delayed 18:36 both start at 12:58:36). Keyed by its start, the second
-- occurrence's run was taken for the first one's and never inserted. Keyed by the occurrence
-- (occurrence_at; a run materialized before migration 0014 has none, and keeps its start as
-- its key), every occurrence gets its run once, however they are jittered.

DO $$
DECLARE
    v_duplicate text;
BEGIN
    SELECT format('definition %s, occurrence %s', r.definition_id, coalesce(r.occurrence_at, r.scheduled_for))
      INTO v_duplicate
      FROM jobs.runs AS r
     WHERE r.origin = 'schedule'
     GROUP BY r.definition_id, coalesce(r.occurrence_at, r.scheduled_for)
    HAVING count(*) > 1
     LIMIT 1;
    IF v_duplicate IS NOT NULL THEN
        RAISE EXCEPTION 'jobs.runs holds two scheduled first attempts of one occurrence (%)', v_duplicate
            USING ERRCODE = '23505',
                  HINT = 'Delete the one that should not run, then apply the migration again.';
    END IF;
END $$;

DROP INDEX jobs.runs_occurrence_uniq;
-- Exactly-once materialization: one first attempt per definition and occurrence.
CREATE UNIQUE INDEX runs_occurrence_uniq ON jobs.runs (definition_id, (coalesce(occurrence_at, scheduled_for)))
WHERE origin = 'schedule';
COMMENT ON INDEX jobs.runs_occurrence_uniq IS
'One scheduled first attempt per definition and occurrence (occurrence_at, or the start of a run materialized before occurrences were recorded).';
