-- ===========================================================================
-- retry.sql: failing a run and retrying it as a NEW row.
--
-- A failed attempt keeps its own error and reason; if the kind's policy allows,
-- attempt n+1 is inserted QUEUED with retry_of = n and scheduled_for = now() +
-- backoff (exponential, capped, with jitter): the future scheduled_for is the
-- delay, no timers. Policy (jobs.retry_policies, per kind):
--   * deny is checked first and always wins;
--   * allow NULL allows every class; otherwise one of the classes must be listed;
--   * lost workers (HeartbeatLost, Orphaned) are infrastructure failures: they
--     are retried while attempts remain unless denied, whatever allow says;
--   * attempts: runs.max_attempts, else the policy's, else jobs.config's.
-- The caller passes the error's class and its base classes, and the failure
-- reason is appended, so 'Error' or 'Timeout' can be allowed or denied too.
-- The reaper passes none: a run it failed for Timeout counts as the class
-- JobTimeout and its base Exception (what the Python driver reports for a timeout seen at a
-- checkpoint),
-- so one policy entry decides both; a hung job is the job's failure, not the
-- infrastructure's, so unlike HeartbeatLost it needs the policy's allow.
-- ===========================================================================

-- Private: may a failure with these error classes be retried under this policy?
CREATE OR REPLACE FUNCTION jobs._retry_allowed(
    deny text[], allow text[], classes text[], infrastructure boolean
)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN NOT coalesce(deny && classes, FALSE)
           AND (infrastructure OR allow IS NULL OR allow && classes);
END $$;
COMMENT ON FUNCTION jobs._retry_allowed(text[], text[], text[], boolean) IS 'Private: deny wins; then infrastructure failures, a NULL allow list, or a listed class allow a retry.';

-- Private: delay before attempt (attempt + 1): initial * factor^(attempt-1), capped, +-jitter.
-- Whatever the policy or jobs.config hold, the delay stays under ~200 years (100 before jitter)
-- and factor^n finite: now() + delay must never overflow, or every jobs.fail() and jobs.reap()
-- that meets the kind would raise and roll back, leaving its runs stuck RUNNING.
CREATE OR REPLACE FUNCTION jobs._backoff(
    initial interval, factor double precision, cap interval, jitter double precision, attempt integer
)
RETURNS interval
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN make_interval(secs => least(
               extract(epoch FROM initial)::double precision
               * power(least(factor, 100), least(attempt - 1, 60)),
               extract(epoch FROM cap)::double precision,
               3155760000)  -- 100 years
           * (1 + least(jitter, 1) * (2 * random() - 1)));
END $$;
COMMENT ON FUNCTION jobs._backoff(interval, double precision, interval, double precision, integer) IS 'Private: exponential backoff for the retry after attempt: min(initial * factor^(attempt-1), cap, 100 years), spread by +-jitter.';

-- Private: insert the next attempt for each given FAILED run that its policy allows to retry.
-- These helpers are PL/pgSQL, whose statements a session plans once: every pgtick function
-- pins search_path, so a SQL-language one is never inlined and was planned at every call
-- (a third of a jobs.fail).
CREATE OR REPLACE FUNCTION jobs._enqueue_retries(run_ids bigint[], error_classes text[])
RETURNS TABLE (retry_of bigint, retry_run_id bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    -- The definitions' keys first, shared (jobs._definition_key): a jobs.undefine under way
    -- makes this wait, and the row lock below then finds its definition gone; one that comes
    -- later waits for this commit and cancels the retry.
    PERFORM pg_advisory_xact_lock_shared(k.key)
       FROM (SELECT DISTINCT jobs._definition_key(r.definition_id) AS key FROM jobs.runs AS r
              WHERE r.id = ANY (_enqueue_retries.run_ids) AND r.status = 'FAILED'
                AND r.definition_id IS NOT NULL
              ORDER BY 1) AS k;
    RETURN QUERY
    INSERT INTO jobs.runs AS n (
        definition_id, kind, payload, priority, max_attempts, timeout, heartbeat_timeout,
        origin, attempt, retry_of, queue, concurrency_key, unique_key, occurrence_at, scheduled_for
    )
    SELECT r.definition_id, r.kind, r.payload, r.priority, r.max_attempts, r.timeout,
           r.heartbeat_timeout, 'retry', r.attempt + 1, r.id, r.queue, r.concurrency_key, r.unique_key,
           r.occurrence_at,
           now() + jobs._backoff(coalesce(p.backoff_initial, c.backoff_initial),
                                 coalesce(p.backoff_factor, 2),
                                 coalesce(p.backoff_max, c.backoff_max),
                                 coalesce(p.jitter, 0.2),
                                 r.attempt)
      FROM jobs.runs AS r
     CROSS JOIN jobs.config AS c
      LEFT JOIN jobs.retry_policies AS p ON p.kind = r.kind
     WHERE r.id = ANY (_enqueue_retries.run_ids)
       AND r.status = 'FAILED'
       AND NOT r.cancel_requested   -- a run asked to stop is not started again
       AND r.attempt < coalesce(r.max_attempts, p.max_attempts, c.max_attempts)
       -- A deleted definition's run is not retried: this row lock finds a delete committed
       -- meanwhile (the key above made it wait for the delete, or the delete waits for us).
       AND (r.definition_id IS NULL
            OR EXISTS (SELECT FROM jobs.definitions AS d WHERE d.id = r.definition_id FOR KEY SHARE))
       AND jobs._retry_allowed(p.deny, p.allow,
                               coalesce(_enqueue_retries.error_classes,
                                        CASE WHEN r.failure_reason = 'Timeout' THEN '{JobTimeout,Exception}'::text[]
                                             ELSE '{}'::text[] END)
                               || r.failure_reason,
                               r.failure_reason IN ('HeartbeatLost', 'Orphaned'))
    ON CONFLICT (retry_of) WHERE retry_of IS NOT NULL DO NOTHING
    RETURNING n.retry_of, n.id;
END $$;
COMMENT ON FUNCTION jobs._enqueue_retries(bigint[], text[]) IS 'Private: set-based retry-row insert for FAILED runs, by each kind''s policy (none for a run whose definition was deleted or whose cancellation was requested; the retry keeps the run''s queue, keys and occurrence); returns (retry_of, retry_run_id). error_classes NULL (the reaper): JobTimeout and Exception for a Timeout (as the Python driver reports a timeout), none otherwise; the failure reason is always appended.';

-- ---------------------------------------------------------------------------
-- One QUEUED run per unique key: a retry or a snooze folds into the run already queued.
-- ---------------------------------------------------------------------------
-- jobs.enqueue of a unique key that has a QUEUED run adds no run: it returns that run (or
-- updates it: replace, debounce). A retry queued by policy, or a snoozed run going back to the
-- queue, is the key's job asked for again, so it does the same: where a QUEUED run of the key
-- already waits (one enqueued with unique_while => 'queued' while this one ran), no second
-- QUEUED run is made. The run that failed (or snoozed) ends, its error naming the run that
-- carries on; that run keeps its payload, time and attempts, as after an enqueue with
-- on_conflict ignore. Nothing is lost (the key's job still runs, once) and nothing is done
-- twice. The exception: a run that other runs wait on (depends_on its retry chain) keeps its
-- own retry or snooze, since they wait on its chain's outcome, not on the key's.
-- The callers hold the key's lock (jobs._unique_key), taken before the run's row as
-- jobs.enqueue takes them, so an enqueue and a retry or snooze of one key are serialized: the
-- later one sees the QUEUED run the earlier one made.

-- Private: the QUEUED run of a kind and unique key that carries on the job of a run of the key
-- instead of its retry or snooze: the newest (as jobs.enqueue finds it) other than the other_than
-- ids; NULL if none. Call it holding the key's lock, in READ COMMITTED.
CREATE OR REPLACE FUNCTION jobs._queued_run_of_key(kind text, unique_key text, other_than bigint[])
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT q.id FROM jobs.runs AS q
     WHERE q.kind = _queued_run_of_key.kind AND q.unique_key = _queued_run_of_key.unique_key
       AND q.status = 'QUEUED' AND q.id <> ALL (_queued_run_of_key.other_than)
     ORDER BY q.id DESC LIMIT 1
$$;
COMMENT ON FUNCTION jobs._queued_run_of_key(text, text, bigint[]) IS 'Private: the newest QUEUED run of this kind and unique key other than the other_than ids (the run that carries on the key''s job instead of a retry or snooze of another run of the key), or NULL. Call it holding the key''s lock (jobs._unique_key).';

-- Private: whether runs wait (depends_on) on the retry chain of run_id: such a run keeps its own
-- retry or snooze, whose outcome they wait for.
CREATE OR REPLACE FUNCTION jobs._waited_on_chain(run_id bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT FROM jobs.runs AS d WHERE d.blocked)
           AND EXISTS (SELECT FROM jobs.runs AS d
                        WHERE d.blocked AND d.depends_on && jobs._chain_back(ARRAY[_waited_on_chain.run_id]))
$$;
COMMENT ON FUNCTION jobs._waited_on_chain(bigint) IS 'Private: whether a blocked run depends on run_id or an earlier attempt of its chain.';

-- Private: the text appended to the error of a run whose retry, snooze or give-back folded into
-- carrier.
CREATE OR REPLACE FUNCTION jobs._folded_note(carrier bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format(' [not queued again: run %s, already queued for the same unique_key, does its job]', carrier)
$$;
COMMENT ON FUNCTION jobs._folded_note(bigint) IS 'Private: the text appended to the error of a run whose retry, snooze or give-back (jobs.unclaim, jobs.hand_back_unheld) folded into the QUEUED run carrier of its unique key.';

-- Private: of these runs of a unique key (ids, with the run whose retry chain others may wait on,
-- their kinds and keys), those that fold into another QUEUED run of their key instead of going
-- back to the queue themselves: the newest queued one other than the other_than ids, or the
-- first of these runs (in id order) that goes back for the key. A run whose chain other runs
-- wait on never folds, and may carry the later ones of its key. Returns (run_id, carrier).
CREATE OR REPLACE FUNCTION jobs._carriers(
    ids bigint[], chains bigint[], kinds text[], unique_keys text[], other_than bigint[]
)
RETURNS TABLE (run_id bigint, carrier bigint)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    v_run record;
    v_carrier bigint;
    v_kept_keys text[] := '{}';   -- the keys of the runs that go back, and
    v_kept_ids bigint[] := '{}';  --   the first of each key
    v_key text;
BEGIN
    FOR v_run IN
        SELECT u.id, u.chain, u.kind, u.unique_key
          FROM unnest(_carriers.ids, _carriers.chains, _carriers.kinds, _carriers.unique_keys)
               AS u (id, chain, kind, unique_key)
         ORDER BY u.id
    LOOP
        v_key := jsonb_build_array(v_run.kind, v_run.unique_key)::text;
        v_carrier := coalesce(jobs._queued_run_of_key(v_run.kind, v_run.unique_key, _carriers.other_than),
                              v_kept_ids[array_position(v_kept_keys, v_key)]);
        IF v_carrier IS NULL OR jobs._waited_on_chain(v_run.chain) THEN
            IF v_key <> ALL (v_kept_keys) THEN
                v_kept_keys := v_kept_keys || v_key;
                v_kept_ids := v_kept_ids || v_run.id;
            END IF;
            CONTINUE;
        END IF;
        run_id := v_run.id;
        carrier := v_carrier;
        RETURN NEXT;
    END LOOP;
END $$;
COMMENT ON FUNCTION jobs._carriers(bigint[], bigint[], text[], text[], bigint[]) IS 'Private: (run_id, carrier) for each of these runs of a unique key whose key has another QUEUED run (not one of other_than), or an earlier one of these runs going back, that does its job instead; never a run whose chain (chains) other runs wait on.';

-- Private: after jobs._enqueue_retries queued these retries (holding their keys' locks): each
-- retry of a unique key that already had another QUEUED run is taken back, and the run that
-- failed notes the run that carries on; so are all but the first of several retries of one key
-- queued together (a reap of two runs of one key), which fold into the first. A retry of a run
-- that other runs wait on stays. Returns (retry_of, carrier) of the retries taken back.
CREATE OR REPLACE FUNCTION jobs._fold_retries(retry_ids bigint[])
RETURNS TABLE (retry_of bigint, carrier bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_fold record;
BEGIN
    PERFORM jobs._require_read_committed('retrying a run with a unique_key');
    FOR v_fold IN
        SELECT f.run_id, f.carrier, n.retry_of
          FROM (SELECT array_agg(n.id) AS ids, array_agg(n.retry_of) AS chains, array_agg(n.kind::text) AS kinds,
                       array_agg(n.unique_key::text) AS unique_keys
                  FROM jobs.runs AS n
                 WHERE n.id = ANY (_fold_retries.retry_ids) AND n.unique_key IS NOT NULL AND n.status = 'QUEUED'
               ) AS a
         CROSS JOIN LATERAL jobs._carriers(a.ids, a.chains, a.kinds, a.unique_keys, _fold_retries.retry_ids) AS f
          JOIN jobs.runs AS n ON n.id = f.run_id
    LOOP
        DELETE FROM jobs.runs AS n WHERE n.id = v_fold.run_id;   -- made by this transaction
        UPDATE jobs.runs AS r SET error = coalesce(r.error, '') || jobs._folded_note(v_fold.carrier)
         WHERE r.id = v_fold.retry_of;
        retry_of := v_fold.retry_of;
        carrier := v_fold.carrier;
        RETURN NEXT;
    END LOOP;
END $$;
COMMENT ON FUNCTION jobs._fold_retries(bigint[]) IS 'Private: take back each of these new retries whose unique key has another QUEUED run (one queued before, or the first retry of the key in this batch), unless runs wait on its chain; the failed run''s error names the run that carries on. Returns (retry_of, carrier). READ COMMITTED only (25000); hold the keys'' locks.';

-- Private: lock the unique keys of these runs (those RUNNING with a key), in key order, before
-- their rows: a run going back to the queue unstarted (jobs.unclaim, jobs.hand_back_unheld)
-- checks its key's QUEUED run under the key's lock, as jobs.enqueue and jobs.fail do.
CREATE OR REPLACE FUNCTION jobs._lock_unique_keys(run_ids bigint[]) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_keyed boolean;
BEGIN
    SELECT count(pg_advisory_xact_lock(k.key)) > 0 INTO v_keyed
      FROM (SELECT DISTINCT jobs._unique_key(r.kind, r.unique_key) AS key FROM jobs.runs AS r
             WHERE r.id = ANY (_lock_unique_keys.run_ids) AND r.status = 'RUNNING' AND r.unique_key IS NOT NULL
             ORDER BY 1) AS k;
    IF v_keyed THEN
        PERFORM jobs._require_read_committed('giving back a run with a unique_key');
    END IF;
    RETURN v_keyed;
END $$;
COMMENT ON FUNCTION jobs._lock_unique_keys(bigint[]) IS 'Private: take the unique-key locks (jobs._unique_key) of these runs that are RUNNING with a key, in key order; true if there were any (then READ COMMITTED only, 25000).';

-- Private: of these runs going back to the queue unstarted (RUNNING, their keys locked), those
-- that fold into a QUEUED run of their unique key instead: one queued already, or the first of
-- this batch that goes back for the key; not a run asked to cancel, nor one others wait on.
-- Returns (run_id, carrier).
CREATE OR REPLACE FUNCTION jobs._fold_given_back(run_ids bigint[])
RETURNS TABLE (run_id bigint, carrier bigint)
LANGUAGE sql STABLE AS $$
    SELECT f.run_id, f.carrier
      FROM (SELECT array_agg(r.id) AS ids, array_agg(r.kind::text) AS kinds, array_agg(r.unique_key::text) AS unique_keys
              FROM jobs.runs AS r
             WHERE r.id = ANY (_fold_given_back.run_ids) AND r.unique_key IS NOT NULL AND NOT r.cancel_requested
           ) AS a
     CROSS JOIN LATERAL jobs._carriers(a.ids, a.ids, a.kinds, a.unique_keys, '{}') AS f
$$;
COMMENT ON FUNCTION jobs._fold_given_back(bigint[]) IS 'Private: (run_id, carrier) for each of these runs of a unique key going back to the queue unstarted whose key has a QUEUED run already (or an earlier run of this batch going back), unless it was asked to cancel or runs wait on it: it ends CANCELLED naming carrier instead.';

-- Private: the locks a failure takes before the rows of the runs it fails, in this order.
-- First their definitions' keys, shared: jobs.undefine holds a key while it waits for the rows
-- of the runs it cancels, so asking for the key with a run held (a retry does) could close a
-- cycle. Then their unique keys (a run's kind and key never change), before the rows too: an
-- enqueue of a key holds it while it waits for a run's row, and must see the retry queued with
-- the failure once it has the key, not only the run it waited for, FAILED. Keys in order, so
-- two failures of several runs take them alike.
CREATE OR REPLACE FUNCTION jobs._lock_keys_to_fail(runs bigint[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(k.key)
       FROM (SELECT DISTINCT jobs._definition_key(r.definition_id) AS key FROM jobs.runs AS r
              WHERE r.id = ANY(_lock_keys_to_fail.runs) AND r.definition_id IS NOT NULL
              ORDER BY 1) AS k;
    PERFORM pg_advisory_xact_lock(k.key)
       FROM (SELECT DISTINCT jobs._unique_key(r.kind, r.unique_key) AS key FROM jobs.runs AS r
              WHERE r.id = ANY(_lock_keys_to_fail.runs) AND r.unique_key IS NOT NULL
              ORDER BY 1) AS k;
END $$;
COMMENT ON FUNCTION jobs._lock_keys_to_fail(bigint[]) IS 'Private: before failing these runs, lock their definitions'' keys (shared), then their unique keys, in key order: the order jobs.fail and jobs.reap_worker take them in, ahead of the rows.';

-- Fail a run this worker owns; returns the retry row, the failed row if no retry is allowed, or NULL if fenced
-- (a repeat of the worker's own failure: the same answer again).
CREATE OR REPLACE FUNCTION jobs.fail(
    run_id bigint,
    worker text,
    error_classes text[] DEFAULT '{}',
    message text DEFAULT NULL,
    reason text DEFAULT 'Error',
    claim_token text DEFAULT NULL
)
RETURNS jobs.runs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET enable_seqscan = off  -- plans made on a small jobs.runs (worker.sql)
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_failed jobs.runs;
    v_retry jobs.runs;
    v_retry_id bigint;
    v_token_hash bytea := jobs._fence_hash(fail.worker, fail.claim_token);  -- 22023 naming the field
    v_mine boolean;
BEGIN
    IF fail.reason IS NULL OR fail.reason NOT IN ('Error', 'Timeout') THEN
        RAISE EXCEPTION 'reason must be Error or Timeout, got %', jobs._shown(fail.reason)
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(fail.error_classes) > 100 OR array_ndims(fail.error_classes) > 1 OR
       EXISTS (SELECT FROM unnest(fail.error_classes) AS k WHERE k IS NULL OR length(k) NOT BETWEEN 1 AND 200) THEN
        RAISE EXCEPTION 'error_classes must hold at most 100 non-empty names of up to 200 characters in one list'
            USING ERRCODE = '22023';
    END IF;

    IF fail.run_id IS NULL OR fail.run_id < 1 THEN
        PERFORM jobs._check_range('run_id', fail.run_id, 1, 9223372036854775807);
    END IF;
    -- The keys are locked only for a run that is this worker's as last committed (the claim
    -- that gave it the run has committed): a fenced call (a worker reaped meanwhile, or another
    -- login naming the run) takes no lock, so it holds up no enqueue of the run's unique key and
    -- no failure of its real owner, however long its transaction stays open. Then the fence
    -- again, with the row locked.
    v_mine := EXISTS (SELECT FROM jobs.runs AS r
                       WHERE r.id = fail.run_id
                         AND jobs._owned(r.status, r.worker, r.claim_token_hash, fail.worker, v_token_hash));
    IF v_mine THEN
        PERFORM jobs._lock_keys_to_fail(ARRAY[fail.run_id]);
        v_mine := jobs._hold_own_run(fail.run_id, fail.worker, fail.claim_token);
    END IF;
    IF NOT v_mine THEN
        -- Not RUNNING for this worker. A repeat of its own failure (sent again because the
        -- answer was lost with the connection) gets that failure's answer again, changing
        -- nothing: the run FAILED for this worker and token with this reason and message
        -- (the reaper's failures have reasons and messages of their own). Else: fenced.
        SELECT r.* INTO v_failed FROM jobs.runs AS r
         WHERE r.id = fail.run_id AND r.status = 'FAILED' AND r.worker = fail.worker
           AND r.claim_token_hash IS NOT DISTINCT FROM v_token_hash
           AND r.failure_reason = fail.reason
           AND (r.error IS NOT DISTINCT FROM left(coalesce(fail.message, fail.error_classes[1], fail.reason), 10000)
                -- (its retry folded into a QUEUED run of its unique key: the error names that run)
                OR (r.unique_key IS NOT NULL
                    AND starts_with(r.error, left(coalesce(fail.message, fail.error_classes[1], fail.reason), 10000)
                                             || ' [not queued again: run ')));
        IF NOT FOUND THEN
            RETURN NULL;  -- fenced: reaped, cancelled, or never ours
        END IF;
        -- The retry its failure queued, inserted in that transaction; not one an operator
        -- queued later (jobs.retry), which the first answer did not name.
        SELECT r.* INTO v_retry FROM jobs.runs AS r
         WHERE r.retry_of = fail.run_id AND r.created_at = v_failed.finished_at;
        IF v_retry.id IS NOT NULL THEN
            RETURN v_retry;
        END IF;
        RETURN v_failed;
    END IF;
    UPDATE jobs.runs AS r
       SET status = 'FAILED', finished_at = now(), failure_reason = fail.reason,
           error = left(coalesce(fail.message, fail.error_classes[1], fail.reason), 10000)
     WHERE r.id = fail.run_id
    RETURNING r.* INTO v_failed;

    SELECT x.retry_run_id INTO v_retry_id
      FROM jobs._enqueue_retries(ARRAY[v_failed.id], coalesce(fail.error_classes, '{}')) AS x;
    -- A run of a unique key whose key has a QUEUED run already: that run does the job (above).
    IF v_retry_id IS NOT NULL AND v_failed.unique_key IS NOT NULL THEN   -- (no statement otherwise)
        IF EXISTS (SELECT FROM jobs._fold_retries(ARRAY[v_retry_id])) THEN
            SELECT r.* INTO v_failed FROM jobs.runs AS r WHERE r.id = v_failed.id;
            RETURN v_failed;   -- nothing waits on it (else it keeps its retry): no cascade
        END IF;
    END IF;
    IF v_retry_id IS NULL THEN
        PERFORM jobs._cascade_dependency_failure(ARRAY[v_failed.id]);  -- failed for good
        RETURN v_failed;
    END IF;
    SELECT r.* INTO v_retry FROM jobs.runs AS r WHERE r.id = v_retry_id;
    PERFORM jobs._notify();
    RETURN v_retry;
END $$;
COMMENT ON FUNCTION jobs.fail(bigint, text, text[], text, text, text) IS 'RUNNING -> FAILED (reason Error or Timeout) if owned by worker (and its claim_token, if it was claimed with one); inserts the retry row if the kind''s policy allows. Returns the retry row (QUEUED), the failed row when no retry follows, or NULL when fenced; the same call sent again by the worker whose failure it recorded (its answer lost) gets the same rows again, changing nothing.';

-- Private: the oldest QUEUED or RUNNING run of a kind and unique key (a row of NULLs if none):
-- while there is one, that run does the key's job, and a retry would do it twice.
CREATE OR REPLACE FUNCTION jobs._active_run_of_key(kind text, unique_key text) RETURNS jobs.runs
LANGUAGE sql STABLE AS $$
    SELECT r.* FROM jobs.runs AS r
     WHERE r.kind = _active_run_of_key.kind AND r.unique_key = _active_run_of_key.unique_key
       AND r.status IN ('QUEUED', 'RUNNING')
     ORDER BY r.id LIMIT 1
$$;
COMMENT ON FUNCTION jobs._active_run_of_key(text, text) IS 'Private: the oldest QUEUED or RUNNING run of a kind and unique key, or a row of NULLs; jobs.retry refuses and jobs.retry_many passes over a run of a key that has one.';

-- Operator: retry a FAILED or CANCELLED run now as a new attempt, whatever the policy says.
-- The new attempt's own failures follow the policy again while attempts remain: a run that
-- inherits max_attempts (NULL) keeps inheriting it, and one past its budget gets max_attempts
-- = its attempt (at most 1000, the largest budget), so it is not retried by policy.
CREATE OR REPLACE FUNCTION jobs.retry(run_id bigint) RETURNS jobs.runs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_run jobs.runs;
    v_next jobs.runs;
    v_deps text := 'met';
    v_key record;
BEGIN
    -- A run of a unique key: the key's lock before the run's row, in the order jobs.enqueue and
    -- jobs.fail take them (kind and unique_key never change, so they are read unlocked first).
    SELECT r.kind, r.unique_key INTO v_key FROM jobs.get_run(retry.run_id) AS r;
    IF v_key.unique_key IS NOT NULL THEN
        PERFORM jobs._require_read_committed('retrying a run with a unique_key');
        PERFORM pg_advisory_xact_lock(jobs._unique_key(v_key.kind, v_key.unique_key));
    END IF;
    v_run := jobs._known_run(retry.run_id, TRUE);
    IF v_run.status NOT IN ('FAILED', 'CANCELLED') THEN
        RAISE EXCEPTION 'run % is %, only FAILED or CANCELLED runs can be retried', v_run.id, v_run.status
            USING ERRCODE = '22023';
    END IF;
    SELECT r.* INTO v_next FROM jobs.runs_all AS r WHERE r.retry_of = v_run.id;
    IF FOUND THEN
        RAISE EXCEPTION 'run % was already retried as run %', v_run.id, v_next.id USING ERRCODE = '22023';
    END IF;
    -- As a retry after a failure: the definition's key, then its row (jobs._hold_definition);
    -- a run of a deleted definition is not queued again, so jobs.undefine keeps its promise.
    IF v_run.definition_id IS NOT NULL AND (jobs._hold_definition(v_run.definition_id, FALSE)).id IS NULL THEN
        RAISE EXCEPTION 'run %''s definition was deleted (jobs.undefine): its runs are not queued again',
            v_run.id USING ERRCODE = '22023';
    END IF;
    -- While a run of its unique key is queued or running (an enqueue of the key since), that
    -- run does the job: a retry would do it twice.
    IF v_run.unique_key IS NOT NULL THEN
        v_next := jobs._active_run_of_key(v_run.kind, v_run.unique_key);
        IF v_next.id IS NOT NULL THEN
            RAISE EXCEPTION 'run % has unique_key %, and run % of that key is %: a retry would do the job twice',
                v_run.id, quote_literal(v_run.unique_key), v_next.id, v_next.status
                USING ERRCODE = '22023',
                      HINT = 'Wait for that run to finish, or cancel it, then retry this one.';
        END IF;
    END IF;
    -- A run that never started waited on its dependencies (or was cancelled while it waited):
    -- its next attempt waits on them too, and is refused while one of them has failed for good.
    -- A run that started had them all completed.
    -- A run it depends on that retention pruned meanwhile has no outcome left to wait on: the
    -- retry is refused as a bad request (the run asked for exists), naming the pruned runs.
    IF v_run.depends_on IS NOT NULL AND v_run.started_at IS NULL THEN
        BEGIN
            v_deps := jobs._dependency_state(v_run.depends_on);
        EXCEPTION WHEN no_data_found THEN
            RAISE EXCEPTION 'run % depends on runs that are no longer kept (pruned by retention): %', v_run.id,
                (SELECT array_agg(d ORDER BY d) FROM unnest(v_run.depends_on) AS d
                  WHERE NOT EXISTS (SELECT FROM jobs.runs_all AS r WHERE r.id = d))
                USING ERRCODE = '22023', COLUMN = 'depends_on',
                      HINT = 'Their outcome is gone: enqueue the work anew.';
        END;
        IF v_deps = 'failed' THEN
            RAISE EXCEPTION 'run % depends on a run that failed or was cancelled (depends_on %): retry that one first',
                v_run.id, v_run.depends_on
                USING ERRCODE = '22023',
                      HINT = 'Its next attempt waits on the retries of the runs it depends on.';
        END IF;
    END IF;
    INSERT INTO jobs.runs AS n (
        definition_id, kind, payload, priority, max_attempts, timeout, heartbeat_timeout,
        origin, attempt, retry_of, queue, concurrency_key, unique_key, occurrence_at, depends_on, blocked,
        trace_context
    )
    VALUES (
        v_run.definition_id, v_run.kind, v_run.payload, v_run.priority,
        -- The run's own budget, unless this attempt is past it (NULL: the policy's or
        -- jobs.config's, as for the run, so a retry after it still follows the policy). Past
        -- it, the budget is the attempt, at most the largest budget (1000): spent either way.
        CASE WHEN v_run.attempt + 1 > coalesce(
                      v_run.max_attempts,
                      (SELECT p.max_attempts FROM jobs.retry_policies AS p WHERE p.kind = v_run.kind),
                      (SELECT c.max_attempts FROM jobs.config AS c))
             THEN least(v_run.attempt + 1, 1000) ELSE v_run.max_attempts END,
        v_run.timeout, v_run.heartbeat_timeout,
        'retry', v_run.attempt + 1, v_run.id, v_run.queue, v_run.concurrency_key, v_run.unique_key,
        v_run.occurrence_at, CASE WHEN v_deps <> 'met' THEN v_run.depends_on END, v_deps = 'pending',
        -- The caller's trace (the column's default), else the run's: read here, since the run
        -- may be in history, where the insert trigger that copies it does not look.
        coalesce(jobs._trace_context(), v_run.trace_context)
    )
    RETURNING n.* INTO v_next;
    PERFORM jobs._notify();
    RETURN v_next;
END $$;
COMMENT ON FUNCTION jobs.retry(bigint) IS 'Operator: queue a FAILED or CANCELLED run again now as attempt n+1 (retry_of = run_id), regardless of its retry policy (its own failures are then retried by policy while attempts remain; an attempt past them ends the chain); a run that never started waits again on the runs it depends on (the retry chains of depends_on). 22023 when the run was already retried, its definition was deleted, a run of its unique_key is queued or running, a run it depends on failed for good or was cancelled (retry that one first), or one it depends on was pruned.';

-- Private: raise 22023 naming both fields unless the cap on a retry's delay is at least the
-- first delay. A cap below it makes every delay the cap, whatever the first delay and the factor
-- say: a policy that reads as one thing and does another. The caller's hint says where the
-- values came from (a default, the row as it was).
CREATE OR REPLACE FUNCTION jobs._check_backoff_order(
    initial_field text, initial interval, max_field text, cap interval, hint text
)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF cap < initial THEN
        RAISE EXCEPTION '% must be at least %, got % % and % %',
            max_field, initial_field, max_field, cap, initial_field, initial
            USING ERRCODE = '22023', COLUMN = regexp_replace(max_field, '^.*[.]', ''), HINT = hint;
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_backoff_order(text, interval, text, interval, text) IS 'Private: raises 22023 naming max_field and initial_field with both values (and the caller''s hint) when the cap on the retry delay is below the first delay, which would make every delay the cap.';

-- Register or replace the retry policy of a kind (the Python driver calls this on registration).
CREATE OR REPLACE FUNCTION jobs.set_retry_policy(
    kind text,
    allow text[] DEFAULT NULL,
    deny text[] DEFAULT '{}',
    max_attempts integer DEFAULT 3,
    backoff_initial interval DEFAULT '10 seconds',
    backoff_factor double precision DEFAULT 2,
    backoff_max interval DEFAULT '1 hour',
    jitter double precision DEFAULT 0.2
)
RETURNS jobs.retry_policies
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_policy jobs.retry_policies;
BEGIN
    PERFORM jobs._check_name('kind', set_retry_policy.kind);
    IF cardinality(set_retry_policy.allow) > 0 THEN   -- NULL: every class; '{}': none
        PERFORM jobs._check_names('allow', set_retry_policy.allow);
    END IF;
    IF cardinality(set_retry_policy.deny) > 0 THEN
        PERFORM jobs._check_names('deny', set_retry_policy.deny);
    END IF;
    PERFORM jobs._check_range('max_attempts', set_retry_policy.max_attempts, 1, 1000);
    IF set_retry_policy.backoff_initial IS NULL OR set_retry_policy.backoff_max IS NULL THEN
        RAISE EXCEPTION 'backoff_initial and backoff_max must be intervals, got NULL' USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_duration('backoff_initial', set_retry_policy.backoff_initial);
    PERFORM jobs._check_duration('backoff_max', set_retry_policy.backoff_max);
    PERFORM jobs._check_backoff_order(
        'backoff_initial', set_retry_policy.backoff_initial, 'backoff_max', set_retry_policy.backoff_max,
        'Every retry delay would be backoff_max. backoff_initial defaults to 10 seconds and '
        || 'backoff_max to 1 hour (not to jobs.config''s values): give both, or a smaller backoff_initial.');
    -- NaN compares greater than every number in PostgreSQL: BETWEEN refuses it and infinities.
    IF set_retry_policy.backoff_factor IS NULL OR set_retry_policy.backoff_factor NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'backoff_factor must be a number between 1 and 100, got %',
            coalesce(set_retry_policy.backoff_factor::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    IF set_retry_policy.jitter IS NULL OR set_retry_policy.jitter NOT BETWEEN 0 AND 1 THEN
        RAISE EXCEPTION 'jitter must be a number between 0 and 1, got %',
            coalesce(set_retry_policy.jitter::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    INSERT INTO jobs.retry_policies AS p (
        kind, allow, deny, max_attempts, backoff_initial, backoff_factor, backoff_max, jitter
    )
    VALUES (
        set_retry_policy.kind, set_retry_policy.allow, coalesce(set_retry_policy.deny, '{}'),
        set_retry_policy.max_attempts, set_retry_policy.backoff_initial,
        set_retry_policy.backoff_factor, set_retry_policy.backoff_max, set_retry_policy.jitter
    )
    ON CONFLICT (kind) DO UPDATE
       SET allow = excluded.allow, deny = excluded.deny, max_attempts = excluded.max_attempts,
           backoff_initial = excluded.backoff_initial, backoff_factor = excluded.backoff_factor,
           backoff_max = excluded.backoff_max, jitter = excluded.jitter, updated_at = now()
    RETURNING p.* INTO v_policy;
    RETURN v_policy;
END $$;
COMMENT ON FUNCTION jobs.set_retry_policy(text, text[], text[], integer, interval, double precision, interval, double precision) IS 'Create or replace the retry policy of a kind. Delay before attempt n+1: backoff_initial * backoff_factor^(n-1), at most backoff_max, spread by +-jitter. 22023 naming the field for a value out of bounds (backoffs 0 to 366 days, backoff_factor 1 to 100, jitter 0 to 1, max_attempts 1 to 1000) and for a backoff_max below backoff_initial (given or default: 10 seconds and 1 hour), which would make every delay backoff_max.';
