-- ===========================================================================
-- worker.sql: what a worker calls while it holds runs: heartbeat, complete,
-- acknowledge a cancellation, give back runs it never began. Every transition is fenced by jobs._owned, the one place that
-- asks for status = 'RUNNING', the claiming worker's id and its claim token, and it says
-- whether it happened: a worker that was reaped (or never owned the run) changes nothing.
-- A completion tests the fence in the UPDATE that completes (its recheck of a row changed
-- since its snapshot tests the latest version); the other calls first hold their runs
-- through jobs._hold_own_runs (or _hold_own_run), then change them by id.
--
-- Claim tokens: a worker id is no secret (jobs.running and jobs.workers show it), so a
-- worker that claims with claim_token => a secret of its own gets runs that only a caller
-- presenting the same token can touch: the run stores sha256 of the token
-- (claim_token_hash) and each call here requires claim_token_hash IS NOT DISTINCT FROM
-- sha256(its claim_token). A run claimed without a token is fenced by the worker id alone
-- (callers that predate tokens), and a caller presenting a token cannot touch it either.
--
-- Plans that outlive the table they were made for: a worker's session makes the plans of
-- these calls (and of jobs.claim) at its first calls and keeps them for as long as it lives,
-- and PostgreSQL makes them again only when jobs.runs is analyzed. A worker that starts on a
-- new or empty jobs.runs would plan its look-ups by id as sequential scans of a table of a
-- few pages, and go on reading the whole table in every claim, heartbeat and completion as
-- it fills with runs, until autovacuum next analyzes it (never, where it is off). So the
-- calls that find runs by id or by their worker run with sequential scans off
-- (enable_seqscan = off): each finds its rows through an index whatever size the table had
-- when its plans were made. A table without an index is still read whole, and priced as a
-- disabled scan, above jit_above_cost: so these calls also run with jit = off, or on a server
-- with JIT each would compile its plan again at every call (half a second for a failure's
-- retry, which reads jobs.config).
-- ===========================================================================

-- Whether a run (its status, worker and claim_token_hash) is still held by worker with this
-- token hash (NULL: claimed without a token). The planner inlines it into the statement that
-- calls it: its body is SQL-standard, parsed here, so it depends on no search_path, and its
-- search_path is left unpinned as every such body's is (a pinned one is never inlined, roles.sql).
-- The status test is IS NOT DISTINCT FROM on purpose: no partial index predicate (status =
-- 'RUNNING') can be proven from it, so a call finds its runs by id and never walks the
-- RUNNING set through runs_running_idx, which a plan made from statistics that saw few
-- RUNNING runs would otherwise do.
CREATE OR REPLACE FUNCTION jobs._owned(
    status jobs.run_status, run_worker text, run_token_hash bytea, worker text, token_hash bytea
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN status IS NOT DISTINCT FROM 'RUNNING'::jobs.run_status AND run_worker = worker
AND run_token_hash IS NOT DISTINCT FROM token_hash;
COMMENT ON FUNCTION jobs._owned(jobs.run_status, text, bytea, text, bytea) IS 'Private: the fence: a run with this status, worker and claim_token_hash is still RUNNING for worker and the token whose hash is token_hash (NULL: none).';

-- The claim-token hash a worker's call fences with (NULL: no token), once worker is checked:
-- raises 22023 naming worker (NULL, empty or over 200 characters) or claim_token (not 16 to
-- 200 characters). The checks are plain expressions; the helpers that own the messages run
-- only when one fails.
CREATE OR REPLACE FUNCTION jobs._fence_hash(worker text, claim_token text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF worker IS NULL OR length(worker) NOT BETWEEN 1 AND 200 THEN
        PERFORM jobs._check_text('worker', worker, 200);
    END IF;
    IF claim_token IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN jobs._claim_token_hash(claim_token);
END $$;
COMMENT ON FUNCTION jobs._fence_hash(text, text) IS 'Private: the claim_token_hash a worker''s call fences with (NULL for no token); raises 22023 naming worker unless it is a non-empty text of at most 200 characters, or claim_token unless it is NULL or 16 to 200 characters.';

-- The runs among run_ids still RUNNING for worker and its claim token, locked in id order:
-- a worker's calls on its runs (jobs.unclaim, a single run's fence) and its complete_many run at
-- the same time on two connections, and two multi-row updates must not lock in crossed order.
-- It waits for a run another transaction holds; jobs.heartbeat, which must not, skips it. Raises 22023 naming worker, claim_token
-- (jobs._fence_hash) or run_ids (NULL or more than 10,000).
DROP FUNCTION IF EXISTS jobs._check_run_batch(bigint[], text);
CREATE OR REPLACE FUNCTION jobs._hold_own_runs(run_ids bigint[], worker text, claim_token text) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    v_token_hash bytea := jobs._fence_hash(_hold_own_runs.worker, _hold_own_runs.claim_token);
    v_ids bigint[];
BEGIN
    IF run_ids IS NULL OR cardinality(run_ids) > 10000 THEN
        PERFORM jobs._check_run_ids(run_ids, 10000);
    END IF;
    -- The rows are found by id and locked only if they are this worker's and token's: a row
    -- of another worker, or a QUEUED one, is never locked, so a fenced call holds up nobody's
    -- completion or claim (a worker has no lock on jobs.runs of its own to take). The fence is
    -- applied in full to what the locks return (the latest version of each row): a status
    -- test inside would let the planner walk every RUNNING run through runs_running_idx
    -- whenever the statistics saw few of them (no index has worker or claim_token_hash).
    SELECT coalesce(array_agg(mine.id) FILTER (
               WHERE jobs._owned(mine.status, mine.worker, mine.claim_token_hash,
                                 _hold_own_runs.worker, v_token_hash)), '{}')
      INTO v_ids
      FROM (SELECT s.id, s.status, s.worker, s.claim_token_hash
              FROM jobs.runs AS s
             WHERE s.id = ANY (_hold_own_runs.run_ids)
               AND s.worker = _hold_own_runs.worker AND s.claim_token_hash IS NOT DISTINCT FROM v_token_hash
             ORDER BY s.id
               FOR NO KEY UPDATE) AS mine;
    RETURN v_ids;
END $$;
COMMENT ON FUNCTION jobs._hold_own_runs(bigint[], text, text) IS 'Private: locks (FOR NO KEY UPDATE, in id order) and returns the runs among run_ids still RUNNING for worker and its claim_token; raises 22023 naming the field unless run_ids is a non-NULL array of at most 10,000 ids, worker a non-empty text of at most 200 characters and claim_token NULL or 16 to 200 characters.';

-- One run of a worker's, held as jobs._hold_own_runs holds a batch: the fence of the calls on
-- one claimed run (jobs.complete, fail, acknowledge_cancel, snooze), which then change it by id.
-- Raises 22023 naming run_id (NULL or not positive), claim_token or worker.
CREATE OR REPLACE FUNCTION jobs._hold_own_run(run_id bigint, worker text, claim_token text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF run_id IS NULL OR run_id < 1 THEN
        PERFORM jobs._check_range('run_id', run_id, 1, 9223372036854775807);
    END IF;
    RETURN cardinality(jobs._hold_own_runs(ARRAY[run_id], worker, claim_token)) = 1;
END $$;
COMMENT ON FUNCTION jobs._hold_own_run(bigint, text, text) IS 'Private: locks (FOR NO KEY UPDATE) the run if it is still RUNNING for worker and its claim_token and says whether it is; raises 22023 naming the field unless run_id is positive, worker a non-empty text of at most 200 characters and claim_token NULL or 16 to 200 characters.';

-- Stamp heartbeat_at on all of a worker's runs in one statement.
-- heartbeat_at is in no index and no index predicate, so on a page with free
-- space (jobs.runs has fillfactor 80) this is a HOT update: no index writes.
-- The runs are locked as jobs._hold_own_runs locks them, but SKIP LOCKED: a run whose row
-- another transaction holds (an application's jobs.cancel not yet committed, an operator's
-- UPDATE, the worker's own completion on its other connection) is not waited for, so one
-- locked run never holds up the heartbeat of the worker's others. Such a run is not stamped
-- this time; it is answered with cancel_requested NULL while its last committed version is
-- still RUNNING for this worker (not stamped, not lost), and left out of the answer otherwise.
-- A database that stalls (a LOCK TABLE, an ALTER TABLE, a migration holding jobs.runs) must not
-- cost a live worker its runs: the heartbeat first tries its worker's heartbeat key shared
-- (jobs._heartbeat_key), which it holds while it waits behind the table lock and until it
-- commits, and jobs.reap leaves the worker's runs alone meanwhile; and it stamps the time it
-- writes (clock_timestamp(), after the wait), not its transaction's start, which a stall would
-- leave older than the heartbeat timeout.
CREATE OR REPLACE FUNCTION jobs.heartbeat(run_ids bigint[], worker text, claim_token text DEFAULT NULL)
RETURNS TABLE (run_id bigint, cancel_requested boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off AS $$
DECLARE
    v_token_hash bytea := jobs._fence_hash(heartbeat.worker, heartbeat.claim_token);
    v_locked bigint[];
    v_mine bigint[];
BEGIN
    IF heartbeat.run_ids IS NULL OR cardinality(heartbeat.run_ids) > 10000 THEN
        PERFORM jobs._check_run_ids(heartbeat.run_ids, 10000);
    END IF;
    -- Only tried: held by a reap that is failing one of this worker's runs, it is not needed
    -- (the runs that reap locks are skipped here, the others it leaves alone).
    PERFORM pg_try_advisory_xact_lock_shared(jobs._heartbeat_key(heartbeat.worker, v_token_hash));
    -- Found by id, only this worker's and token's rows locked, the fence applied to what the
    -- locks return (jobs._hold_own_runs).
    SELECT coalesce(array_agg(mine.id), '{}'),
           coalesce(array_agg(mine.id) FILTER (
               WHERE jobs._owned(mine.status, mine.worker, mine.claim_token_hash,
                                 heartbeat.worker, v_token_hash)), '{}')
      INTO v_locked, v_mine
      FROM (SELECT s.id, s.status, s.worker, s.claim_token_hash
              FROM jobs.runs AS s
             WHERE s.id = ANY (heartbeat.run_ids)
               AND s.worker = heartbeat.worker AND s.claim_token_hash IS NOT DISTINCT FROM v_token_hash
             ORDER BY s.id
               FOR NO KEY UPDATE SKIP LOCKED) AS mine;
    RETURN QUERY
    UPDATE jobs.runs AS r SET heartbeat_at = clock_timestamp() WHERE r.id = ANY (v_mine)
    RETURNING r.id, r.cancel_requested;
    IF cardinality(v_locked) < cardinality(heartbeat.run_ids) THEN
        -- The ones skipped: still this worker's as last committed (a fresh snapshot)?
        RETURN QUERY
        SELECT s.id, NULL::boolean
          FROM jobs.runs AS s
         WHERE s.id = ANY (heartbeat.run_ids) AND s.id <> ALL (v_locked)
           AND jobs._owned(s.status, s.worker, s.claim_token_hash, heartbeat.worker, v_token_hash);
    END IF;
END $$;
COMMENT ON FUNCTION jobs.heartbeat(bigint[], text, text) IS 'Stamp heartbeat_at, with the time it writes (after any wait for a table lock), on the given runs still RUNNING for worker (and its claim_token, if they were claimed with one); returns (run_id, cancel_requested). While it is in flight, jobs.reap leaves the worker''s runs alone. A run whose row another transaction holds locked is not waited for: not stamped, and answered with cancel_requested NULL while it is still this worker''s. A run missing from the answer is no longer this worker''s. Raises 22023 naming run_ids (NULL or over 10,000), worker or claim_token.';

-- The starts a claim counted against rate limits for runs that are going back to the queue
-- unstarted (still RUNNING, started_at as the claim set it): taken out of the claim's rows of
-- jobs._rate_starts, which are labelled as jobs.claim labels its groups, so that they do not
-- hold the window full for its period. Call it before clearing the runs' started_at.
-- It first takes the window lock (jobs._window_key) of each of their rate limits SHARED, in
-- ascending key order: jobs.set_limit holds it exclusive while it rewrites a window's rows, so
-- the two never lock the same rows at once (and never in crossed order), and the rows read here
-- are those the change left. Then one statement: each row is either lowered or, when all its
-- starts are given back, deleted.
CREATE OR REPLACE FUNCTION jobs._give_back_starts(run_ids bigint[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_key bigint;
BEGIN
    IF cardinality(run_ids) > 0 AND EXISTS (SELECT FROM jobs.limits AS m WHERE m.rate_limit IS NOT NULL) THEN
        FOR v_key IN
            SELECT DISTINCT jobs._window_key(m.scope, m.name)
              FROM jobs.runs AS r
              JOIN jobs.limits AS m
                ON m.rate_limit IS NOT NULL
               AND ((m.scope = 'queue' AND m.name = r.queue) OR (m.scope = 'kind' AND m.name = r.kind))
             WHERE r.id = ANY (_give_back_starts.run_ids)
             ORDER BY 1
        LOOP
            PERFORM pg_advisory_xact_lock_shared(v_key);
        END LOOP;
        WITH given AS (
            SELECT CASE WHEN m.per_key THEN jsonb_build_array(m.scope, m.name, r.concurrency_key)::text
                        ELSE jsonb_build_array(m.scope, m.name)::text END AS label,
                   r.started_at, count(*)::integer AS n
              FROM jobs.runs AS r
              JOIN jobs.limits AS m
                ON m.rate_limit IS NOT NULL
               AND ((m.scope = 'queue' AND m.name = r.queue) OR (m.scope = 'kind' AND m.name = r.kind))
             WHERE r.id = ANY (_give_back_starts.run_ids) AND r.status = 'RUNNING'
             GROUP BY 1, 2
        ),
        lowered AS (
            UPDATE jobs._rate_starts AS x SET starts = x.starts - g.n
              FROM given AS g
             WHERE x.label = g.label AND x.started_at = g.started_at AND x.starts > g.n
            RETURNING x.label
        )
        DELETE FROM jobs._rate_starts AS x
         USING given AS g
         WHERE x.label = g.label AND x.started_at = g.started_at AND x.starts <= g.n;
    END IF;
END $$;
COMMENT ON FUNCTION jobs._give_back_starts(bigint[]) IS 'Private: takes the starts jobs.claim counted against rate limits for these RUNNING runs (going back to the queue unstarted) out of jobs._rate_starts, holding each rate limit''s window lock (jobs._window_key) shared meanwhile; call it before their started_at is cleared.';

-- A worker that does not know what its last claim did (the connection broke after the claim
-- was sent: a network cut, a server restart, a proxy timeout) gives back the runs that claim
-- may have taken: every run still RUNNING for worker and its claim token that is not among held
-- (the runs the worker knows it holds) goes back to QUEUED as it was before the claim (same
-- attempt, scheduled_for and priority; no started_at, worker or heartbeat), and one whose
-- cancellation was requested meanwhile is CANCELLED (it never started). Without this they
-- would wait RUNNING for the reaper and be failed as HeartbeatLost or Orphaned, an attempt
-- spent on work that never ran.
-- It first takes the worker's claim lock (jobs._claim_key, of its id and token) exclusive: a claim of this worker
-- still in progress on a connection its client has lost holds it shared until it commits or
-- rolls back, so what such a claim took is seen here, not left behind. The wait is bounded
-- (lock_timeout): past it the call raises 55P03 and changes nothing; call it again later.
-- Locks the runs in id order, as jobs._hold_own_runs does. Raises 22023 naming worker,
-- claim_token (jobs._fence_hash) or held (NULL or more than 10,000 ids).
CREATE OR REPLACE FUNCTION jobs.hand_back_unheld(held bigint[], worker text, claim_token text DEFAULT NULL)
RETURNS TABLE (run_id bigint, status jobs.run_status)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET lock_timeout = '5s'
SET enable_seqscan = off
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_token_hash bytea := jobs._fence_hash(hand_back_unheld.worker, hand_back_unheld.claim_token);
    v_ids bigint[];
    v_cancelled bigint[];
    v_keyed boolean;
    v_folded bigint[];
    v_carriers bigint[];
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN  -- the claims that commit while it waits
        PERFORM jobs._require_read_committed('jobs.hand_back_unheld');
    END IF;
    IF held IS NULL THEN
        RAISE EXCEPTION 'held must not be NULL (an empty array when the worker holds no run)'
            USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_range('number of held run ids', cardinality(held), 0, 10000);
    -- A NULL among them would make every run compare unknown against the list: none handed back.
    IF EXISTS (SELECT FROM unnest(held) AS h WHERE h IS NULL) THEN
        RAISE EXCEPTION 'held must not contain NULL run ids' USING ERRCODE = '22023';
    END IF;
    BEGIN
        PERFORM pg_advisory_xact_lock(jobs._claim_key(hand_back_unheld.worker, v_token_hash));
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'a claim of worker % is still in progress', hand_back_unheld.worker
            USING ERRCODE = '55P03',
                  HINT = 'Nothing was handed back; call jobs.hand_back_unheld again once that claim has ended.';
    END;
    -- Their unique keys before their rows (retry.sql); none of them can change meanwhile:
    -- only this worker's claims make runs RUNNING for it.
    v_keyed := jobs._lock_unique_keys(ARRAY(
        SELECT s.id FROM jobs.runs AS s
         WHERE s.status = 'RUNNING' AND s.worker = hand_back_unheld.worker AND s.unique_key IS NOT NULL
           AND s.claim_token_hash IS NOT DISTINCT FROM v_token_hash
           AND s.id <> ALL (hand_back_unheld.held)));
    -- This statement's snapshot is taken after the lock: every claim of this worker begun
    -- before it has committed or rolled back.
    SELECT coalesce(array_agg(mine.id ORDER BY mine.id), '{}')
      INTO v_ids
      FROM (SELECT s.id
              FROM jobs.runs AS s
             WHERE s.status = 'RUNNING' AND s.worker = hand_back_unheld.worker
               AND s.claim_token_hash IS NOT DISTINCT FROM v_token_hash
               AND s.id <> ALL (hand_back_unheld.held)
             ORDER BY s.id
               FOR NO KEY UPDATE) AS mine;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    -- None of them started: the starts their claim counted against rate limits go back too.
    PERFORM jobs._give_back_starts(v_ids);
    -- A run whose unique key has a QUEUED run already folds into it (retry.sql).
    IF v_keyed THEN
        SELECT array_agg(f.run_id), array_agg(f.carrier) INTO v_folded, v_carriers
          FROM jobs._fold_given_back(v_ids) AS f;
    END IF;
    RETURN QUERY
    UPDATE jobs.runs AS r
       SET status = CASE WHEN r.cancel_requested OR f.carrier IS NOT NULL THEN 'CANCELLED'::jobs.run_status
                         ELSE 'QUEUED' END,
           finished_at = CASE WHEN r.cancel_requested OR f.carrier IS NOT NULL THEN now() END,
           error = CASE WHEN r.cancel_requested THEN 'cancelled before it started'
                        WHEN f.carrier IS NOT NULL THEN 'given back before it began' || jobs._folded_note(f.carrier)
                        ELSE r.error END,
           started_at = NULL, heartbeat_at = NULL, worker = NULL, claim_token_hash = NULL
      FROM unnest(v_ids) AS m (id)
      LEFT JOIN unnest(v_folded, v_carriers) AS f (id, carrier) ON f.id = m.id
     WHERE r.id = m.id
       AND jobs._owned(r.status, r.worker, r.claim_token_hash, hand_back_unheld.worker, v_token_hash)
    RETURNING r.id, r.status;
    SELECT array_agg(r.id) INTO v_cancelled
      FROM jobs.runs AS r WHERE r.id = ANY (v_ids) AND r.status = 'CANCELLED';
    IF v_cancelled IS NOT NULL THEN
        PERFORM jobs._cascade_dependency_failure(v_cancelled);  -- runs waiting on them
    END IF;
    PERFORM jobs._notify();  -- the runs handed back are claimable now
END $$;
COMMENT ON FUNCTION jobs.hand_back_unheld(bigint[], text, text) IS 'For a worker that lost the answer of a claim: every run still RUNNING for worker (and its claim_token, if claimed with one) other than the held ones goes back to QUEUED unchanged (same attempt, scheduled_for), or to CANCELLED if its cancellation was requested or its unique key has a QUEUED run already (its error naming that run; READ COMMITTED only, 25000); waits for the worker''s claims in progress (55P03 after 5 s, nothing changed). Returns (run_id, status).';

-- Mark a run COMPLETED; false when the run is not RUNNING for this worker (fenced). One row
-- found by id: its lock is the update's own. A repeat of this worker's own completion (sent
-- again because its answer was lost with the connection) is true too, and changes nothing: a
-- run is COMPLETED for a worker and claim token only by that worker's completion.
CREATE OR REPLACE FUNCTION jobs.complete(run_id bigint, worker text, result jsonb DEFAULT NULL, claim_token text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET enable_seqscan = off
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_token_hash bytea := jobs._fence_hash(complete.worker, complete.claim_token);
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN  -- (an expression: no statement)
        PERFORM jobs._require_read_committed('jobs.complete');  -- the runs waiting on it (flow.sql)
    END IF;
    IF complete.run_id IS NULL OR complete.run_id < 1 THEN
        PERFORM jobs._check_range('run_id', complete.run_id, 1, 9223372036854775807);
    END IF;
    IF complete.result IS NOT NULL THEN   -- (nested: the subquery makes the test a statement)
        IF octet_length(complete.result::text) > (SELECT c.max_payload_bytes FROM jobs.config AS c) THEN
            RAISE EXCEPTION 'result is larger than jobs.config.max_payload_bytes' USING ERRCODE = '22023';
        END IF;
        -- As deep as a payload may be: a driver reading the run back decodes it recursively.
        IF jsonb_path_exists(complete.result, 'strict $.**{100} ? (@.type() == "object" || @.type() == "array")') THEN
            RAISE EXCEPTION 'result nests deeper than 100 levels of arrays and objects' USING ERRCODE = '22023';
        END IF;
    END IF;
    UPDATE jobs.runs AS r
       SET status = 'COMPLETED', finished_at = now(), result = complete.result
     WHERE r.id = complete.run_id
       AND jobs._owned(r.status, r.worker, r.claim_token_hash, complete.worker, v_token_hash);
    IF NOT FOUND THEN
        RETURN EXISTS (SELECT FROM jobs.runs AS r
                        WHERE r.id = complete.run_id AND r.status = 'COMPLETED' AND r.worker = complete.worker
                          AND r.claim_token_hash IS NOT DISTINCT FROM v_token_hash);
    END IF;
    IF EXISTS (SELECT FROM jobs.runs AS r WHERE r.blocked) THEN  -- runs waiting on it (flow.sql)
        PERFORM jobs._release_dependents(ARRAY[complete.run_id]);
    END IF;
    RETURN TRUE;
END $$;
COMMENT ON FUNCTION jobs.complete(bigint, text, jsonb, text) IS 'RUNNING -> COMPLETED if the run is still owned by worker (and its claim_token, if it was claimed with one); true also for a run this worker already completed (a repeat whose first answer was lost), changing nothing; returns false (and changes nothing) otherwise.';

-- Complete many runs of one worker in one statement; returns the ids that were completed, and
-- those this worker had completed already (a repeat whose answer was lost, as jobs.complete).
-- The UPDATE locks its rows in id order, as jobs._hold_own_runs does (a heartbeat on another
-- connection skips the rows it holds instead of waiting): it can only read runs_pkey (sequential and bitmap scans are off, and
-- every other index of jobs.runs is partial with a predicate the fence does not imply), and
-- an index scan for id = ANY (...) visits the ids in ascending order.
CREATE OR REPLACE FUNCTION jobs.complete_many(run_ids bigint[], worker text, claim_token text DEFAULT NULL)
RETURNS TABLE (run_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_token_hash bytea := jobs._fence_hash(complete_many.worker, complete_many.claim_token);
    v_done bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN  -- (an expression: no statement)
        PERFORM jobs._require_read_committed('jobs.complete_many');  -- the runs waiting on them
    END IF;
    IF complete_many.run_ids IS NULL OR cardinality(complete_many.run_ids) > 10000 THEN
        PERFORM jobs._check_run_ids(complete_many.run_ids, 10000);
    END IF;
    RETURN QUERY
    UPDATE jobs.runs AS r SET status = 'COMPLETED', finished_at = now()
     WHERE r.id = ANY (complete_many.run_ids)
       AND jobs._owned(r.status, r.worker, r.claim_token_hash, complete_many.worker, v_token_hash)
    RETURNING r.id;
    GET DIAGNOSTICS v_done = ROW_COUNT;
    -- The others: those this worker completed in an earlier transaction count too (a repeat whose
    -- answer was lost). Finished before this transaction began: not the ones just completed.
    IF v_done < cardinality(complete_many.run_ids) THEN
        RETURN QUERY
        SELECT r.id FROM jobs.runs AS r
         WHERE r.id = ANY (complete_many.run_ids)
           AND r.status = 'COMPLETED' AND r.worker = complete_many.worker
           AND r.claim_token_hash IS NOT DISTINCT FROM v_token_hash AND r.finished_at < now();
    END IF;
    -- Runs waiting on them (flow.sql); it releases only runs whose dependencies all COMPLETED.
    IF v_done > 0 AND EXISTS (SELECT FROM jobs.runs AS r WHERE r.blocked) THEN
        PERFORM jobs._release_dependents(complete_many.run_ids);
    END IF;
END $$;
COMMENT ON FUNCTION jobs.complete_many(bigint[], text, text) IS 'Batch form of jobs.complete (no results): completes the runs still RUNNING for worker (and its claim_token, if they were claimed with one), returns their ids and those of the runs this worker had completed already (a repeat whose answer was lost).';

-- A worker saw cancel_requested and stopped: RUNNING -> CANCELLED. A repeat of this worker's own
-- acknowledgement (its answer lost with the connection) is true too, changing nothing: a run is
-- CANCELLED for a worker and claim token only by that worker's acknowledgement.
CREATE OR REPLACE FUNCTION jobs.acknowledge_cancel(
    run_id bigint, worker text, message text DEFAULT NULL, claim_token text DEFAULT NULL
)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET enable_seqscan = off
SET jit = off AS $$
#variable_conflict use_column
BEGIN
    IF NOT jobs._hold_own_run(acknowledge_cancel.run_id, acknowledge_cancel.worker, acknowledge_cancel.claim_token) THEN
        RETURN EXISTS (SELECT FROM jobs.runs AS r
                        WHERE r.id = acknowledge_cancel.run_id AND r.status = 'CANCELLED'
                          AND r.worker = acknowledge_cancel.worker
                          AND r.claim_token_hash IS NOT DISTINCT FROM
                              jobs._fence_hash(acknowledge_cancel.worker, acknowledge_cancel.claim_token));
    END IF;
    UPDATE jobs.runs AS r
       SET status = 'CANCELLED', finished_at = now(),
           error = left(coalesce(acknowledge_cancel.message, 'cancelled at a checkpoint'), 10000)
     WHERE r.id = acknowledge_cancel.run_id AND r.cancel_requested;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    PERFORM jobs._cascade_dependency_failure(ARRAY[acknowledge_cancel.run_id]);
    RETURN TRUE;
END $$;
COMMENT ON FUNCTION jobs.acknowledge_cancel(bigint, text, text, text) IS 'The owning worker (with its claim_token, if the run was claimed with one) stopped a run whose cancellation was requested: RUNNING -> CANCELLED. True also for a run this worker already cancelled (a repeat whose answer was lost), changing nothing. False if fenced or not requested.';

-- A worker gives back runs it claimed but whose job never began (claimed ahead of a free slot,
-- then the worker stopped): RUNNING -> QUEUED as the claim found them. The same attempt, and the
-- same scheduled_for, so the run keeps its place in the claim order and its lateness counts from
-- when it was due, not from the give-back (jobs.snooze, which requeues at now() + delay, is for
-- a job that began and asks to run later). The starts the claim counted for them in rate
-- limits' windows (jobs._rate_starts, one row per claim and group, at their started_at) are
-- taken back: they never started, and would otherwise hold the window full for its period.
-- Fenced as snooze is; a run whose cancellation was requested stays with the worker. A run of
-- a unique key whose key has a QUEUED run already (enqueued with unique_while => 'queued' while
-- this one was claimed) folds into it instead: CANCELLED, its error naming that run (retry.sql,
-- "One QUEUED run per unique key"). Returns the ids given back.
CREATE OR REPLACE FUNCTION jobs.unclaim(run_ids bigint[], worker text, claim_token text DEFAULT NULL)
RETURNS TABLE (run_id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_keyed boolean;
    v_mine bigint[];
    v_folded bigint[];
    v_carriers bigint[];
BEGIN
    -- Unique keys before rows, as jobs.enqueue takes them (retry.sql): a run whose key has a
    -- QUEUED run already folds into it instead of going back beside it.
    IF unclaim.run_ids IS NOT NULL AND cardinality(unclaim.run_ids) <= 10000 THEN
        v_keyed := jobs._lock_unique_keys(unclaim.run_ids);
    END IF;
    v_mine := jobs._hold_own_runs(unclaim.run_ids, unclaim.worker, unclaim.claim_token);
    PERFORM jobs._give_back_starts(array(SELECT r.id FROM jobs.runs AS r
                                          WHERE r.id = ANY (v_mine) AND NOT r.cancel_requested));
    IF v_keyed THEN
        SELECT array_agg(f.run_id), array_agg(f.carrier) INTO v_folded, v_carriers
          FROM jobs._fold_given_back(v_mine) AS f;
    END IF;
    RETURN QUERY
    UPDATE jobs.runs AS r
       SET status = CASE WHEN f.carrier IS NULL THEN 'QUEUED' ELSE 'CANCELLED' END::jobs.run_status,
           finished_at = CASE WHEN f.carrier IS NOT NULL THEN now() END,
           error = CASE WHEN f.carrier IS NOT NULL THEN 'given back before it began' || jobs._folded_note(f.carrier)
                        ELSE r.error END,
           started_at = NULL, heartbeat_at = NULL, worker = NULL, claim_token_hash = NULL
      FROM unnest(v_mine) AS m (id)
      LEFT JOIN unnest(v_folded, v_carriers) AS f (id, carrier) ON f.id = m.id
     WHERE r.id = m.id AND NOT r.cancel_requested
    RETURNING r.id;
    PERFORM jobs._notify_if(FOUND);
END $$;
COMMENT ON FUNCTION jobs.unclaim(bigint[], text, text) IS 'Give back runs claimed but never begun: RUNNING -> QUEUED with the same attempt and scheduled_for, no owner, for the runs among run_ids still RUNNING for worker (and its claim_token, if they were claimed with one) and not asked to cancel, and take back the starts their claim counted against rate limits; a run of a unique key that has a QUEUED run already ends CANCELLED instead, its error naming that run (READ COMMITTED only, 25000); returns their ids. Raises 22023 naming run_ids (NULL or over 10,000), worker or claim_token.';

-- When the next QUEUED run this worker could claim becomes due, so an idle worker sleeps until
-- then: of these kinds, in these queues, within the login's scope (jobs.worker_scopes), not in
-- a paused queue and not waiting on dependencies, as jobs.claim would hand it. Resuming a queue
-- and releasing dependents notify, so such runs wake the worker when they become claimable.
-- Reads the claim index once per distinct priority (a loose index scan); runs already due
-- are the claim's business and are not reported. Its plan is generic (made once per session),
-- and with sorts disabled: otherwise, for a priority's first future run, the planner picks a
-- bitmap scan of every future run of that priority and a sort, which costs each idle cycle of
-- every worker the whole scheduled backlog; in index order the first row that passes ends it.
-- Nothing in it has to sort, so nothing is priced as a disabled sort (jit off all the same).
DROP FUNCTION IF EXISTS jobs.next_due(text[]);
CREATE OR REPLACE FUNCTION jobs.next_due(kinds text[] DEFAULT NULL, queues text[] DEFAULT NULL)
RETURNS TABLE (next_at timestamptz, db_now timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET jit = off AS $$
#variable_conflict use_column
BEGIN
    -- Kinds and queues as jobs.claim takes them, tested by expressions (an idle worker asks
    -- before each claim); the helper says what is wrong.
    IF (next_due.kinds IS NOT NULL
        AND (cardinality(next_due.kinds) NOT BETWEEN 1 AND 1000 OR array_ndims(next_due.kinds) > 1
             OR array_position(next_due.kinds, NULL) IS NOT NULL OR array_position(next_due.kinds, '') IS NOT NULL))
       OR (next_due.queues IS NOT NULL
           AND (cardinality(next_due.queues) NOT BETWEEN 1 AND 1000 OR array_ndims(next_due.queues) > 1
                OR array_position(next_due.queues, NULL) IS NOT NULL OR array_position(next_due.queues, '') IS NOT NULL))
    THEN
        PERFORM jobs._check_names('kinds', next_due.kinds), jobs._check_names('queues', next_due.queues);
    END IF;
    RETURN QUERY
    WITH RECURSIVE seen AS (
        SELECT s.kinds AS scope_kinds, s.queues AS scope_queues,
               coalesce((SELECT array_agg(q.name) FROM jobs.paused_queues AS q), '{}') AS paused
          FROM (SELECT) AS one
          LEFT JOIN jobs.worker_scopes AS s ON s.role = session_user
    ),
    priorities AS (
        (SELECT r.priority FROM jobs.runs AS r WHERE r.status = 'QUEUED'
          ORDER BY r.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT r.priority FROM jobs.runs AS r
                 WHERE r.status = 'QUEUED' AND r.priority < p.priority
                 ORDER BY r.priority DESC LIMIT 1)
          FROM priorities AS p
         WHERE p.priority IS NOT NULL
    )
    SELECT min((SELECT r.scheduled_for FROM jobs.runs AS r
                 WHERE r.status = 'QUEUED' AND r.priority = p.priority AND r.scheduled_for > now()
                   AND (next_due.kinds IS NULL OR r.kind = ANY (next_due.kinds))
                   AND (next_due.queues IS NULL OR r.queue = ANY (next_due.queues))
                   AND (w.scope_kinds IS NULL OR r.kind = ANY (w.scope_kinds))
                   AND (w.scope_queues IS NULL OR r.queue = ANY (w.scope_queues))
                   AND r.queue <> ALL (w.paused)
                   AND NOT r.blocked
                 ORDER BY r.priority DESC, r.scheduled_for LIMIT 1)),
           clock_timestamp()
      FROM priorities AS p, seen AS w
     WHERE p.priority IS NOT NULL;
END $$;
COMMENT ON FUNCTION jobs.next_due(text[], text[]) IS 'Worker: the earliest scheduled_for after now among the QUEUED runs it could claim: of these kinds and in these queues (NULL = any), within its login''s scope, not in a paused queue, not waiting on dependencies (NULL when none), and the server clock, so a worker can sleep until exactly then.';
