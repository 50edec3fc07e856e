-- ===========================================================================
-- claim.sql: hand due QUEUED runs to a worker, never more RUNNING per definition
-- than its max_concurrent_runs, across any number of claimers.
--
-- The algorithm (DESIGN.md "Claiming"); each step is its own statement, so under
-- READ COMMITTED each one sees a fresh snapshot:
--   1. lock a pool of due QUEUED runs in claim order with FOR UPDATE SKIP LOCKED;
--   2. for the capped definitions among them take the dispatch advisory lock,
--      in ascending definition id order (so claimers never wait in a cycle): first
--      only tried; if nothing in the pool can be picked without a busy one, waited
--      for, but only for ids above every lock already held;
--   3. only then count the live RUNNING rows of those definitions;
--   4. pick rows in pool order while their definition has room and mark them
--      RUNNING. Rows of definitions at cap stay QUEUED (backpressure), except
--      scheduled occurrences of overlap_policy = 'skip' definitions that find
--      no free slot at all, which are recorded as CANCELLED with failure_reason
--      'Skipped'.
-- One claim per transaction: a second call would still hold the first call's
-- dispatch locks and could wait out of order, so it is refused.
--
-- The pool starts at batch_size rows, which is all an uncapped queue needs, and
-- grows by 3 x batch_size (to the ~4x oversample) only when caps held rows back,
-- so one crowded definition cannot starve the batch. The second slice leaves out
-- the definitions already known to have no room left, so even a capped backlog
-- far longer than the oversample cannot fill it. In that second round a
-- definition whose id is below one already locked is only try-locked (never
-- waited for), which keeps every wait in ascending order.
-- ===========================================================================

-- Claim up to batch_size due runs for worker (default: an id derived from this session).
-- heartbeat => true stamps heartbeat_at at claim time: for a caller that heartbeats
-- from now on (the Python driver), so a crash right after the claim is reaped after the
-- heartbeat timeout; without it the run counts as never heartbeated (orphan timeout).
-- Its statements are planned once per session (generic plans), except the pool query:
-- re-planning them on every call cost about a third of a claim (docs/performance.md).
CREATE OR REPLACE FUNCTION jobs.claim(
    batch_size integer DEFAULT 1,
    worker text DEFAULT NULL,
    kinds text[] DEFAULT NULL,
    heartbeat boolean DEFAULT FALSE
)
RETURNS SETOF jobs.runs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_worker text;
    v_round integer := 0;
    v_limit integer;
    v_new_ids bigint[];
    v_new_defs bigint[];
    v_pool_ids bigint[] := '{}';    -- pool in claim order ...
    v_pool_defs bigint[] := '{}';   -- ... with each row's definition (NULL: ad-hoc)
    v_pool_origin text[] := '{}';
    v_locked bigint[] := '{}';      -- capped definitions whose dispatch lock we hold
    v_max_locked bigint := NULL;
    v_def bigint;
    v_count_defs bigint[];
    v_room_defs bigint[] := '{}';   -- per capped definition: free slots, skip policy
    v_room_free integer[] := '{}';
    v_room_skip boolean[] := '{}';
    v_pick bigint[];
    v_skip bigint[];
    v_full bigint[] := '{}';        -- capped definitions with no room for another pool row
    v_busy bigint[] := '{}';        -- capped definitions another claimer is dispatching
    v_still_busy bigint[];
    v_waited boolean;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'jobs.claim needs READ COMMITTED isolation, not %',
            current_setting('transaction_isolation')
            USING ERRCODE = '25000',
                  HINT = 'Each step must see a fresh snapshot; call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
    END IF;
    IF current_setting('pgtick.claimed', TRUE) = 'yes' THEN
        -- The dispatch locks of the first call are still held: a second call could
        -- wait on a lower definition id and break the ascending lock order.
        RAISE EXCEPTION 'jobs.claim was already called in this transaction'
            USING ERRCODE = '25000', HINT = 'Commit between claims (autocommit does).';
    END IF;
    PERFORM set_config('pgtick.claimed', 'yes', TRUE);  -- transaction-local
    PERFORM jobs._check_range('batch_size', claim.batch_size, 1, 1000);
    IF claim.worker IS NOT NULL THEN
        PERFORM jobs._check_text('worker', claim.worker, 200);
    END IF;
    v_worker := coalesce(claim.worker, (
        SELECT format('sql-%s-%s', a.pid, to_char(a.backend_start, 'YYYYMMDDHH24MISSUS'))
          FROM pg_stat_activity AS a WHERE a.pid = pg_backend_pid()));

    LOOP
        v_round := v_round + 1;
        v_limit := CASE WHEN v_round = 1 THEN claim.batch_size ELSE 3 * claim.batch_size END;

        -- 1. Lock the next slice of the candidate pool, in claim order. This statement is
        -- planned for its actual values: a generic plan (LIMIT and arrays unknown) can
        -- sort the whole queue instead of walking runs_claim_idx. The rest use generic plans.
        PERFORM set_config('plan_cache_mode', 'force_custom_plan', TRUE);
        SELECT coalesce(array_agg(c.id ORDER BY c.priority DESC, c.scheduled_for, c.id), '{}'),
               coalesce(array_agg(c.definition_id ORDER BY c.priority DESC, c.scheduled_for, c.id), '{}'),
               v_pool_origin || coalesce(array_agg(c.origin ORDER BY c.priority DESC, c.scheduled_for, c.id), '{}')
          INTO v_new_ids, v_new_defs, v_pool_origin
          FROM (SELECT r.id, r.definition_id, r.origin, r.priority, r.scheduled_for
                  FROM jobs.runs AS r
                 WHERE r.status = 'QUEUED'
                   AND r.scheduled_for <= now()
                   AND (claim.kinds IS NULL OR r.kind = ANY (claim.kinds))
                   AND r.id <> ALL (v_pool_ids)
                   AND (r.definition_id IS NULL OR r.definition_id <> ALL (v_full))
                 ORDER BY r.priority DESC, r.scheduled_for, r.id
                 LIMIT v_limit
                   FOR UPDATE SKIP LOCKED) AS c;
        v_pool_ids := v_pool_ids || v_new_ids;
        v_pool_defs := v_pool_defs || v_new_defs;
        PERFORM set_config('plan_cache_mode', 'force_generic_plan', TRUE);

        -- 2. Dispatch locks for the capped definitions new in this slice, in ascending
        -- id order. First only try them: a busy one is someone else's claim in flight.
        v_count_defs := '{}';
        FOR v_def IN
            SELECT d.id FROM jobs.definitions AS d
             WHERE d.id = ANY (v_new_defs) AND d.max_concurrent_runs IS NOT NULL
               AND d.id <> ALL (v_room_defs) AND d.id <> ALL (v_busy)
             ORDER BY d.id
        LOOP
            IF pg_try_advisory_xact_lock(jobs._dispatch_key(v_def)) THEN
                v_count_defs := v_count_defs || v_def;
                v_max_locked := greatest(v_max_locked, v_def);
            ELSE
                v_busy := v_busy || v_def;
            END IF;
        END LOOP;
        v_waited := FALSE;

        LOOP
            -- 3. Only now, under those locks, count what is RUNNING per capped definition.
            IF cardinality(v_count_defs) > 0 THEN
                SELECT v_room_defs || array_agg(d.id),
                       v_room_free || array_agg(greatest(d.max_concurrent_runs - coalesce(n.running, 0), 0)::integer),
                       v_room_skip || array_agg(d.overlap_policy = 'skip')
                  INTO v_room_defs, v_room_free, v_room_skip
                  FROM jobs.definitions AS d
                  LEFT JOIN (SELECT r.definition_id, count(*) AS running
                               FROM jobs.runs AS r
                              WHERE r.status = 'RUNNING' AND r.definition_id = ANY (v_count_defs)
                              GROUP BY r.definition_id) AS n ON n.definition_id = d.id
                 WHERE d.id = ANY (v_count_defs);
            END IF;

            -- 4. Pick in pool order while each definition has room (a busy one has none).
            SELECT (array_agg(p.id ORDER BY p.ord) FILTER (WHERE p.free IS NULL OR p.rn <= p.free))[1:claim.batch_size],
                   array_agg(p.id ORDER BY p.ord) FILTER (WHERE p.skip AND p.free = 0 AND p.origin = 'schedule')
              INTO v_pick, v_skip
              FROM (SELECT pool.id, pool.ord, pool.origin, room.free, room.skip,
                           row_number() OVER (PARTITION BY pool.definition_id ORDER BY pool.ord) AS rn
                      FROM unnest(v_pool_ids, v_pool_defs, v_pool_origin)
                           WITH ORDINALITY AS pool (id, definition_id, origin, ord)
                      LEFT JOIN unnest(v_room_defs || v_busy,
                                       v_room_free || array_fill(0, ARRAY[cardinality(v_busy)]),
                                       v_room_skip || array_fill(FALSE, ARRAY[cardinality(v_busy)]))
                                AS room (definition_id, free, skip)
                             ON room.definition_id = pool.definition_id) AS p;

            -- Nothing claimable without waiting: wait for the busy ones, but only for ids
            -- above every lock held (try the others), so every wait is in ascending order.
            EXIT WHEN v_pick IS NOT NULL OR cardinality(v_busy) = 0 OR v_waited;
            v_waited := TRUE;
            v_count_defs := '{}';
            v_still_busy := '{}';
            FOREACH v_def IN ARRAY (SELECT array_agg(b ORDER BY b) FROM unnest(v_busy) AS b) LOOP
                IF v_max_locked IS NULL OR v_def > v_max_locked THEN
                    PERFORM pg_advisory_xact_lock(jobs._dispatch_key(v_def));
                    v_max_locked := v_def;
                    v_count_defs := v_count_defs || v_def;
                ELSIF pg_try_advisory_xact_lock(jobs._dispatch_key(v_def)) THEN
                    v_count_defs := v_count_defs || v_def;
                ELSE
                    v_still_busy := v_still_busy || v_def;
                END IF;
            END LOOP;
            v_busy := v_still_busy;
        END LOOP;

        EXIT WHEN v_round = 2                                   -- pool is at ~4x: done
               OR cardinality(v_new_ids) < v_limit              -- queue exhausted
               OR coalesce(cardinality(v_pick), 0) >= claim.batch_size;  -- batch full

        -- Going round again: the next slice skips definitions whose room the pool already
        -- fills, or a capped backlog longer than the oversample would fill it all again.
        SELECT coalesce(array_agg(room.definition_id), '{}')
          INTO v_full
          FROM unnest(v_room_defs, v_room_free) AS room (definition_id, free)
         WHERE room.free <= (SELECT count(*) FROM unnest(v_pool_defs) AS p (definition_id)
                              WHERE p.definition_id = room.definition_id);
    END LOOP;

    -- overlap_policy buffer_one / cancel_other of the definitions counted under our locks.
    IF cardinality(v_room_defs) > 0 THEN
        PERFORM jobs._apply_overlap(v_room_defs, v_room_free, v_pick);
    END IF;

    IF v_skip IS NOT NULL THEN
        UPDATE jobs.runs AS r
           SET status = 'CANCELLED', finished_at = now(), failure_reason = 'Skipped',
               error = 'skipped: definition at max_concurrent_runs (overlap_policy skip)'
         WHERE r.id = ANY (v_skip);
    END IF;

    RETURN QUERY
    WITH started AS (
        UPDATE jobs.runs AS r
           SET status = 'RUNNING', started_at = now(), worker = v_worker,
               heartbeat_at = CASE WHEN claim.heartbeat THEN now() END
         WHERE r.id = ANY (v_pick)
        RETURNING r.*
    )
    SELECT s.* FROM started AS s ORDER BY s.priority DESC, s.scheduled_for, s.id;
END
$$;
COMMENT ON FUNCTION jobs.claim(integer, text, text[], boolean) IS
'Claim up to batch_size due QUEUED runs (optionally only of kinds) for worker, respecting every definition''s max_concurrent_runs; returns them RUNNING. heartbeat => true stamps heartbeat_at at claim.';
