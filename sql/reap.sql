-- ===========================================================================
-- reap.sql: the orphan sweep, set-based, on the database clock only.
--   * HeartbeatLost: RUNNING and the last heartbeat is older than the run's
--     heartbeat timeout (runs.heartbeat_timeout, else jobs.config's);
--   * Orphaned: RUNNING, never heartbeated, started longer ago than
--     jobs.config.orphan_timeout (generous: a worker that never heartbeats,
--     such as a psql script, still gets time to finish);
-- then one insert of retry rows by policy. Rows another transaction holds
-- (a heartbeat or completion in flight) are skipped, never waited for, so the
-- sweep cannot deadlock with workers. The old owner is fenced by the status
-- change: its complete/fail/heartbeat no longer match.
-- ===========================================================================

-- Fail RUNNING runs whose worker went silent; returns each with its reason and retry run id.
CREATE OR REPLACE FUNCTION jobs.reap()
RETURNS TABLE (run_id bigint, reason text, retry_run_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_dead bigint[];
BEGIN
    WITH cfg AS (
        SELECT c.heartbeat_timeout, c.orphan_timeout FROM jobs.config AS c
    ),
    lost AS (
        UPDATE jobs.runs AS r
           SET status = 'FAILED', finished_at = now(), failure_reason = 'HeartbeatLost',
               error = format('no heartbeat from worker %s since %s', r.worker, r.heartbeat_at)
          FROM cfg
         WHERE r.id IN (SELECT s.id FROM jobs.runs AS s CROSS JOIN cfg
                         WHERE s.status = 'RUNNING' AND s.heartbeat_at IS NOT NULL
                           AND s.heartbeat_at < now() - coalesce(s.heartbeat_timeout, cfg.heartbeat_timeout)
                         ORDER BY s.id
                           FOR UPDATE OF s SKIP LOCKED)
        RETURNING r.id
    ),
    orphaned AS (
        UPDATE jobs.runs AS r
           SET status = 'FAILED', finished_at = now(), failure_reason = 'Orphaned',
               error = format('worker %s never heartbeated since it started at %s', r.worker, r.started_at)
          FROM cfg
         WHERE r.id IN (SELECT s.id FROM jobs.runs AS s CROSS JOIN cfg
                         WHERE s.status = 'RUNNING' AND s.heartbeat_at IS NULL
                           AND s.started_at < now() - cfg.orphan_timeout
                         ORDER BY s.id
                           FOR UPDATE OF s SKIP LOCKED)
        RETURNING r.id
    )
    SELECT array_agg(x.id) INTO v_dead
      FROM (SELECT l.id FROM lost AS l UNION ALL SELECT o.id FROM orphaned AS o) AS x;

    IF v_dead IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT r.id, r.failure_reason, n.retry_run_id
      FROM jobs.runs AS r
      LEFT JOIN jobs._enqueue_retries(v_dead, NULL) AS n ON n.retry_of = r.id
     WHERE r.id = ANY (v_dead)
     ORDER BY r.id;
    -- Those without a retry failed for good: the runs waiting on them are cancelled.
    PERFORM jobs._cascade_dependency_failure(array_agg(r.id))
       FROM jobs.runs AS r
      WHERE r.id = ANY (v_dead)
        AND NOT EXISTS (SELECT FROM jobs.runs AS n WHERE n.retry_of = r.id);
    PERFORM jobs._notify();
END
$$;
COMMENT ON FUNCTION jobs.reap() IS
'Fail RUNNING runs with a stale heartbeat (HeartbeatLost) or none after orphan_timeout (Orphaned), and queue their retries by policy.';
