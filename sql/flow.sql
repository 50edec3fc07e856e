-- ===========================================================================
-- flow.sql: flow control. Named queues (pause / resume), limits per queue and
-- kind (running and rate, optionally per concurrency key), snooze, and the
-- dependency bookkeeping behind jobs.enqueue(..., depends_on => ...).
--
-- Limits are enforced by jobs.claim (claim.sql); unique jobs and bulk enqueue
-- live in enqueue.sql.
--
-- Dependencies. A run with depends_on is inserted blocked unless every run it
-- depends on has already completed. A dependency counts by its retry chain's
-- final outcome (the chain is the run and its retries, linked by retry_of):
--   * when the last run of a chain COMPLETES, jobs._release_dependents clears
--     `blocked` on the runs waiting on that chain whose other dependencies are
--     complete too (called by jobs.complete and jobs.complete_many);
--   * when the last run of a chain ends FAILED with no retry, or CANCELLED,
--     jobs._cascade_dependency_failure cancels every blocked run waiting on it,
--     and the runs waiting on those, down the chain, with failure_reason
--     'DependencyFailed' (called by jobs.fail, jobs.reap, jobs.cancel,
--     jobs.cancel_queued, jobs.acknowledge_cancel and claim's overlap skip).
-- Both lock the waiting runs in ascending id order, after the run that ended: every path
-- that ends a run holds it (and any other run it ends) before it waits for a blocked one.
-- jobs.enqueue takes FOR SHARE locks on the dependency chains while it decides whether the
-- new run is blocked, so a completion or failure cannot slip between that decision and the
-- commit that makes the new run visible. It locks the runs that are not blocked first and
-- the blocked ones after them (each set in ascending id order; the blocked ones only once no
-- new retry has joined a chain, which it locks first), as the paths that end a run
-- do: ids alone would not keep that order, since a retry gets a higher id than the runs
-- enqueued on its chain before it, and an enqueue naming both the retry's chain and such a
-- run would hold that run while it waits for the retry's completion, which waits for it.
-- ===========================================================================

-- Private: every run of the retry chains starting at the given runs (each run and its retries).
CREATE OR REPLACE FUNCTION jobs._chain_forward(run_ids bigint[])
RETURNS TABLE (root bigint, run_id bigint, attempt integer, status jobs.run_status)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE chain AS (
        SELECT r.id AS root, r.id, r.attempt, r.status
          FROM jobs.runs_all AS r WHERE r.id = ANY (run_ids)
        UNION ALL
        SELECT c.root, r.id, r.attempt, r.status
          FROM chain AS c JOIN jobs.runs_all AS r ON r.retry_of = c.id
    )
    SELECT chain.root, chain.id, chain.attempt, chain.status FROM chain
$$;
COMMENT ON FUNCTION jobs._chain_forward(bigint[]) IS 'Private: (root, run_id, attempt, status) of every run in the retry chains that start at run_ids.';

-- Private: the given runs and every earlier attempt of theirs (following retry_of back).
-- Every completion and final failure asks this while any run is blocked, so it reads history
-- only for the ids jobs.runs does not hold: a read of jobs.run_history (jobs.runs_all) locks
-- every day of it, and a year of days is thousands of locks a transaction, enough for a few
-- workers completing at once to use up the server's lock table. STABLE: every statement reads
-- the caller's snapshot, so a run moved meanwhile is seen in exactly one of the two.
CREATE OR REPLACE FUNCTION jobs._chain_back(run_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_chain bigint[] := '{}';
    v_level bigint[] := ARRAY(SELECT DISTINCT i FROM unnest(run_ids) AS i WHERE i IS NOT NULL);
    v_found bigint[];
    v_back bigint[];
    v_moved_found bigint[];
    v_moved_back bigint[];
BEGIN
    WHILE cardinality(v_level) > 0 LOOP
        SELECT coalesce(array_agg(r.id), '{}'),
               coalesce(array_agg(r.retry_of) FILTER (WHERE r.retry_of IS NOT NULL), '{}')
          INTO v_found, v_back
          FROM jobs.runs AS r WHERE r.id = ANY (v_level);
        IF cardinality(v_found) < cardinality(v_level) THEN  -- moved to history, or no such run
            SELECT coalesce(array_agg(h.id), '{}'),
                   coalesce(array_agg(h.retry_of) FILTER (WHERE h.retry_of IS NOT NULL), '{}')
              INTO v_moved_found, v_moved_back
              FROM jobs.run_history AS h WHERE h.id = ANY (v_level) AND h.id <> ALL (v_found);
            v_found := v_found || v_moved_found;
            v_back := v_back || v_moved_back;
        END IF;
        v_chain := v_chain || v_found;
        v_level := ARRAY(SELECT DISTINCT b FROM unnest(v_back) AS b WHERE b <> ALL (v_chain));
    END LOOP;
    RETURN ARRAY(SELECT DISTINCT c FROM unnest(v_chain) AS c);
END $$;
COMMENT ON FUNCTION jobs._chain_back(bigint[]) IS 'Private: run_ids plus all their earlier attempts (the ids a dependent may name for these chains).';

-- Private: every run of the retry chains that a blocked run waits on. jobs.prune and
-- jobs.discard keep these: releasing or cancelling the waiting run follows each chain from the
-- id it names, so a chain with a deleted link would leave it waiting for good.
-- With nothing blocked (runs_blocked_idx answers that) the chains are not read at all: a read
-- of every run plans over every day of history, locking each partition and its indexes.
CREATE OR REPLACE FUNCTION jobs._waited_on() RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_ids bigint[];
BEGIN
    IF NOT EXISTS (SELECT FROM jobs.runs AS b WHERE b.blocked) THEN
        RETURN '{}';
    END IF;
    SELECT coalesce(array_agg(DISTINCT c.run_id), '{}') INTO v_ids
      FROM jobs._chain_forward(ARRAY(
               SELECT DISTINCT d.id
                 FROM jobs.runs AS b CROSS JOIN LATERAL unnest(b.depends_on) AS d (id)
                WHERE b.blocked AND b.status = 'QUEUED')) AS c;
    RETURN v_ids;
END $$;
COMMENT ON FUNCTION jobs._waited_on() IS 'Private: the ids of every run in the retry chains that blocked runs depend on (kept by prune and discard).';

-- Private: refuse REPEATABLE READ and SERIALIZABLE where a decision reads rows after waiting
-- for a lock (a run's completion, failure or cancellation deciding for the runs waiting on it;
-- an enqueue's unique key; whether a new run with depends_on waits, starts free or is
-- cancelled). A snapshot older than the statement misses what committed since the transaction
-- began (an enqueue naming the run, another dependency completing, a run of the key, a retry of
-- a dependency), and SERIALIZABLE detects that only against other SERIALIZABLE transactions.
CREATE OR REPLACE FUNCTION jobs._require_read_committed(what text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION '% needs READ COMMITTED, not %', what, upper(current_setting('transaction_isolation'))
            USING ERRCODE = '25000',
                  HINT = 'It must see what committed after the transaction began: call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
    END IF;
END $$;
COMMENT ON FUNCTION jobs._require_read_committed(text) IS 'Private: raise 25000 unless the transaction is READ COMMITTED (what: the call named in the message).';

-- Private: 'met', 'pending' or 'failed' for a depends_on list, locking the chains FOR SHARE.
CREATE OR REPLACE FUNCTION jobs._dependency_state(depends_on bigint[]) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_missing bigint[];
    v_chain bigint[];
    v_fresh bigint[];
    v_free bigint[];
    v_locked bigint[] := '{}';
    v_state text;
BEGIN
    IF depends_on IS NULL THEN
        RETURN 'met';
    END IF;
    PERFORM jobs._check_depends_on(depends_on);   -- the list's shape and that its runs exist
    -- It decides from the chains it reads after locking them: a snapshot older than the statement
    -- misses a retry queued since the transaction began (jobs.retry only locks the attempt it
    -- follows), and would cancel the new run as DependencyFailed while that retry may complete.
    PERFORM jobs._require_read_committed('enqueueing or retrying a run with depends_on');
    -- Lock every run of the chains: those not blocked first, then the blocked ones (each in
    -- ascending ids; the header says why). A retry inserted meanwhile (its run failed while this
    -- waited for it) extends a chain, so look again until the locked set covers it; and the
    -- blocked ones wait until a round finds no new run that is not: a retry found in a later
    -- round, locked after them, would be waited for while they are held, and its completion,
    -- which holds it, waits for them. A run pruned meanwhile drops out of the chain (the lock
    -- skips a row deleted while it waited), so the set is never NULL.
    LOOP
        SELECT coalesce(array_agg(DISTINCT c.run_id ORDER BY c.run_id), '{}') INTO v_chain
          FROM jobs._chain_forward(depends_on) AS c;
        EXIT WHEN v_chain <@ v_locked;
        v_fresh := ARRAY(SELECT f FROM unnest(v_chain) AS f WHERE f <> ALL (v_locked));
        SELECT coalesce(array_agg(l.id), '{}') INTO v_free
          FROM (SELECT r.id FROM jobs.runs AS r
                 WHERE r.id = ANY (v_fresh) AND NOT r.blocked
                 ORDER BY r.id
                   FOR SHARE) AS l;
        -- Then those in history (never blocked): a run moved there while this waited is locked
        -- there (a new statement, a new snapshot); runs only ever move from jobs.runs to history.
        SELECT v_free || coalesce(array_agg(l.id), '{}') INTO v_free
          FROM (SELECT h.id FROM jobs.run_history AS h
                 WHERE h.id = ANY (v_fresh)
                 ORDER BY h.id
                   FOR SHARE) AS l;
        IF cardinality(v_free) > 0 THEN
            v_locked := v_locked || v_free;   -- look again before the blocked ones
        ELSE
            PERFORM FROM jobs.runs AS r
             WHERE r.id = ANY (v_fresh)
             ORDER BY r.id
               FOR SHARE;
            v_locked := v_locked || v_fresh;
        END IF;
    END LOOP;
    -- Only now, with the chains locked (a prune can no longer delete them), is "exists" final.
    SELECT array_agg(d ORDER BY d) INTO v_missing
      FROM unnest(depends_on) AS d
     WHERE NOT EXISTS (SELECT FROM jobs.runs_all AS r WHERE r.id = d);
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'depends_on names runs that do not exist: %', v_missing
            USING ERRCODE = 'P0002', HINT = 'A run can only depend on runs that already exist.';
    END IF;
    SELECT CASE WHEN bool_or(l.status IN ('FAILED', 'CANCELLED')) THEN 'failed'
                WHEN bool_and(l.status = 'COMPLETED') THEN 'met'
                ELSE 'pending' END
      INTO v_state
      FROM (SELECT DISTINCT ON (c.root) c.root, c.status
              FROM jobs._chain_forward(depends_on) AS c
             ORDER BY c.root, c.attempt DESC) AS l;
    RETURN v_state;
END $$;
COMMENT ON FUNCTION jobs._dependency_state(bigint[]) IS 'Private: validates depends_on (22023, P0002), refuses REPEATABLE READ and SERIALIZABLE (25000), locks the dependency chains FOR SHARE and says met, pending or failed by each chain''s last run.';

-- Private: unblock the runs waiting on these just-completed runs whose dependencies are all complete.
CREATE OR REPLACE FUNCTION jobs._release_dependents(run_ids bigint[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_chain bigint[];
    v_waiting bigint[];
    v_count integer;
BEGIN
    PERFORM jobs._require_read_committed('releasing the runs waiting on a completed run');
    IF NOT EXISTS (SELECT FROM jobs.runs AS r WHERE r.blocked) THEN
        RETURN 0;  -- nothing waits on anything (runs_blocked_idx): the common case
    END IF;
    v_chain := jobs._chain_back(run_ids);
    -- Lock first (ascending ids), then decide in a new statement: its fresh snapshot sees a
    -- concurrent completion of another dependency that committed while we waited for the lock.
    SELECT array_agg(w.id) INTO v_waiting
      FROM (SELECT r.id FROM jobs.runs AS r
             WHERE r.blocked AND r.status = 'QUEUED'
               AND r.depends_on && v_chain
             ORDER BY r.id
               FOR UPDATE) AS w;
    IF v_waiting IS NULL THEN
        RETURN 0;
    END IF;
    -- A dependency it names still QUEUED or RUNNING settles it at once (the CASE keeps that
    -- order): the retry chains are walked only for a run whose named dependencies all ended,
    -- so the completions of a wide fan-in do not walk every chain each.
    UPDATE jobs.runs AS r
       SET blocked = FALSE
     WHERE r.id = ANY (v_waiting) AND r.blocked AND r.status = 'QUEUED'
       AND CASE WHEN EXISTS (SELECT FROM jobs.runs AS d
                              WHERE d.id = ANY (r.depends_on) AND d.status IN ('QUEUED', 'RUNNING'))
                THEN FALSE
                ELSE NOT EXISTS (
                    SELECT FROM (SELECT DISTINCT ON (c.root) c.status
                                   FROM jobs._chain_forward(r.depends_on) AS c
                                  ORDER BY c.root, c.attempt DESC) AS l
                     WHERE l.status <> 'COMPLETED') END;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN jobs._notify_queued(v_count);
END $$;
COMMENT ON FUNCTION jobs._release_dependents(bigint[]) IS 'Private: after runs COMPLETED, clear blocked on the runs waiting on their chains whose every dependency has completed; returns how many.';

-- Private: cancel (DependencyFailed) every blocked run waiting on these runs, transitively.
-- jit off: the per-id probes are estimated at hundreds of rows each, which for a wide level
-- crosses jit_above_cost, and compiling then costs far more than the probes themselves.
-- Sequential scans off: a session keeps its plans, and a probe planned while jobs.runs was
-- small would read every run once per doomed id when it has grown (as the worker's calls).
CREATE OR REPLACE FUNCTION jobs._cascade_dependency_failure(run_ids bigint[]) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET jit = off
SET enable_seqscan = off
AS $$
DECLARE
    v_level bigint[];
    v_doomed bigint[];
    v_count integer;
    v_total integer := 0;
BEGIN
    PERFORM jobs._require_read_committed('failing or cancelling a run');  -- before any shortcut
    IF run_ids IS NULL OR cardinality(run_ids) = 0
       OR NOT EXISTS (SELECT FROM jobs.runs AS r WHERE r.blocked) THEN
        RETURN 0;
    END IF;
    v_level := jobs._chain_back(run_ids);
    LOOP
        -- Down the chain one level per statement, each id of the level one probe of
        -- runs_depends_on_idx (OFFSET 0 keeps the probe per id: a recursive join, or one
        -- overlap test with the whole level, ends up filtering every blocked run per doomed id,
        -- minutes for thousands). The probe tests depends_on alone, and the status and blocked
        -- are tested outside it: inside, a plan made on statistics from before the dependents
        -- were enqueued combined the probe with runs_claim_idx (its predicate is the QUEUED
        -- status), reading every QUEUED run once per doomed id. Ids only grow along
        -- depends_on: it ends.
        v_doomed := '{}';
        LOOP
            SELECT coalesce(array_agg(DISTINCT w.id), '{}') INTO v_level
              FROM unnest(v_level) AS d (id)
             CROSS JOIN LATERAL (
                   SELECT r.id, r.blocked, r.status FROM jobs.runs AS r
                    WHERE r.depends_on @> ARRAY[d.id]
                   OFFSET 0) AS w
             WHERE w.blocked AND w.status = 'QUEUED' AND w.id <> ALL (v_doomed);
            EXIT WHEN cardinality(v_level) = 0;
            v_doomed := v_doomed || v_level;
            -- A doomed run may be an operator's retry of a run that never started (it waits on
            -- its dependencies again): the runs that name its earlier attempts wait on its chain.
            v_level := jobs._chain_back(v_level);
        END LOOP;
        EXIT WHEN cardinality(v_doomed) = 0;
        WITH locked AS (
            SELECT r.id FROM jobs.runs AS r
             WHERE r.id = ANY (v_doomed) AND r.status = 'QUEUED'
             ORDER BY r.id
               FOR UPDATE
        )
        UPDATE jobs.runs AS r
           SET status = 'CANCELLED', finished_at = now(), blocked = FALSE,
               failure_reason = 'DependencyFailed',
               error = 'a run it depends on failed or was cancelled'
          FROM locked
         WHERE r.id = locked.id AND r.status = 'QUEUED';
        GET DIAGNOSTICS v_count = ROW_COUNT;
        v_total := v_total + v_count;
        -- An enqueue holding a doomed run FOR SHARE (jobs._dependency_state) made us wait and
        -- may have committed a new dependent of it meanwhile, blocked: this round's snapshot
        -- did not see it, the next one does. Go on from what was just cancelled until a round
        -- finds nothing (each round cancels what it finds, so it ends).
        v_level := jobs._chain_back(v_doomed);
    END LOOP;
    RETURN v_total;
END $$;
COMMENT ON FUNCTION jobs._cascade_dependency_failure(bigint[]) IS 'Private: after runs failed for good or were cancelled, cancel every run waiting on them (and on those, down the chain) with failure_reason DependencyFailed; returns how many.';

-- ---------------------------------------------------------------------------
-- Queues
-- ---------------------------------------------------------------------------

-- Stop claiming from a queue now (RUNNING runs finish); returns true if it was not paused yet.
CREATE OR REPLACE FUNCTION jobs.pause_queue(name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    PERFORM jobs._check_name('name', pause_queue.name);
    INSERT INTO jobs.paused_queues (name) VALUES (pause_queue.name) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    -- A name nothing uses is paused all the same (runs may come), but it may be a typo that
    -- leaves the queue meant running: say so, as an enqueue of an unknown kind does.
    IF NOT EXISTS (SELECT FROM jobs.runs AS r
                    WHERE (r.status = 'QUEUED' OR r.status = 'RUNNING') AND r.queue = pause_queue.name)
       AND NOT EXISTS (SELECT FROM jobs.definitions AS d WHERE d.queue = pause_queue.name)
       AND NOT EXISTS (SELECT FROM jobs.limits AS l WHERE l.scope = 'queue' AND l.name = pause_queue.name) THEN
        RAISE NOTICE 'no queued or running run, definition or limit uses queue %: it is paused for the runs to come',
            quote_literal(pause_queue.name)
            USING HINT = 'Check the spelling: jobs.queues lists the queues in use.';
    END IF;
    RETURN TRUE;
END $$;
COMMENT ON FUNCTION jobs.pause_queue(text) IS 'Stop claiming from the named queue: a claim that starts after this commits takes nothing from it; RUNNING runs finish. Returns false if it was already paused. A NOTICE says so when no live run, definition or limit uses the queue (a typo?).';

-- Resume claiming from a paused queue; returns true if it was paused.
CREATE OR REPLACE FUNCTION jobs.resume_queue(name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    PERFORM jobs._check_text('name', resume_queue.name, 200);
    DELETE FROM jobs.paused_queues AS p WHERE p.name = resume_queue.name;
    RETURN jobs._notify_if(FOUND);
END $$;
COMMENT ON FUNCTION jobs.resume_queue(text) IS 'Resume claiming from the named queue (wakes idle workers). Returns false if it was not paused.';

-- Every queue in use (by a live run, a definition, a limit or a pause), with its state and counts.
CREATE OR REPLACE VIEW jobs.queues AS
-- The live runs counted in one pass for every queue (not a pass per queue), read from the two
-- partial indexes of the QUEUED and the RUNNING runs (an OR of the two, which a bitmap scan
-- of each answers; IN would read the whole table, finished runs included).
WITH live AS (
    SELECT
        r.queue AS name,
        count(*) FILTER (WHERE r.status = 'QUEUED' AND NOT r.blocked) AS queued,
        count(*) FILTER (WHERE r.status = 'RUNNING') AS running,
        count(*) FILTER (WHERE r.status = 'QUEUED' AND r.blocked) AS blocked
    FROM jobs.runs AS r
    WHERE r.status = 'QUEUED' OR r.status = 'RUNNING'
    GROUP BY r.queue
),

names AS (
    SELECT live.name FROM live
    UNION
    SELECT d.queue FROM jobs.definitions AS d
    UNION
    SELECT l.name FROM jobs.limits AS l
    WHERE l.scope = 'queue'
    UNION
    SELECT p.name FROM jobs.paused_queues AS p
)

SELECT
    n.name,
    p.name IS NOT NULL AS paused,
    p.paused_at,
    coalesce(live.queued, 0) AS queued,
    coalesce(live.running, 0) AS running,
    coalesce(live.blocked, 0) AS blocked,
    l.max_running,
    l.rate_limit,
    l.rate_period,
    l.per_key
FROM names AS n
LEFT JOIN jobs.paused_queues AS p ON n.name = p.name
LEFT JOIN jobs.limits AS l ON l.scope = 'queue' AND n.name = l.name
LEFT JOIN live ON n.name = live.name;
COMMENT ON VIEW jobs.queues IS 'Every queue in use (live runs, definitions, limits, pauses): paused and since when, QUEUED (claimable or waiting for a time), RUNNING, blocked on dependencies, and its limit.';

-- ---------------------------------------------------------------------------
-- Limits
-- ---------------------------------------------------------------------------

-- A change of a limit and the claims it concerns follow one another. jobs.set_limit
--   1. holds the limit's row (FOR UPDATE; for a new limit, the row it inserts), so changes of
--      one limit follow one another;
--   2. takes EXCLUSIVE, in ascending key order, the dispatch lock (jobs._limit_key) of every
--      group of the limit under its old settings and its new ones: the whole queue or kind
--      ([scope, name]), and per concurrency key ([scope, name, key]) for every key among the
--      QUEUED and RUNNING runs where either settings are per key. A claim that has started
--      runs under the old settings holds one of them (exclusive, or shared for a roomy limit)
--      until it commits, so the change waits for it; claims never wait for these locks in the
--      lock manager (they poll), so this wait closes no cycle;
--   3. then takes the limit's window lock (jobs._window_key) EXCLUSIVE: jobs._give_back_starts
--      holds it SHARED while it takes starts out of the window's rows, so a recount and a
--      give-back never change the same rows at once;
--   4. only then, in statements that see every such claim committed, writes the new settings
--      and recounts the rate window where it needs to (jobs._recount_rate_window).
-- The change does not wait for a claim that holds none of these locks: one that started runs
-- of a queue or kind with no limit yet, or of a concurrency key no run had when the change
-- read them; nor does it stop a claim that read the old settings before it and takes a group's
-- lock after it (that claim counts under the old settings).

-- Private: the key of a limit's rate-window lock (a transaction lock: exclusive for
-- jobs.set_limit, which rewrites the window's rows of jobs._rate_starts; shared for
-- jobs._give_back_starts, which lowers some of them).
CREATE OR REPLACE FUNCTION jobs._window_key(scope text, name text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtextextended('window:' || jsonb_build_array(scope, name)::text, 0) $$;
COMMENT ON FUNCTION jobs._window_key(text, text) IS 'Private: transaction advisory lock key of a queue''s or kind''s rate window: exclusive in jobs.set_limit while it rewrites the window''s rows of jobs._rate_starts, shared in jobs._give_back_starts while it lowers them.';

-- Private: rewrite a rate limit's window under the labelling jobs.claim uses (per concurrency key
-- or not) and over the whole trailing period: called when per_key flips, the period grows or a
-- rate is new. Two records of the starts are merged, per group and instant:
--   * the rows of jobs._rate_starts (one per claim and group, at the claim's start time): they
--     count every start that was not given back, also of a run snoozed since (jobs.snooze clears
--     started_at), but only under the labelling they were written with, and only as far back as
--     the old period reached (claims drop older ones);
--   * the runs' own started_at, in jobs.runs and in history: any labelling, any age, but not a
--     run snoozed since its start.
-- Each instant keeps the larger of the two counts. Rows written for the whole group feed a per-key
-- window only as far as runs account for them: what no run's started_at accounts for any more
-- (runs snoozed since) is counted for each key with as many runs that may be them (a run of the
-- group created by then, whose start is cleared or later and which was put back to wait until
-- after that instant, as a snooze does), at most the count not accounted for: never less than a
-- key took, and a key none of whose runs can be them is not held back.
CREATE OR REPLACE FUNCTION jobs._recount_rate_window(scope text, name text, per_key boolean, period interval)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_since timestamptz := now() - _recount_rate_window.period;
    v_labels jsonb[];
    v_at timestamptz[];
    v_starts integer[];
BEGIN
    -- The rows recorded so far, taken out (those within the period kept in hand): they are
    -- written back below, merged with the runs, under the labelling claims now read.
    WITH gone AS (
        DELETE FROM jobs._rate_starts AS x
         WHERE (x.label::jsonb) ->> 0 = _recount_rate_window.scope
           AND (x.label::jsonb) ->> 1 = _recount_rate_window.name
        RETURNING x.label::jsonb AS label, x.started_at, x.starts
    )
    SELECT coalesce(array_agg(g.label), '{}'), coalesce(array_agg(g.started_at), '{}'),
           coalesce(array_agg(g.starts), '{}')
      INTO v_labels, v_at, v_starts
      FROM gone AS g
     WHERE g.started_at > v_since;
    IF NOT _recount_rate_window.per_key THEN
        -- One window for the whole group: every row counts for it, whatever its key.
        INSERT INTO jobs._rate_starts (label, started_at, starts)
        SELECT jsonb_build_array(_recount_rate_window.scope, _recount_rate_window.name)::text, s.at, max(s.n)
          FROM (SELECT o.at, sum(o.n) AS n
                  FROM unnest(v_at, v_starts) AS o (at, n)
                 GROUP BY o.at
                UNION ALL
                SELECT r.started_at, count(*)
                  FROM jobs.runs_all AS r
                 WHERE r.started_at > v_since
                   AND (r.finished_at IS NULL OR r.finished_at > v_since)
                   AND CASE _recount_rate_window.scope WHEN 'queue' THEN r.queue ELSE r.kind END
                       = _recount_rate_window.name
                 GROUP BY r.started_at) AS s
         GROUP BY s.at;
        RETURN;
    END IF;
    -- A window per key (a key as JSON: null for runs without one).
    INSERT INTO jobs._rate_starts (label, started_at, starts)
    WITH recorded AS (   -- per instant and key; ckey NULL: recorded for the whole group
        SELECT o.at, o.label -> 2 AS ckey, sum(o.n) AS n
          FROM unnest(v_labels, v_at, v_starts) AS o (label, at, n)
         GROUP BY o.at, o.label -> 2
    ),
    ran AS (
        SELECT r.started_at AS at, coalesce(to_jsonb(r.concurrency_key), 'null'::jsonb) AS ckey, count(*) AS n
          FROM jobs.runs_all AS r
         WHERE r.started_at > v_since
           AND (r.finished_at IS NULL OR r.finished_at > v_since)
           AND CASE _recount_rate_window.scope WHEN 'queue' THEN r.queue ELSE r.kind END = _recount_rate_window.name
         GROUP BY r.started_at, r.concurrency_key
    ),
    unplaced AS (   -- starts recorded for the whole group that no run's started_at accounts for now
        SELECT w.at, w.n - coalesce((SELECT sum(a.n) FROM ran AS a WHERE a.at = w.at), 0) AS n
          FROM recorded AS w
         WHERE w.ckey IS NULL
    ),
    share AS (   -- of those, per key: at most as many as the key has runs that may be them
        SELECT u.at, coalesce(to_jsonb(r.concurrency_key), 'null'::jsonb) AS ckey, least(u.n, count(*)) AS n
          FROM unplaced AS u
          JOIN jobs.runs_all AS r
            ON r.created_at <= u.at
           AND (r.started_at IS NULL OR r.started_at > u.at)
           AND r.scheduled_for > u.at
           AND (r.finished_at IS NULL OR r.finished_at > u.at)
           AND CASE _recount_rate_window.scope WHEN 'queue' THEN r.queue ELSE r.kind END = _recount_rate_window.name
         WHERE u.n > 0
         GROUP BY u.at, u.n, r.concurrency_key
    )
    SELECT jsonb_build_array(_recount_rate_window.scope, _recount_rate_window.name, k.ckey)::text, k.at, max(k.n)
      FROM (SELECT w.at, w.ckey, w.n FROM recorded AS w WHERE w.ckey IS NOT NULL
            UNION ALL
            SELECT coalesce(a.at, s.at), coalesce(a.ckey, s.ckey), coalesce(a.n, 0) + coalesce(s.n, 0)
              FROM ran AS a
              FULL JOIN share AS s ON s.at = a.at AND s.ckey = a.ckey) AS k
     GROUP BY k.ckey, k.at;
END $$;
COMMENT ON FUNCTION jobs._recount_rate_window(text, text, boolean, interval) IS 'Private: rewrite the rows of jobs._rate_starts of a queue''s or kind''s rate limit for the labelling per_key gives and the trailing period: per group and instant the larger of the starts recorded (also of runs snoozed since) and the runs'' own start times; starts recorded for the whole group that no run accounts for count, in a per-key window, for each key with runs that may be them.';

-- Create or replace the limit of a queue or kind (running and/or rate, optionally per concurrency key).
-- It waits for the claims that started runs under the limit's old settings to commit (the locks
-- above), so the new settings count every start and every RUNNING run those claims made; a new
-- limit waits for every claim in progress (jobs._wait_for_claims), which may have read its runs
-- as uncapped, and so does a per-key limit over more than 1,000 keys (step 2).
-- A rate limit counts the starts of its whole trailing period, also those from before it was set
-- or changed: a new rate limit, a longer period or a per_key that flips recounts the window
-- (jobs._recount_rate_window); a new rate or a shorter period keeps the recorded starts.
CREATE OR REPLACE FUNCTION jobs.set_limit(
    scope text,
    name text,
    max_running integer DEFAULT NULL,
    rate_limit integer DEFAULT NULL,
    rate_period interval DEFAULT NULL,
    per_key boolean DEFAULT FALSE
)
RETURNS jobs.limits
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_limit jobs.limits;
    v_was jobs.limits;
    v_key bigint;
    c_key_locks CONSTANT integer := 1000;   -- at most this many per-key locks (step 2)
    v_keys text[] := '{}';
BEGIN
    IF set_limit.scope IS NULL OR set_limit.scope NOT IN ('queue', 'kind') THEN
        RAISE EXCEPTION 'scope must be queue or kind, got %', jobs._shown(set_limit.scope)
            USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_name('name', set_limit.name);
    IF set_limit.max_running IS NOT NULL THEN
        PERFORM jobs._check_range('max_running', set_limit.max_running, 1, 1000000);
    END IF;
    IF set_limit.rate_limit IS NOT NULL THEN
        PERFORM jobs._check_range('rate_limit', set_limit.rate_limit, 1, 1000000);
    END IF;
    IF (set_limit.rate_limit IS NULL) <> (set_limit.rate_period IS NULL) THEN
        RAISE EXCEPTION 'rate_limit and rate_period go together: give both or neither'
            USING ERRCODE = '22023';
    END IF;
    -- From 1 second (jobs._duration_bounds): a rate window shorter than a claim's own
    -- transaction counts almost none of its starts, so it would lift the limit instead.
    PERFORM jobs._check_duration('rate_period', set_limit.rate_period);
    -- Kept as elapsed time (1 day as 24:00:00): claims count the window as now() - rate_period,
    -- and an interval with days steps back calendar days in the claiming session's TimeZone,
    -- 23 hours across a spring-forward, which would forget (and drop) an hour of starts.
    set_limit.rate_period := make_interval(secs => extract(EPOCH FROM set_limit.rate_period));
    IF set_limit.max_running IS NULL AND set_limit.rate_limit IS NULL THEN
        RAISE EXCEPTION 'give max_running, or rate_limit with rate_period (jobs.remove_limit removes a limit)'
            USING ERRCODE = '22023';
    END IF;
    IF set_limit.per_key IS NULL THEN
        RAISE EXCEPTION 'per_key must be true or false, got NULL' USING ERRCODE = '22023';
    END IF;
    -- Its statements after the waits must see what the claims waited for committed.
    PERFORM jobs._require_read_committed('jobs.set_limit');

    -- 1. The limit's row: the old settings, held; a new limit's row is inserted now (a change
    -- committed meanwhile by another call is read on the next round).
    LOOP
        SELECT l.* INTO v_was FROM jobs.limits AS l
         WHERE l.scope = set_limit.scope AND l.name = set_limit.name
           FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO jobs.limits AS l (scope, name, max_running, rate_limit, rate_period, per_key)
        VALUES (set_limit.scope, set_limit.name, set_limit.max_running, set_limit.rate_limit,
                set_limit.rate_period, set_limit.per_key)
        ON CONFLICT (scope, name) DO NOTHING
        RETURNING l.* INTO v_limit;
        EXIT WHEN FOUND;
    END LOOP;

    -- A new limit caps runs that claims in progress read as uncapped and may be starting
    -- unseen: wait for them (and hold off the next claims until this one commits).
    IF v_was.scope IS NULL THEN
        PERFORM jobs._wait_for_claims('jobs.set_limit of a new limit');
    END IF;

    -- 2. The dispatch locks of its groups under the old settings and the new, ascending (keys
    -- as jobs.claim computes them: jobs._limit_key of the label). Every lock is held to commit
    -- in the server's shared lock table, so a per-key limit's keys are locked only while there
    -- are at most c_key_locks of them. Past that, the change waits for every claim in progress
    -- instead, as a new limit does (and holds off the next claims until it commits): a claim in
    -- flight on one key holds only that key's lock, and a limit turned from per key to the whole
    -- queue or kind has no other lock in common with it; not waiting for it, the claims after
    -- the change would not count the runs it starts, and start more than the new limit allows.
    IF set_limit.per_key OR v_was.per_key THEN
        v_keys := ARRAY(
            SELECT DISTINCT r.concurrency_key
              FROM jobs.runs AS r
             WHERE r.status IN ('QUEUED', 'RUNNING')
               AND CASE set_limit.scope WHEN 'queue' THEN r.queue ELSE r.kind END = set_limit.name
             LIMIT c_key_locks + 1
        );
        IF cardinality(v_keys) > c_key_locks THEN
            v_keys := '{}';
            PERFORM jobs._wait_for_claims(
                format('jobs.set_limit of a per-key limit over more than %s keys', c_key_locks)
            );
        END IF;
    END IF;
    FOR v_key IN
        SELECT DISTINCT hashtextextended('dispatch:' || g.label, 0)
          FROM (SELECT jsonb_build_array(set_limit.scope, set_limit.name)::text AS label
                UNION ALL
                SELECT jsonb_build_array(set_limit.scope, set_limit.name, k.ckey)::text
                  FROM unnest(v_keys) AS k (ckey)) AS g
         ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(v_key);
    END LOOP;

    -- 3. The rate window's rows, against a give-back lowering them meanwhile.
    PERFORM pg_advisory_xact_lock(jobs._window_key(set_limit.scope, set_limit.name));

    -- 4. The new settings, and the window they count.
    IF v_limit.scope IS NULL THEN
        UPDATE jobs.limits AS l
           SET max_running = set_limit.max_running, rate_limit = set_limit.rate_limit,
               rate_period = set_limit.rate_period, per_key = set_limit.per_key, updated_at = now()
         WHERE l.scope = set_limit.scope AND l.name = set_limit.name
        RETURNING l.* INTO v_limit;
    END IF;
    IF v_limit.rate_limit IS NOT NULL
       AND (v_was.rate_period IS NULL OR v_was.rate_period < v_limit.rate_period
            OR v_was.per_key <> v_limit.per_key) THEN
        PERFORM jobs._recount_rate_window(v_limit.scope, v_limit.name, v_limit.per_key, v_limit.rate_period);
    END IF;
    PERFORM jobs._notify();  -- a raised limit may let waiting runs start
    RETURN v_limit;
END $$;
COMMENT ON FUNCTION jobs.set_limit(text, text, integer, integer, interval, boolean) IS 'Create or replace the limit of a queue or kind (scope queue | kind): at most max_running RUNNING and at most rate_limit starts per trailing rate_period, across all workers; rate_period from 1 second to 1 day, stored as elapsed time (1 day as 24:00:00, the same window whatever the claiming session''s TimeZone); per_key => true applies it to each concurrency_key separately. Waits for the claims in progress that started runs under the old settings (a new limit, or a per-key one whose queue or kind has runs of more than 1,000 keys: for every claim in progress, at most 5 s, then 55P03 and nothing changed); READ COMMITTED only (25000).';

-- Remove the limit of a queue or kind; returns true if there was one.
CREATE OR REPLACE FUNCTION jobs.remove_limit(scope text, name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    IF remove_limit.scope IS NULL OR remove_limit.scope NOT IN ('queue', 'kind') THEN
        RAISE EXCEPTION 'scope must be queue or kind, got %', jobs._shown(remove_limit.scope)
            USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_text('name', remove_limit.name, 200);
    DELETE FROM jobs.limits AS l WHERE l.scope = remove_limit.scope AND l.name = remove_limit.name;
    RETURN jobs._notify_if(FOUND);
END $$;
COMMENT ON FUNCTION jobs.remove_limit(text, text) IS 'Remove the limit of a queue or kind (scope queue | kind); returns false if it had none.';

-- ---------------------------------------------------------------------------
-- Snooze
-- ---------------------------------------------------------------------------

-- Put a RUNNING run back to QUEUED until delay has elapsed, same attempt; false when fenced.
-- A run of a unique key whose key has a QUEUED run already (one enqueued with unique_while =>
-- 'queued' while this one ran) does not go back: that run does the key's job, and this one
-- ends CANCELLED, its error naming it (retry.sql, "One QUEUED run per unique key"); true too.
-- The key's lock is taken before the run's row, as jobs.enqueue takes them.
CREATE OR REPLACE FUNCTION jobs.snooze(run_id bigint, worker text, delay interval, claim_token text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET enable_seqscan = off  -- plans made on a small jobs.runs (worker.sql)
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_key record;
    v_carrier bigint;
BEGIN
    IF snooze.delay IS NULL OR snooze.delay < interval '0' OR snooze.delay > interval '365 days' THEN
        RAISE EXCEPTION 'delay must be an interval between 0 and 365 days, got %', coalesce(snooze.delay::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._refuse('delay', jobs._mixed_signs_problem(snooze.delay));
    -- A run's kind and unique key never change: read unlocked, to lock the key first.
    SELECT r.kind, r.unique_key INTO v_key FROM jobs.runs AS r WHERE r.id = snooze.run_id AND r.status = 'RUNNING';
    IF v_key.unique_key IS NOT NULL THEN
        PERFORM jobs._require_read_committed('snoozing a run with a unique_key');
        PERFORM pg_advisory_xact_lock(jobs._unique_key(v_key.kind, v_key.unique_key));
    END IF;
    IF NOT jobs._hold_own_run(snooze.run_id, snooze.worker, snooze.claim_token) THEN
        RETURN FALSE;
    END IF;
    IF v_key.unique_key IS NOT NULL THEN
        v_carrier := jobs._queued_run_of_key(v_key.kind, v_key.unique_key, '{}');
        IF v_carrier IS NOT NULL AND NOT jobs._waited_on_chain(snooze.run_id) THEN
            UPDATE jobs.runs AS r
               SET status = 'CANCELLED', finished_at = now(),
                   error = 'snoozed' || jobs._folded_note(v_carrier)
             WHERE r.id = snooze.run_id AND NOT r.cancel_requested;
            RETURN FOUND;   -- nothing waits on it: no cascade
        END IF;
    END IF;
    UPDATE jobs.runs AS r
       -- Elapsed time (a day is 24 hours), as the reaper counts: now() + '1 day' would step a
       -- calendar day in the session's TimeZone, 23 or 25 hours across a DST change.
       SET status = 'QUEUED', scheduled_for = now() + make_interval(secs => extract(EPOCH FROM snooze.delay)),
           started_at = NULL, heartbeat_at = NULL, worker = NULL, claim_token_hash = NULL
     WHERE r.id = snooze.run_id AND NOT r.cancel_requested;
    RETURN jobs._notify_if(FOUND);
END $$;
COMMENT ON FUNCTION jobs.snooze(bigint, text, interval, text) IS 'RUNNING -> QUEUED at now() + delay (elapsed time: a day is 24 hours whatever the session''s TimeZone), same attempt, if still owned by worker (and its claim_token, if it was claimed with one) and no cancellation was requested; returns false (and changes nothing) otherwise. A run of a unique key that has a QUEUED run already ends CANCELLED instead, its error naming that run, which does the key''s job (unless runs wait on this one); READ COMMITTED only for a run of a unique key (25000).';

-- ---------------------------------------------------------------------------
-- What waits on what
-- ---------------------------------------------------------------------------

-- Blocked runs, each with the dependencies it still waits for.
CREATE OR REPLACE VIEW jobs.blocked AS
SELECT
    r.id,
    r.kind,
    r.queue,
    r.depends_on,
    w.waiting_on,
    r.created_at,
    now() - r.created_at AS waiting_for
FROM jobs.runs AS r
CROSS JOIN
    LATERAL (
        SELECT array_agg(d.dep ORDER BY d.dep) AS waiting_on
        FROM unnest(r.depends_on) AS d (dep)
        WHERE NOT EXISTS (
            WITH RECURSIVE chain AS (
                SELECT
                    c.id,
                    c.status
                FROM jobs.runs_all AS c
                WHERE c.id = d.dep
                UNION ALL
                SELECT
                    n.id,
                    n.status
                FROM chain INNER JOIN jobs.runs_all AS n ON chain.id = n.retry_of
            )

            SELECT FROM chain
            WHERE chain.status = 'COMPLETED'
        )
    ) AS w
WHERE r.blocked AND r.status = 'QUEUED';
COMMENT ON VIEW jobs.blocked IS 'QUEUED runs that wait on dependencies: depends_on, and waiting_on, those whose retry chain has not completed yet.';
