-- pgtick 0018: less for PostgreSQL to read back at every UPDATE of jobs.runs.
-- Each UPDATE (a claim, a completion, a heartbeat) reads every table CHECK constraint of
-- jobs.runs, and the WHEN of every row trigger on UPDATE, back from the node text stored in
-- the catalog and prepares it again, whatever columns it changes: about a third of the
-- server's CPU for a one-row UPDATE, most of it parsing that text. So:
-- * The size of depends_on is the domain jobs.run_depends_on, whose constraint keeps the
--   name runs_depends_on_check: it is checked only where depends_on is written, from an
--   expression the server keeps (as migration 0016 did for the other bounds of a run's own
--   fields). The GIN index over depends_on serves the domain as it served the array.
-- * runs_finished_have_time reads "the status sorts after RUNNING" instead of listing the
--   three final statuses (a constant array, long to read back). jobs.run_status sorts
--   QUEUED, RUNNING, then the final COMPLETED, FAILED, CANCELLED; every stored row passed the
--   old form, which says the same, so the new one is added NOT VALID (no scan under lock).
-- * The pause-after-failures trigger is dropped here; sql/schedule_controls.sql creates it
--   again with the shorter WHEN (status = 'FAILED') and its function tests the rest.
-- The views that read depends_on (and those over them) are dropped first (a column a view
-- reads cannot change type); the function files that follow every migration create them again.

DO $$
DECLARE
    v_view oid;
BEGIN
    FOR v_view IN
        SELECT DISTINCT rw.ev_class
          FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_rewrite AS rw ON rw.oid = d.objid
          JOIN pg_catalog.pg_attribute AS a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
         WHERE d.refobjid = 'jobs.runs'::regclass AND a.attname = 'depends_on'
           AND rw.ev_class <> 'jobs.runs'::regclass
    LOOP
        IF EXISTS (SELECT FROM pg_catalog.pg_class AS c WHERE c.oid = v_view) THEN  -- (or gone in a cascade)
            EXECUTE format('DROP VIEW %s CASCADE', v_view::regclass);
        END IF;
    END LOOP;
END $$;

CREATE DOMAIN jobs.run_depends_on AS bigint[];
COMMENT ON DOMAIN jobs.run_depends_on IS 'jobs.runs.depends_on: 1 to 1000 run ids.';
ALTER TABLE jobs.runs
ALTER COLUMN depends_on TYPE jobs.run_depends_on,
DROP CONSTRAINT runs_depends_on_check,
DROP CONSTRAINT runs_finished_have_time;
ALTER DOMAIN jobs.run_depends_on
ADD CONSTRAINT runs_depends_on_check CHECK (cardinality(value) BETWEEN 1 AND 1000) NOT VALID;
ALTER TABLE jobs.runs
ADD CONSTRAINT runs_finished_have_time CHECK ((status > 'RUNNING') = (finished_at IS NOT NULL)) NOT VALID;

DROP TRIGGER IF EXISTS runs_pause_after_failures ON jobs.runs;
