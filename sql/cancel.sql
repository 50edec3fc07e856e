-- ===========================================================================
-- cancel.sql: stopping work. A QUEUED run is cancelled at once; a RUNNING run
-- gets cancel_requested, which its worker learns from its next heartbeat and
-- acknowledges (jobs.acknowledge_cancel) at a checkpoint.
-- ===========================================================================

-- Cancel every QUEUED run of a definition; returns how many.
CREATE OR REPLACE FUNCTION jobs.cancel_queued(name text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_def jobs.definitions := jobs._known_definition(
        (SELECT d FROM jobs.definitions AS d WHERE d.name = cancel_queued.name), cancel_queued.name
    );
    v_count integer;
    v_ids bigint[];
BEGIN
    -- Wait for rows a claimer holds (never long: a claim is one short transaction, and one
    -- that waits for a busy group polls for at most a second) rather than skip them: a
    -- claimer also locks rows it leaves QUEUED (definition at cap), and skipping those
    -- would leave runs behind, even of a definition jobs.undefine() is deleting. After the wait
    -- the status is checked again, so a row the claimer did start stays RUNNING. Locked in
    -- ascending id order.
    WITH victims AS (
        SELECT r.id FROM jobs.runs AS r
         WHERE r.definition_id = v_def.id AND r.status = 'QUEUED'
         ORDER BY r.id
           FOR UPDATE
    ),
    cancelled AS (
        UPDATE jobs.runs AS r
           SET status = 'CANCELLED', finished_at = now(), cancel_requested = TRUE, blocked = FALSE,
               error = 'cancelled before it started'
          FROM victims WHERE r.id = victims.id
        RETURNING r.id
    )
    SELECT count(*), array_agg(c.id) INTO v_count, v_ids FROM cancelled AS c;
    PERFORM jobs._cascade_dependency_failure(v_ids);  -- runs waiting on them
    RETURN v_count;
END $$;
COMMENT ON FUNCTION jobs.cancel_queued(text) IS 'Cancel every QUEUED run of the named definition; returns how many were cancelled.';

-- Cancel a run: QUEUED -> CANCELLED now; RUNNING -> cancel_requested. Returns the status after the call.
CREATE OR REPLACE FUNCTION jobs.cancel(run_id bigint) RETURNS jobs.run_status
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    v_status jobs.run_status;
BEGIN
    UPDATE jobs.runs AS r
       SET status = CASE WHEN r.status = 'QUEUED' THEN 'CANCELLED'::jobs.run_status ELSE r.status END,
           finished_at = CASE WHEN r.status = 'QUEUED' THEN now() ELSE r.finished_at END,
           error = CASE WHEN r.status = 'QUEUED' THEN 'cancelled before it started' ELSE r.error END,
           blocked = r.blocked AND r.status <> 'QUEUED',   -- it waits on nothing any more
           cancel_requested = TRUE
     WHERE r.id = cancel.run_id AND r.status IN ('QUEUED', 'RUNNING')
    RETURNING r.status INTO v_status;
    IF FOUND THEN
        IF v_status = 'CANCELLED' THEN
            PERFORM jobs._cascade_dependency_failure(ARRAY[cancel.run_id]);
        END IF;
        RETURN v_status;
    END IF;
    RETURN (jobs._known_run(cancel.run_id, FALSE)).status;  -- already finished (or no such run)
END $$;
COMMENT ON FUNCTION jobs.cancel(bigint) IS 'QUEUED -> CANCELLED at once; RUNNING -> cancel_requested (delivered through heartbeats). Returns the run''s status after the call.';
