-- pgtick 0016: the bounds of a run's own fields move from table CHECK constraints of jobs.runs
-- to domains, one per column (jobs.run_<column>), whose constraints keep the old names.
-- Every UPDATE of jobs.runs (a claim, a completion, a heartbeat) re-read and re-planned each
-- table CHECK constraint, whatever columns it changed: with seventeen of them, about a tenth of
-- the server's CPU in a claim-and-complete loop. A domain's constraint is checked only where a
-- value of the column is written, from a plan the server keeps, so a status change checks only
-- the four rules left on the table (the three that tie columns together, and the size of
-- depends_on, an array under a GIN index). A direct write out of bounds is refused as before:
-- 23514, naming the same constraint (runs_kind_check...).
-- Each domain's bound is the table constraint's own expression with the column read as VALUE,
-- so the bounds cannot drift. The domains are created empty, the columns moved onto them in
-- one ALTER TABLE (no table rewrite: the values stay as they are; the indexes over them are
-- rebuilt), then the constraints are added NOT VALID: every stored value passed that check.
-- The views over jobs.runs are dropped first (a column a view reads cannot change type); the
-- function files that follow every migration create them again.

DROP VIEW IF EXISTS
jobs.queues,
jobs.queue_stats,
jobs.blocked,
jobs.definition_health,
jobs.kinds_without_worker,
jobs.run_list,
jobs.running,
jobs.runs_all,
jobs.schedule_backlog,
jobs.workers,
jobs._claimable;

DO $$
DECLARE
    v_columns text[];
    v_abouts text[];
    v_bases text[];
    v_bounds text[];
    v_alter text;
    i integer;
BEGIN
    SELECT array_agg(b.col ORDER BY b.n), array_agg(b.about ORDER BY b.n),
           array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY b.n),
           array_agg(regexp_replace(pg_get_constraintdef(c.oid), '\m' || b.col || '\M', 'VALUE', 'g')
                     ORDER BY b.n)
      INTO v_columns, v_abouts, v_bases, v_bounds
      FROM (VALUES (1, 'kind', '1 to 200 characters'),
                   (2, 'payload', 'a JSON object'),
                   (3, 'attempt', '1 for the first attempt'),
                   (4, 'max_attempts', '1 to 1000'),
                   (5, 'priority', '-1000 to 1000'),
                   (6, 'origin', 'schedule, manual or retry'),
                   (7, 'failure_reason', 'Error, HeartbeatLost, Orphaned, Timeout, Skipped or DependencyFailed'),
                   (8, 'idempotency_key', '1 to 200 characters'),
                   (9, 'timeout', '1 second to 366 days'),
                   (10, 'heartbeat_timeout', '100 milliseconds to 366 days'),
                   (11, 'queue', '1 to 200 characters'),
                   (12, 'concurrency_key', '1 to 200 characters'),
                   (13, 'unique_key', '1 to 200 characters')) AS b (n, col, about)
      JOIN pg_attribute AS a ON a.attrelid = 'jobs.runs'::regclass AND a.attname = b.col
      JOIN pg_constraint AS c ON c.conrelid = 'jobs.runs'::regclass AND c.conname = 'runs_' || b.col || '_check';
    IF cardinality(v_columns) IS DISTINCT FROM 13 THEN
        RAISE EXCEPTION 'jobs.runs lacks a column or its CHECK constraint among the 13 bounded fields (found %)',
            v_columns;
    END IF;
    v_alter := 'ALTER TABLE jobs.runs';
    FOR i IN 1 .. 13 LOOP
        EXECUTE format('CREATE DOMAIN jobs.%I AS %s', 'run_' || v_columns[i], v_bases[i]);
        EXECUTE format('COMMENT ON DOMAIN jobs.%I IS %L', 'run_' || v_columns[i],
                       format('jobs.runs.%s: %s.', v_columns[i], v_abouts[i]));
        v_alter := v_alter || CASE WHEN i > 1 THEN ',' ELSE '' END
                   || format(' ALTER COLUMN %I TYPE jobs.%I, DROP CONSTRAINT %I',
                             v_columns[i], 'run_' || v_columns[i], 'runs_' || v_columns[i] || '_check');
    END LOOP;
    EXECUTE v_alter;
    FOR i IN 1 .. 13 LOOP
        EXECUTE format('ALTER DOMAIN jobs.%I ADD CONSTRAINT %I %s NOT VALID',
                       'run_' || v_columns[i], 'runs_' || v_columns[i] || '_check', v_bounds[i]);
    END LOOP;
END $$;
