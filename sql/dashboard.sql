-- ===========================================================================
-- dashboard.sql: operator actions the web dashboard needs beyond the single-run
-- and single-definition functions (jobs.cancel, jobs.retry, jobs.run_now,
-- jobs.pause, jobs.resume), and the audit log every action writes to.
-- ===========================================================================

-- Record an operator action in jobs.audit_log; returns the entry id.
CREATE OR REPLACE FUNCTION jobs.audit(actor text, action text, target text DEFAULT NULL, detail jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_id bigint;
BEGIN
    PERFORM jobs._check_text('actor', audit.actor, 200);
    PERFORM jobs._check_text('action', audit.action, 100);
    IF audit.target IS NOT NULL AND length(audit.target) > 1000 THEN
        RAISE EXCEPTION 'target is % characters long; the limit is 1000', length(audit.target)
            USING ERRCODE = '22023';
    END IF;
    IF audit.detail IS NULL OR jsonb_typeof(audit.detail) <> 'object' THEN
        RAISE EXCEPTION 'detail must be a JSON object, got %', coalesce(jsonb_typeof(audit.detail), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(audit.detail::text) > 1048576 THEN   -- an entry of the log, not a document
        RAISE EXCEPTION 'detail is % bytes; the limit is 1048576', octet_length(audit.detail::text)
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO jobs.audit_log AS a (actor, action, target, detail)
    VALUES (audit.actor, audit.action, audit.target, audit.detail)
    RETURNING a.id INTO v_id;
    RETURN v_id;
END $$;
COMMENT ON FUNCTION jobs.audit(text, text, text, jsonb) IS 'Record an operator action (who, what, to what, outcome) in jobs.audit_log; returns the entry id.';

-- Retry each FAILED run among run_ids that has no next attempt yet; returns the new runs.
CREATE OR REPLACE FUNCTION jobs.retry_many(run_ids bigint[]) RETURNS SETOF jobs.runs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_id bigint;
    v_ids bigint[];
    v_definition_id bigint;
    v_key bigint;
    v_keys bigint[] := '{}';
    v_run jobs.runs;
BEGIN
    PERFORM jobs._check_run_ids(retry_many.run_ids, 100000);
    -- The unique keys' locks first, ascending, before any run's row (jobs.retry's order). Each
    -- is a slot of the server's shared lock table until commit, so one call takes at most
    -- 1,000 of them: the runs of further keys are passed over, for a next call (a bulk retry of
    -- 10,000 runs of distinct keys would otherwise fill the table, out of shared memory).
    FOR v_key IN
        SELECT DISTINCT jobs._unique_key(r.kind, r.unique_key)
          FROM jobs.runs_all AS r
         WHERE r.id = ANY(retry_many.run_ids) AND r.status = 'FAILED' AND r.unique_key IS NOT NULL
           AND NOT EXISTS (SELECT FROM jobs.runs_all AS n WHERE n.retry_of = r.id)  -- retried already
         ORDER BY 1
         LIMIT 1000
    LOOP
        PERFORM jobs._require_read_committed('retrying runs with a unique_key');
        PERFORM pg_advisory_xact_lock(v_key);
        v_keys := v_keys || v_key;
    END LOOP;
    -- Rows are locked in ascending id order (as jobs.cancel_queued does); a run another session
    -- retried meanwhile is passed over, not an error, so one click never half-applies.
    v_ids := array(SELECT r.id FROM jobs.runs AS r
                    WHERE r.id = ANY(retry_many.run_ids) AND r.status = 'FAILED'
                    ORDER BY r.id
                      FOR UPDATE);
    -- Then the ones in history, in a new statement: it sees runs moved there while this waited.
    v_ids := v_ids || array(SELECT h.id FROM jobs.run_history AS h
                             WHERE h.id = ANY(retry_many.run_ids) AND h.status = 'FAILED'
                             ORDER BY h.id
                               FOR UPDATE);
    FOREACH v_id IN ARRAY v_ids LOOP
        CONTINUE WHEN EXISTS (SELECT FROM jobs.runs_all AS n WHERE n.retry_of = v_id);
        -- A run whose definition was deleted is passed over too (jobs.retry refuses it): checked
        -- under the definition's lock, which jobs.retry then takes again, so an undefine that
        -- commits meanwhile cannot turn the pass-over into an error.
        v_definition_id := (SELECT r.definition_id FROM jobs.runs_all AS r WHERE r.id = v_id);
        CONTINUE WHEN v_definition_id IS NOT NULL AND (jobs._hold_definition(v_definition_id, FALSE)).id IS NULL;
        -- So is a run whose unique key has a run queued or running (one retried just before in
        -- this call, or enqueued since): that run does the job.
        PERFORM jobs._check_history_keys(v_id);
        SELECT r.* INTO v_run FROM jobs.runs_all AS r WHERE r.id = v_id;
        CONTINUE WHEN v_run.unique_key IS NOT NULL
                  AND (jobs._unique_key(v_run.kind, v_run.unique_key) <> ALL (v_keys)
                       OR (jobs._active_run_of_key(v_run.kind, v_run.unique_key)).id IS NOT NULL);
        RETURN NEXT jobs.retry(v_id);
    END LOOP;
END $$;
COMMENT ON FUNCTION jobs.retry_many(bigint[]) IS 'Operator: jobs.retry() each FAILED run among run_ids that was not retried yet, whose definition (if any) still exists and whose unique_key (if any) has no run queued or running (others are passed over, and so are the runs of unique keys past the first 1,000 in one call); returns the new QUEUED attempts.';

-- Delete the FAILED runs among run_ids from the history; returns how many.
CREATE OR REPLACE FUNCTION jobs.discard(run_ids bigint[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_live bigint[];
    v_moved bigint[];
    v_kept bigint[];
    v_between bigint[];
    v_before bigint[];
    v_spared bigint[];
    v_count bigint;
    v_history bigint;
BEGIN
    PERFORM jobs._check_run_ids(discard.run_ids, 100000);
    SELECT array_agg(x.id) INTO v_live
      FROM (SELECT r.id FROM jobs.runs AS r
             WHERE r.id = ANY(discard.run_ids) AND r.status = 'FAILED'
             ORDER BY r.id
               FOR UPDATE) AS x;
    -- Then the ones in history (a new statement: it sees the runs moved there meanwhile).
    SELECT array_agg(x.id) INTO v_moved
      FROM (SELECT h.id FROM jobs.run_history AS h
             WHERE h.id = ANY(discard.run_ids) AND h.status = 'FAILED'
             ORDER BY h.id
               FOR UPDATE) AS x;
    -- A failed attempt whose retry chain a blocked run still waits on stays (flow.sql): the
    -- waiting run is released or cancelled by following the chain from the id it names. Read
    -- with the victims locked, so an enqueue naming one of them has committed (it held the run
    -- while it decided) or waits, and then finds it gone.
    v_kept := jobs._waited_on();
    -- Nor does an attempt between two that stay: a chain is followed by retry_of, so without
    -- it the attempts before it would read as the chain's end (a run naming the first would be
    -- cancelled as DependencyFailed while the last may still complete, and jobs.retry of the
    -- first would queue the job a second time). The first attempts of a chain may go, and its last.
    SELECT coalesce(array_agg(c.id), '{}'), coalesce(array_agg(c.retry_of), '{}') INTO v_between, v_before
      FROM (SELECT r.id, r.retry_of FROM jobs.runs AS r WHERE r.id = ANY(v_live)
            UNION ALL
            SELECT h.id, h.retry_of FROM jobs.run_history AS h WHERE h.id = ANY(v_moved)) AS c
     WHERE c.retry_of IS NOT NULL
       AND (EXISTS (SELECT FROM jobs.runs AS n WHERE n.retry_of = c.id)
            OR EXISTS (SELECT FROM jobs.run_history AS n WHERE n.retry_of = c.id))
       AND (EXISTS (SELECT FROM jobs.runs AS p WHERE p.id = c.retry_of)
            OR EXISTS (SELECT FROM jobs.run_history AS p WHERE p.id = c.retry_of));
    LOOP   -- an attempt kept keeps the one after it in the list (each round: one link further)
        v_spared := ARRAY(
            SELECT b.id FROM unnest(v_between, v_before) AS b (id, before)
             WHERE b.id <> ALL (v_kept)
               AND (b.before = ANY (v_kept)
                    OR b.before <> ALL (coalesce(v_live, '{}') || coalesce(v_moved, '{}')))
        );
        EXIT WHEN cardinality(v_spared) = 0;
        v_kept := v_kept || v_spared;
    END LOOP;
    DELETE FROM jobs.runs AS r WHERE r.id = ANY(v_live) AND r.id <> ALL (v_kept);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    DELETE FROM jobs.run_history AS h WHERE h.id = ANY(v_moved) AND h.id <> ALL (v_kept);
    GET DIAGNOSTICS v_history = ROW_COUNT;
    DELETE FROM jobs.run_history_keys AS k WHERE k.run_id = ANY(v_moved) AND k.run_id <> ALL (v_kept);
    RETURN v_count + v_history;
END $$;
COMMENT ON FUNCTION jobs.discard(bigint[]) IS 'Operator: delete the FAILED runs among run_ids from the history (other statuses are left alone, and so are the runs of a retry chain that a blocked run waits on, and an attempt whose earlier and later attempts both stay, which would cut its chain in two); returns how many. Later attempts of a chain stay.';
