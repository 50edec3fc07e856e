-- ===========================================================================
-- reap.sql: the orphan sweep, set-based, on the database clock only.
-- One pass fails every RUNNING run that is overdue, for the first of:
--   * Timeout: started_at + the run's timeout has passed, whether or not its
--     worker still heartbeats (a job hung in I/O, or a worker in a language
--     with no timeout of its own, cannot hold its slot and caps forever);
--   * HeartbeatLost: the last heartbeat is older than the run's heartbeat
--     timeout (runs.heartbeat_timeout, else jobs.config's; for a heartbeat sent
--     before jobs.config's was lowered, the previous one for its length, see jobs.reap);
--   * Orphaned: never heartbeated, started longer ago than
--     jobs.config.orphan_timeout (generous: a worker that never heartbeats,
--     such as a psql script, still gets time to finish);
-- (runs of unique keys: at most 1,000 a pass, each holding its key's lock to the end, the
-- rest at the next passes), then one insert of retry rows by policy (retry.sql). Rows another transaction
-- holds (a heartbeat or completion in flight) are skipped, never waited for, so
-- the sweep cannot deadlock with workers. The old owner is fenced by the status
-- change: its complete/fail/heartbeat no longer match.
--
-- A stall is not a lost heartbeat. While a table lock holds jobs.runs (a LOCK TABLE, an ALTER
-- TABLE, a CREATE INDEX, a migration), heartbeats and reaps wait behind it alike; once it is
-- released they go on at the same moment, and the last stamp a reap sees may be older than the
-- heartbeat timeout only because of the wait. So:
--   * a heartbeat stamps the time it writes, after its wait (jobs.heartbeat), and a reap judges
--     against its own start, now(), taken before any wait of its own: a stall a reap waited
--     through ages nothing;
--   * every jobs.heartbeat holds its worker's heartbeat key (jobs._heartbeat_key, of its worker
--     id and claim token) shared from before it touches jobs.runs until it commits, and a reap
--     fails a run for a missing heartbeat (HeartbeatLost, Orphaned) only when it gets the key
--     of the run's worker and token exclusive (only tried,
--     before it locks the row, and released at once: jobs._heartbeat_in_flight, no lock per
--     worker held to the end): a run whose worker's heartbeat is in flight, waiting behind the
--     lock or about to commit, is left to the next pass, which sees the new stamp. A heartbeat
--     that commits after the reap's snapshot but before the reap locks the row is seen too: the
--     UPDATE reads a row changed since its snapshot again and checks the deadline on it (the
--     lateral that found the reason keeps what it read from the older row).
-- A worker that is really gone has no heartbeat in flight, so it is reaped as before. Timeout
-- does not depend on heartbeats and is not held back.
--
-- Deadlines are compared as epoch seconds (numeric), never as timestamptz +
-- interval: no row, however absurd its timestamps or intervals, can make the
-- arithmetic overflow and stop the sweep for everyone. (A month counts 30 days.)
-- ===========================================================================

-- The deadlines below are written out, not a helper function: every function pins its
-- search_path, and a call of one saves and restores settings, per RUNNING row and reason.
DROP FUNCTION IF EXISTS jobs._deadline(timestamptz, interval);

-- Private: what follows a reap's failures (jobs.reap, jobs.reap_worker): the retries queued by
-- policy, the runs waiting on those that failed for good cancelled, the workers woken. Returns
-- each failed run with its reason and its retry.
CREATE OR REPLACE FUNCTION jobs._settle_reaped(dead bigint[])
RETURNS TABLE (run_id bigint, reason text, retry_run_id bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_retries bigint[];
    v_keyed boolean;
BEGIN
    SELECT coalesce(array_agg(n.retry_run_id), '{}'), coalesce(bool_or(r.unique_key IS NOT NULL), FALSE)
      INTO v_retries, v_keyed
      FROM jobs._enqueue_retries(_settle_reaped.dead, NULL) AS n
      JOIN jobs.runs AS r ON r.id = n.retry_of;
    -- Retries of unique keys with a QUEUED run already fold into it (retry.sql); their keys'
    -- locks are held (jobs.reap, jobs.reap_worker).
    IF v_keyed THEN
        PERFORM jobs._fold_retries(v_retries);
    END IF;
    RETURN QUERY
    SELECT r.id, r.failure_reason::text, n.id
      FROM jobs.runs AS r
      LEFT JOIN jobs.runs AS n ON n.id = ANY (v_retries) AND n.retry_of = r.id
     WHERE r.id = ANY (_settle_reaped.dead)
     ORDER BY r.id;
    -- Those without a retry failed for good: the runs waiting on them are cancelled.
    PERFORM jobs._cascade_dependency_failure(array_agg(r.id))
       FROM jobs.runs AS r
      WHERE r.id = ANY (_settle_reaped.dead)
        AND NOT EXISTS (SELECT FROM jobs.runs AS n WHERE n.retry_of = r.id);
    PERFORM jobs._notify();
END $$;
COMMENT ON FUNCTION jobs._settle_reaped(bigint[]) IS 'Private: after a reap failed these runs: queue their retries by policy (a retry of a unique key with a QUEUED run folds into it), cancel the runs waiting on those without one, wake the workers; returns run_id, reason, retry_run_id.';

-- Fail overdue RUNNING runs (Timeout, HeartbeatLost, Orphaned); returns each with its reason and retry run id.
CREATE OR REPLACE FUNCTION jobs.reap() RETURNS TABLE (run_id bigint, reason text, retry_run_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_dead bigint[];
    v_now numeric := extract(epoch FROM now());
    -- jobs.config's heartbeat timeout, in seconds. A run whose last heartbeat came before the
    -- timeout was lowered keeps the previous one for that one's length after the change: its
    -- worker reads the setting at each beat, and until its next one it beats at the cadence the
    -- previous timeout asked for, so the shorter one would fail runs whose workers are alive.
    v_config jobs.config := (SELECT c FROM jobs.config AS c);
    v_timeout numeric := extract(epoch FROM v_config.heartbeat_timeout);
    v_lowered_at numeric := CASE
        WHEN extract(epoch FROM v_config.heartbeat_timeout_lowered_at)
             + extract(epoch FROM v_config.heartbeat_timeout_lowered_from) > v_now
            THEN extract(epoch FROM v_config.heartbeat_timeout_lowered_at)
    END;
    v_timeout_before numeric := greatest(v_timeout, extract(epoch FROM v_config.heartbeat_timeout_lowered_from));
BEGIN
    WITH overdue AS (
        SELECT s.id, first.reason, s.unique_key IS NOT NULL AS keyed
          FROM jobs.runs AS s
         CROSS JOIN jobs.config AS c
         CROSS JOIN LATERAL (
               SELECT d.reason FROM (VALUES
                   ('Timeout', extract(epoch FROM s.started_at) + extract(epoch FROM s.timeout)),
                   ('HeartbeatLost',
                    extract(epoch FROM s.heartbeat_at)
                    + coalesce(extract(epoch FROM s.heartbeat_timeout),
                               CASE WHEN extract(epoch FROM s.heartbeat_at) < v_lowered_at
                                    THEN v_timeout_before ELSE v_timeout END)),
                   ('Orphaned',
                    CASE WHEN s.heartbeat_at IS NULL
                         THEN extract(epoch FROM s.started_at) + extract(epoch FROM c.orphan_timeout) END)
               ) AS d (reason, deadline)
                WHERE d.deadline < v_now
                  -- A missing heartbeat is no reason while a heartbeat of the run's worker is in
                  -- flight (see the head of this file); its timeout still is, even when the
                  -- heartbeat's deadline passed first. (Tried only for a deadline that passed.)
                  AND (d.reason = 'Timeout' OR s.worker IS NULL OR NOT jobs._heartbeat_in_flight(s.worker, s.claim_token_hash))
                ORDER BY d.deadline
                LIMIT 1) AS first
         WHERE s.status = 'RUNNING'
         ORDER BY s.id
           FOR UPDATE OF s SKIP LOCKED
    ),
    -- At most 1,000 runs of unique keys per pass: each is failed holding its key's advisory lock
    -- to the end of this transaction, and those locks fill PostgreSQL's shared lock table, which
    -- the whole server shares (max_locks_per_transaction x max_connections, 6,400 by default):
    -- a pass over tens of thousands of them would end in 53200 (out of shared memory), every
    -- pass again, and reap nothing. The rest are left to the next passes.
    chosen AS (
        SELECT o.id, o.reason, o.keyed FROM overdue AS o WHERE NOT o.keyed
        UNION ALL
        (SELECT o.id, o.reason, o.keyed FROM overdue AS o WHERE o.keyed ORDER BY o.id LIMIT 1000)
    ),
    failed AS (
        UPDATE jobs.runs AS r
           SET status = 'FAILED', finished_at = now(), failure_reason = o.reason,
               error = CASE o.reason
                   WHEN 'Timeout' THEN format('timeout of %s passed: started at %s by worker %s',
                                              r.timeout, r.started_at, r.worker)
                   WHEN 'HeartbeatLost' THEN format('no heartbeat from worker %s since %s', r.worker, r.heartbeat_at)
                   ELSE format('worker %s never heartbeated since it started at %s', r.worker, r.started_at)
               END
          FROM chosen AS o
         WHERE r.id = o.id AND r.status = 'RUNNING'
           -- The deadline once more, on the row as this UPDATE finds it: a heartbeat that
           -- committed after this statement's snapshot, before its lock on the row, is seen here
           -- (the row is read again when it was changed since the snapshot), where the lateral of
           -- overdue kept the reason it worked out from the older row.
           AND CASE o.reason
                   WHEN 'HeartbeatLost'
                       THEN extract(epoch FROM r.heartbeat_at)
                            + coalesce(extract(epoch FROM r.heartbeat_timeout),
                                       CASE WHEN extract(epoch FROM r.heartbeat_at) < v_lowered_at
                                            THEN v_timeout_before ELSE v_timeout END) < v_now
                   WHEN 'Orphaned' THEN r.heartbeat_at IS NULL
                   ELSE TRUE
               END
           -- A run of a unique key is failed with the key held (see jobs.fail), only tried: an
           -- enqueue holding it may be waiting for this row, so the run waits for the next pass.
           -- The test names o (chosen), not only r, so that it is made on the chosen runs alone:
           -- a condition on r alone would be tried on every RUNNING run as the scan reads it,
           -- taking (and holding to the end) the key of every live run of a unique key.
           AND (NOT o.keyed OR pg_try_advisory_xact_lock(jobs._unique_key(r.kind, r.unique_key)))
        RETURNING r.id
    )
    SELECT array_agg(f.id) INTO v_dead FROM failed AS f;

    IF v_dead IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM jobs._settle_reaped(v_dead);
END $$;
COMMENT ON FUNCTION jobs.reap() IS 'Fail every overdue RUNNING run, for whichever came first: past started_at + timeout (Timeout, even while it heartbeats), a heartbeat older than its heartbeat timeout (HeartbeatLost), or none since started_at + orphan_timeout (Orphaned), the last two only while no heartbeat of the run''s worker is in flight (a heartbeat waiting behind a table lock ages nothing); queue their retries by policy; runs of unique keys at most 1,000 a pass (each holds its key''s lock to the end: the rest wait for the next pass). Returns run_id, reason, retry_run_id.';

-- An operator's reap of one worker known to be gone (a machine that died for good): every run
-- RUNNING under that worker id fails now as HeartbeatLost, as the reaper would fail it once the
-- heartbeat timeout passed, whatever claim token it was claimed with (the operator has none to
-- present), and its retry is queued by policy. The old worker is fenced by the status change.
CREATE OR REPLACE FUNCTION jobs.reap_worker(worker text, message text DEFAULT NULL)
RETURNS TABLE (run_id bigint, reason text, retry_run_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_dead bigint[];
BEGIN
    PERFORM jobs._check_text('worker', reap_worker.worker, 200);
    IF length(reap_worker.message) > 10000 THEN
        RAISE EXCEPTION 'message must be at most 10000 characters, got %', length(reap_worker.message)
            USING ERRCODE = '22023';
    END IF;
    -- The keys first, as jobs.fail takes them; the runs' ids are read unlocked for that, and
    -- the rows locked below are only those still RUNNING under this worker.
    PERFORM jobs._lock_keys_to_fail(array_agg(r.id))
       FROM jobs.runs AS r WHERE r.worker = reap_worker.worker AND r.status = 'RUNNING';
    WITH held AS (
        SELECT r.id FROM jobs.runs AS r
         WHERE r.worker = reap_worker.worker AND r.status = 'RUNNING'
         ORDER BY r.id
           FOR NO KEY UPDATE  -- as the worker's own calls lock its runs
    ),
    failed AS (
        UPDATE jobs.runs AS r
           SET status = 'FAILED', finished_at = now(), failure_reason = 'HeartbeatLost',
               error = left(coalesce(reap_worker.message,
                                     format('worker %s declared gone by an operator (%s)', r.worker, session_user)),
                            10000)
          FROM held AS h
         WHERE r.id = h.id AND r.status = 'RUNNING' AND r.worker = reap_worker.worker
        RETURNING r.id
    )
    SELECT array_agg(f.id) INTO v_dead FROM failed AS f;

    IF v_dead IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM jobs._settle_reaped(v_dead);
END $$;
COMMENT ON FUNCTION jobs.reap_worker(text, text) IS 'Operator: fail now, as HeartbeatLost, every run RUNNING under this worker id (one known to be gone), whatever claim token it was claimed with, and queue their retries by policy, as jobs.reap does once the heartbeat timeout passed; the worker is fenced. message: the runs'' error (default: who declared the worker gone). Returns run_id, reason, retry_run_id.';
