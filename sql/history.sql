-- ===========================================================================
-- history.sql: finished runs leave jobs.runs for jobs.run_history, one partition per day.
--
-- jobs.runs holds the live runs (QUEUED, RUNNING) and the runs finished within
-- jobs.config.archive_after (default a day): the queue's indexes stay the size of that,
-- whatever the retention. The leader moves older finished runs in batches (jobs.archive),
-- each batch one transaction that deletes them from jobs.runs and inserts them into
-- jobs.run_history, so every run is in exactly one of the two at every snapshot. Retention
-- (jobs.prune) then drops whole days of history: no per-row work, whatever their size.
--
-- What holds across a run's whole life reads both tables (jobs.runs_all): a run by id
-- (show, cancel, retry, discard), retry chains and dependencies, idempotency keys and
-- unique keys kept `ever`, the occurrences a backfill skips, and the failure streak that
-- pauses a definition. Counts and lists of the console and the dashboard read jobs.runs:
-- the live runs and the recent history.
-- ===========================================================================

-- Every run, live or moved to history. The columns of jobs.runs whose bounds are domains
-- (jobs.run_kind...) are read as their base types, which jobs.run_history has: where the two
-- sides of a UNION ALL differ in type, PostgreSQL cannot plan it as one append of the two
-- tables, and every query of the view (a run by id, the newest runs) would read and sort both
-- whole tables instead of probing their indexes. The list is built from the catalog, so it
-- follows the columns that migrations add.
DO $$
BEGIN
    EXECUTE format(
        'CREATE OR REPLACE VIEW jobs.runs_all AS SELECT %s FROM jobs.runs UNION ALL SELECT * FROM jobs.run_history',
        (SELECT string_agg(CASE WHEN t.typtype = 'd'
                                THEN format('%1$I::%2$s AS %1$I', a.attname, format_type(t.typbasetype, t.typtypmod))
                                ELSE quote_ident(a.attname) END, ', ' ORDER BY a.attnum)
           FROM pg_catalog.pg_attribute AS a
           JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid
          WHERE a.attrelid = 'jobs.runs'::regclass AND a.attnum > 0 AND NOT a.attisdropped));
END $$;
COMMENT ON VIEW jobs.runs_all IS 'Every run: jobs.runs (live runs and recent history) and jobs.run_history (finished runs older than jobs.config.archive_after). Each run is in exactly one of them.';

-- The partition of history that holds the runs finished on a UTC day.
CREATE OR REPLACE FUNCTION jobs._history_partition_name(day date) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'run_history_' || to_char(day, 'YYYYMMDD')
$$;
COMMENT ON FUNCTION jobs._history_partition_name(date) IS 'Private: the name (in schema jobs) of the history partition for runs finished on that UTC day.';

-- Create the history partitions of these UTC days that do not exist yet.
CREATE OR REPLACE FUNCTION jobs._history_partitions(days date[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_day date;
    v_name text;
BEGIN
    FOREACH v_day IN ARRAY days LOOP
        v_name := jobs._history_partition_name(v_day);
        CONTINUE WHEN to_regclass(format('jobs.%I', v_name)) IS NOT NULL;
        -- Two sessions archiving at once (the leader and an operator) create each day once, and
        -- one session at a time: the ATTACH below holds its lock on jobs.run_history to commit,
        -- so with a lock per day two sessions could each make a day and wait for the other's.
        PERFORM pg_advisory_xact_lock(hashtextextended('history partitions', 0));
        -- A statement (an expression would read the catalog as it was before the wait): it
        -- sees a day another session made and committed while this one waited.
        PERFORM FROM pg_catalog.pg_class AS c
         WHERE c.relnamespace = 'jobs'::regnamespace AND c.relname = v_name;
        CONTINUE WHEN FOUND;
        -- Made apart, then attached: CREATE TABLE ... PARTITION OF would lock jobs.run_history
        -- against every reader, ATTACH takes a lock that readers and writers pass.
        EXECUTE format('CREATE TABLE jobs.%I (LIKE jobs.run_history INCLUDING ALL)', v_name);
        EXECUTE format('COMMENT ON TABLE jobs.%I IS %L', v_name,
                       format('The runs finished on %s (UTC), moved out of jobs.runs. jobs.prune drops it whole.',
                              to_char(v_day, 'YYYY-MM-DD')));
        -- The bounds as ISO 8601 text in UTC, whatever the session's DateStyle and TimeZone: a
        -- timestamptz written as text in the session's style may carry a zone abbreviation that
        -- reads back as another zone (IST, CST), and the day would be attached at other bounds.
        EXECUTE format('ALTER TABLE jobs.run_history ATTACH PARTITION jobs.%I FOR VALUES FROM (%L) TO (%L)',
                       v_name, to_char(v_day, 'YYYY-MM-DD') || ' 00:00:00+00',
                       to_char(v_day + 1, 'YYYY-MM-DD') || ' 00:00:00+00');
    END LOOP;
END $$;
COMMENT ON FUNCTION jobs._history_partitions(date[]) IS 'Private: create the partitions of jobs.run_history for these UTC days of finished_at that are missing.';

-- The days of history that lie wholly before a cutoff: what jobs.prune drops.
CREATE OR REPLACE FUNCTION jobs._history_days_before(cutoff timestamptz) RETURNS TABLE (day date, part regclass)
LANGUAGE sql STABLE AS $$
    SELECT p.day, p.part
      -- The CASE keeps to_date off other names: the planner may test the day on every
      -- relation before the join picks the partitions, and a partition attached by hand
      -- under another name is never dropped.
      FROM (SELECT CASE WHEN c.relname ~ '^run_history_[0-9]{8}$'
                        THEN to_date(right(c.relname, 8), 'YYYYMMDD') END AS day,
                   c.oid::regclass AS part
              FROM pg_inherits AS i
              JOIN pg_class AS c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'jobs.run_history'::regclass) AS p
     WHERE (p.day + 1)::timestamp AT TIME ZONE 'UTC' <= cutoff
     ORDER BY p.day
$$;
COMMENT ON FUNCTION jobs._history_days_before(timestamptz) IS 'Private: the partitions of jobs.run_history whose whole UTC day lies before cutoff, oldest first.';

-- A run in history, read from its own day (finished_at is its partition key): the statement is
-- planned for the values given, so only that day and its indexes are opened and locked, not
-- every day of history. NULL fields when it is not there.
CREATE OR REPLACE FUNCTION jobs._moved_run(run_id bigint, finished_at timestamptz) RETURNS jobs.runs
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_run jobs.runs;
BEGIN
    PERFORM jobs._check_history_keys(_moved_run.run_id, _moved_run.finished_at);
    EXECUTE 'SELECT h.* FROM jobs.run_history AS h WHERE h.id = $1 AND h.finished_at = $2'
       INTO v_run USING _moved_run.run_id, _moved_run.finished_at;
    RETURN v_run;
END $$;
COMMENT ON FUNCTION jobs._moved_run(bigint, timestamptz) IS 'Private: the run with this id in jobs.run_history, read from the day of finished_at alone (all NULL when it is not there).';

-- The run of an idempotency key in history, found by its key (jobs.run_history_keys) and read
-- from its day alone; NULL fields when the key has no run there.
CREATE OR REPLACE FUNCTION jobs._moved_run_of_key(kind text, idempotency_key text) RETURNS jobs.runs
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_id bigint;
    v_at timestamptz;
    v_run jobs.runs;
BEGIN
    SELECT k.run_id, k.finished_at INTO v_id, v_at
      FROM jobs.run_history_keys AS k
     WHERE k.kind = _moved_run_of_key.kind AND k.idempotency_key = _moved_run_of_key.idempotency_key
     LIMIT 1;
    IF v_id IS NOT NULL THEN
        v_run := jobs._moved_run(v_id, v_at);
    END IF;
    RETURN v_run;
END $$;
COMMENT ON FUNCTION jobs._moved_run_of_key(text, text) IS 'Private: the run in jobs.run_history with this kind and idempotency key, read from its day alone (all NULL when there is none).';

-- Lock up to batch_size runs of jobs.runs that finished before cutoff, oldest first, passing
-- over runs another transaction holds: the batch jobs.archive moves and jobs.prune deletes.
DROP FUNCTION IF EXISTS jobs._lock_finished_before(timestamptz, integer);
CREATE OR REPLACE FUNCTION jobs._lock_finished_before(
    cutoff timestamptz, batch_size integer, passing_over bigint[] DEFAULT '{}'
)
RETURNS TABLE (run_id bigint, finished_at timestamptz)
LANGUAGE sql VOLATILE AS $$
    SELECT r.id, r.finished_at FROM jobs.runs AS r
     WHERE r.finished_at < cutoff AND r.id <> ALL (passing_over)
     ORDER BY r.finished_at
     LIMIT batch_size
       FOR UPDATE SKIP LOCKED
$$;
COMMENT ON FUNCTION jobs._lock_finished_before(timestamptz, integer, bigint[]) IS 'Private: lock (FOR UPDATE SKIP LOCKED) and return up to batch_size runs of jobs.runs finished before cutoff, oldest first, but for those in passing_over.';

-- Move up to batch_size runs finished more than jobs.config.archive_after ago from jobs.runs
-- to jobs.run_history, oldest first; returns how many. The leader calls it while it returns
-- batch_size. A run locked by another transaction (a retry or an enqueue naming it) waits for
-- the next batch.
CREATE OR REPLACE FUNCTION jobs.archive(batch_size integer DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_after interval := (SELECT c.archive_after FROM jobs.config AS c);
    v_ids bigint[];
    v_days date[];
    v_count bigint;
BEGIN
    PERFORM jobs._check_range('batch_size', archive.batch_size, 1, 1000000);
    IF v_after IS NULL THEN
        RETURN 0;
    END IF;
    -- First the lock the INSERT below takes anyway: a prune dropping a day holds ACCESS
    -- EXCLUSIVE on jobs.run_history until it commits, so this waits for it, and the partitions
    -- found next are those left after it (a day it dropped is made again), not a dropped one.
    LOCK TABLE ONLY jobs.run_history IN ROW EXCLUSIVE MODE;
    -- archive_after as elapsed time, as jobs.prune counts the retention, whatever the TimeZone.
    -- A run finished at -infinity or before the year 1 (written by hand) has no day to be filed
    -- under (a day's name and bounds carry no era: a BC day would be made as the AD day of the
    -- same digits, and its run fit none): it stays in jobs.runs, where the prune deletes it, and
    -- the runs behind it move.
    SELECT array_agg(v.run_id), array_agg(DISTINCT (v.finished_at AT TIME ZONE 'UTC')::date)
      INTO v_ids, v_days
      FROM jobs._lock_finished_before(now() - make_interval(secs => extract(EPOCH FROM v_after)),
                                      archive.batch_size) AS v
     WHERE isfinite(v.finished_at) AND v.finished_at >= '0001-01-01 00:00:00+00';
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM jobs._history_partitions(v_days);
    WITH moved AS (
        DELETE FROM jobs.runs AS r WHERE r.id = ANY (v_ids) RETURNING r.*
    ),
    keys AS (   -- the keys of those that have one (jobs.run_history_keys), in the same move
        INSERT INTO jobs.run_history_keys (run_id, kind, idempotency_key, unique_key, created_at, finished_at)
        SELECT m.id, m.kind, m.idempotency_key, m.unique_key, m.created_at, m.finished_at
          FROM moved AS m
         WHERE m.idempotency_key IS NOT NULL OR m.unique_key IS NOT NULL
    )
    INSERT INTO jobs.run_history SELECT * FROM moved;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END $$;
COMMENT ON FUNCTION jobs.archive(integer) IS 'Move up to batch_size runs finished more than jobs.config.archive_after ago from jobs.runs to jobs.run_history (oldest first, one transaction); returns how many. Call again while it returns batch_size. 0 when archive_after is NULL.';
