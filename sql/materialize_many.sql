-- ===========================================================================
-- materialize_many.sql: materializing many definitions at once.
--
-- The leader plans a batch of definitions in the driver and hands it over in
-- one call: a compare-and-set on every cursor plus every run insert in one
-- set-based statement. When the database refuses one definition's runs (an
-- operator's trigger, a constraint, a refused value), the statement is
-- retried one definition at a time, each in its own savepoint, so the
-- failure stays with that definition: it is recorded (materialize_error,
-- materialize_failures) and backed off (materialize_retry_at), its cursor
-- stays where it was, and the others are materialized. The common path pays
-- one savepoint per batch, nothing per definition.
-- ===========================================================================

-- Private: the set-based compare-and-set plus inserts for the given definitions
-- (each run in its definition's queue, with its concurrency key, delayed by its jitter, and
-- none for an occurrence whose run is in history, as jobs._insert_occurrences does; the
-- caller first takes jobs._hold_history_moves).
-- Rows another transaction holds are skipped (stale for now, planned again next tick),
-- so two leaders never wait on each other; locks are taken in id order.
CREATE OR REPLACE FUNCTION jobs._materialize_set(
    definition_ids bigint[], expected_next_run_ats timestamptz[], new_next_run_ats timestamptz[],
    expected_revisions integer[], run_definition_ids bigint[], run_times timestamptz[]
)
RETURNS TABLE (definition_id bigint, created integer, earliest timestamptz)
LANGUAGE sql VOLATILE AS $$
    WITH input AS (
        SELECT i.id, i.expected, i.new_next, i.revision
          FROM unnest(definition_ids, expected_next_run_ats, new_next_run_ats, expected_revisions)
               AS i (id, expected, new_next, revision)
    ),
    locked AS (
        SELECT d.id, i.new_next
          FROM jobs.definitions AS d
          JOIN input AS i ON i.id = d.id
         WHERE d.next_run_at IS NOT DISTINCT FROM i.expected
           AND (i.revision IS NULL OR d.revision = i.revision)
           AND d.schedule IS NOT NULL AND d.enabled AND d.finished_at IS NULL
         ORDER BY d.id
           FOR NO KEY UPDATE OF d SKIP LOCKED
    ),
    advanced AS (
        UPDATE jobs.definitions AS d
           SET next_run_at = l.new_next,
               finished_at = CASE WHEN l.new_next IS NULL THEN now() END,
               materialize_error = NULL,
               materialize_failures = 0,
               materialize_retry_at = NULL
          FROM locked AS l
         WHERE d.id = l.id
        RETURNING d.id, d.kind, d.payload, d.priority, d.max_attempts, d.timeout, d.heartbeat_timeout,
                  d.jitter, d.queue, d.concurrency_key
    ),
    inserted AS (
        INSERT INTO jobs.runs (
            definition_id, kind, payload, priority, max_attempts, timeout, heartbeat_timeout,
            origin, queue, concurrency_key, scheduled_for, occurrence_at
        )
        SELECT a.id, a.kind, a.payload, a.priority, a.max_attempts, a.timeout, a.heartbeat_timeout,
               'schedule', a.queue, a.concurrency_key, t.at + jobs.jitter_offset(a.id, t.at, a.jitter), t.at
          FROM advanced AS a
          JOIN unnest(run_definition_ids, run_times) AS t (id, at) ON t.id = a.id
         WHERE NOT jobs._archived_occurrence(a.id, t.at)
         ORDER BY t.at, a.id
        ON CONFLICT (definition_id, (coalesce(occurrence_at, scheduled_for))) WHERE origin = 'schedule' DO NOTHING
        RETURNING jobs.runs.definition_id, jobs.runs.scheduled_for
    )
    SELECT a.id, count(n.definition_id)::integer, min(n.scheduled_for)
      FROM advanced AS a
      LEFT JOIN inserted AS n ON n.definition_id = a.id
     GROUP BY a.id
$$;
COMMENT ON FUNCTION jobs._materialize_set(bigint[], timestamptz[], timestamptz[], integer[], bigint[], timestamptz[]) IS 'Private: compare-and-set the cursors and insert the runs of many definitions in one statement; one row per definition advanced (runs created, earliest run).';

-- Private: record that a definition's runs could not be inserted, and back it off.
CREATE OR REPLACE FUNCTION jobs._materialize_failed(definition_id bigint, message text) RETURNS void
LANGUAGE sql VOLATILE AS $$
    UPDATE jobs.definitions AS d
       SET materialize_error = left(message, 2000),
           materialize_failures = d.materialize_failures + 1,
           -- 1 s, 2 s, 4 s ... up to 5 minutes between attempts.
           materialize_retry_at = now() + least(
               interval '1 second' * power(2, least(d.materialize_failures, 16)), interval '5 minutes'
           )
     WHERE d.id IN (
               -- A row another leader holds is that leader's to record: never wait for it.
               SELECT f.id FROM jobs.definitions AS f WHERE f.id = definition_id FOR NO KEY UPDATE SKIP LOCKED
           )
$$;
COMMENT ON FUNCTION jobs._materialize_failed(bigint, text) IS 'Private: store why a definition''s run inserts failed, count the failure and set the backoff (1 s doubling, at most 5 minutes).';

-- Compare-and-set many cursors and insert their runs in one statement; a refused definition is isolated.
-- Whether an error's SQLSTATE is the server's trouble rather than something wrong with what a
-- statement was given: insufficient resources (53), operator intervention (57, a statement or
-- lock timeout among them), system errors (58), internal errors (XX), transaction rollbacks
-- (40: a deadlock or a serialization failure), connection exceptions (08), and a lock not
-- available (55P03, lock_timeout).
CREATE OR REPLACE FUNCTION jobs._server_trouble(sqlstate text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT left(_server_trouble.sqlstate, 2) IN ('53', '57', '58', 'XX', '40', '08') OR _server_trouble.sqlstate = '55P03' $$;
COMMENT ON FUNCTION jobs._server_trouble(text) IS 'Private: whether a SQLSTATE is the server''s trouble (resources, timeouts, deadlocks, serialization, connection, internal) rather than bad input.';

CREATE OR REPLACE FUNCTION jobs.materialize_many(
    definition_ids bigint[],
    expected_next_run_ats timestamptz[],
    new_next_run_ats timestamptz[],
    expected_revisions integer[],
    run_definition_ids bigint[],
    run_times timestamptz[]
)
RETURNS TABLE (definition_id bigint, created integer, error text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_n integer := coalesce(cardinality(materialize_many.definition_ids), 0);
    v_bad bigint[];
    v_errors text[];
    v_ids bigint[];
    v_created integer[];
    v_earliest timestamptz;
    v_id bigint;
    v_row record;
    v_message text;
    v_state text;
BEGIN
    IF materialize_many.definition_ids IS NULL OR materialize_many.run_definition_ids IS NULL
       OR materialize_many.run_times IS NULL THEN
        RAISE EXCEPTION 'definition_ids, run_definition_ids and run_times must not be NULL'
            USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_range('definition_ids length', v_n, 0, 10000);
    PERFORM jobs._check_range('run_times length', cardinality(materialize_many.run_times), 0, 100000);
    IF coalesce(cardinality(materialize_many.expected_next_run_ats), 0) <> v_n
       OR coalesce(cardinality(materialize_many.new_next_run_ats), 0) <> v_n
       OR coalesce(cardinality(materialize_many.expected_revisions), 0) <> v_n
       OR cardinality(materialize_many.run_definition_ids) <> cardinality(materialize_many.run_times) THEN
        RAISE EXCEPTION 'definition_ids, expected_next_run_ats, new_next_run_ats and expected_revisions must have one element per definition, run_definition_ids one per run time'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT FROM unnest(materialize_many.definition_ids) AS i (id)
                GROUP BY i.id HAVING i.id IS NULL OR count(*) > 1) THEN
        RAISE EXCEPTION 'definition_ids must be distinct and not NULL' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT FROM unnest(materialize_many.run_definition_ids) AS t (id)
                WHERE t.id IS NULL OR t.id <> ALL (materialize_many.definition_ids)) THEN
        RAISE EXCEPTION 'run_definition_ids must name definitions of this batch' USING ERRCODE = '22023';
    END IF;

    -- A definition whose own values are refused (times outside its window, an infinite cursor)
    -- is recorded as failing; the rest of the batch goes on.
    SELECT array_agg(DISTINCT i.id) INTO v_bad
      FROM unnest(materialize_many.definition_ids, materialize_many.expected_next_run_ats,
                  materialize_many.new_next_run_ats) AS i (id, expected, new_next)
      LEFT JOIN unnest(materialize_many.run_definition_ids, materialize_many.run_times) AS t (id, at)
        ON t.id = i.id
     -- (jobs._instant_problem's bounds, as expressions: no function call per run time)
     WHERE i.new_next < i.expected
        OR i.expected < '0001-01-02 00:00:00+00' OR i.expected >= '9999-12-31 00:00:00+00'
        OR i.new_next < '0001-01-02 00:00:00+00' OR i.new_next >= '9999-12-31 00:00:00+00'
        OR (t.id IS NOT NULL AND (t.at IS NULL
                                  OR t.at < '0001-01-02 00:00:00+00' OR t.at >= '9999-12-31 00:00:00+00'
                                  OR t.at < i.expected OR t.at >= i.new_next));
    v_bad := coalesce(v_bad, '{}');
    FOREACH v_id IN ARRAY v_bad LOOP
        v_message := 'run_times must be finite, from 0001-01-02 to 9999-12-30 UTC, and within [expected_next_run_at, new_next_run_at), and the cursors from 0001-01-02 to 9999-12-30 UTC, new_next_run_at not before expected_next_run_at (SQLSTATE 22023)';
        PERFORM jobs._materialize_failed(v_id, v_message);
        v_errors := v_errors || v_message;
    END LOOP;
    -- A definition holding a blank concurrency key from before such keys were refused can have
    -- no run (the runs' key refuses it): recorded as failing, saying which key, before the batch
    -- (which would otherwise take the slow path below for it, every time it is retried).
    FOR v_id, v_message IN
        SELECT d.id, jobs._blank_key_problem(d.name, d.concurrency_key) || ' (SQLSTATE 22023)'
          FROM jobs.definitions AS d
         WHERE d.id = ANY (materialize_many.definition_ids) AND d.id <> ALL (v_bad)
           AND jobs._blank_key(d.concurrency_key)
         ORDER BY d.id
    LOOP
        PERFORM jobs._materialize_failed(v_id, v_message);
        v_bad := v_bad || v_id;
        v_errors := v_errors || v_message;
    END LOOP;

    PERFORM jobs._hold_history_moves(materialize_many.run_times);
    -- Common path: the whole batch in one statement (one savepoint).
    BEGIN
        SELECT array_agg(s.definition_id), array_agg(s.created), min(s.earliest)
          INTO v_ids, v_created, v_earliest
          FROM jobs._materialize_set(
                   array(SELECT x FROM unnest(materialize_many.definition_ids) AS x WHERE x <> ALL (v_bad)),
                   array(SELECT e FROM unnest(materialize_many.definition_ids, materialize_many.expected_next_run_ats)
                                  AS u (x, e) WHERE u.x <> ALL (v_bad)),
                   array(SELECT e FROM unnest(materialize_many.definition_ids, materialize_many.new_next_run_ats)
                                  AS u (x, e) WHERE u.x <> ALL (v_bad)),
                   array(SELECT e FROM unnest(materialize_many.definition_ids, materialize_many.expected_revisions)
                                  AS u (x, e) WHERE u.x <> ALL (v_bad)),
                   materialize_many.run_definition_ids,
                   materialize_many.run_times
               ) AS s;
    EXCEPTION WHEN OTHERS THEN
        -- The server's trouble (out of resources, a lock or statement timeout, a deadlock or
        -- serialization failure, a lost connection) is no definition's: the call fails, and the
        -- leader's next tick tries the batch again, rather than one definition taking the blame
        -- and a backoff.
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE;
        IF jobs._server_trouble(v_state) THEN
            RAISE;
        END IF;
        -- Something in the batch was refused: one savepoint per definition finds it.
        v_ids := '{}';
        v_created := '{}';
        v_earliest := NULL;
        FOR v_row IN
            SELECT i.id, i.expected, i.new_next, i.revision
              FROM unnest(materialize_many.definition_ids, materialize_many.expected_next_run_ats,
                          materialize_many.new_next_run_ats, materialize_many.expected_revisions)
                   AS i (id, expected, new_next, revision)
             WHERE i.id <> ALL (v_bad)
             ORDER BY i.id
        LOOP
            BEGIN
                FOR v_id, v_message IN
                    SELECT s.definition_id, s.created::text || '|' || coalesce(s.earliest::text, '')
                      FROM jobs._materialize_set(
                               ARRAY[v_row.id], ARRAY[v_row.expected], ARRAY[v_row.new_next],
                               ARRAY[v_row.revision],
                               array(SELECT t.id FROM unnest(materialize_many.run_definition_ids) AS t (id)
                                      WHERE t.id = v_row.id),
                               array(SELECT t.at FROM unnest(materialize_many.run_definition_ids,
                                                             materialize_many.run_times) AS t (id, at)
                                      WHERE t.id = v_row.id)
                           ) AS s
                LOOP
                    v_ids := v_ids || v_id;
                    v_created := v_created || split_part(v_message, '|', 1)::integer;
                    IF split_part(v_message, '|', 2) <> '' THEN
                        v_earliest := least(v_earliest, split_part(v_message, '|', 2)::timestamptz);
                    END IF;
                END LOOP;
            EXCEPTION WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT, v_state = RETURNED_SQLSTATE;
                IF jobs._server_trouble(v_state) THEN
                    RAISE;
                END IF;
                v_message := format('%s (SQLSTATE %s)', v_message, v_state);
                PERFORM jobs._materialize_failed(v_row.id, v_message);
                v_bad := v_bad || v_row.id;
                v_errors := v_errors || v_message;
            END;
        END LOOP;
    END;

    IF v_earliest IS NOT NULL THEN
        -- Workers wake at once, or re-arm their timer for the earliest new run (epoch seconds).
        PERFORM pg_notify('jobs', extract(EPOCH FROM v_earliest)::text);
    END IF;
    RETURN QUERY
        SELECT u.id, u.n, NULL::text FROM unnest(v_ids, v_created) AS u (id, n)
        UNION ALL
        SELECT b.id, 0, b.message FROM unnest(v_bad, v_errors) AS b (id, message);
END $$;
COMMENT ON FUNCTION jobs.materialize_many(bigint[], timestamptz[], timestamptz[], integer[], bigint[], timestamptz[]) IS 'Leader: for each definition whose cursor still equals its expected_next_run_at (and revision), move the cursor to its new_next_run_at and insert its runs (run_definition_ids/run_times pairs), all in one statement. A definition whose runs the database refuses is isolated: recorded in materialize_error, backed off, cursor unchanged; the rest are materialized. Returns one row per definition advanced (runs created) or refused (error); stale definitions are absent.';
