-- ===========================================================================
-- claim.sql: hand due QUEUED runs to a worker, never more RUNNING (or more starts
-- per trailing window) in any capped group than its limit, across any number of
-- claimers.
--
-- A run belongs to up to three capped groups: its definition (max_concurrent_runs),
-- its queue and its kind (jobs.limits; with per_key, the group is the queue or kind
-- together with the run's concurrency_key). It starts only when every group it
-- belongs to has room.
--
-- The algorithm (DESIGN.md "Claiming"); each step is its own statement, so under
-- READ COMMITTED each one sees a fresh snapshot (with nothing capped anywhere, steps 1 and 4
-- are one statement: below):
--   1. lock a pool of due QUEUED runs in claim order with FOR UPDATE SKIP LOCKED,
--      leaving out paused queues, queues not asked for, and runs whose dependencies
--      have not completed (blocked);
--   2. for the capped groups among them take each group's dispatch advisory lock,
--      in ONE ascending order of lock keys across all groups (so claimers never
--      wait in a cycle): first only tried; if nothing in the pool can be picked
--      without a busy one, waited for, but only for keys above every lock already
--      held, and by polling (for at most a second), never in the lock manager: the
--      claim holds row locks by then, and a holder of the group's lock that needed one
--      of them would close a deadlock cycle;
--   3. only then count, per group, the live RUNNING rows and (rate limits) the
--      starts within the trailing rate_period. The same statement (a snapshot taken after
--      the locks) reads the limits again: a limit group whose row no longer holds the
--      settings the claim read it with (changed or removed since, so its lock may not be
--      the one its claimers now take) gets no room, and a pool row whose queue or kind has a
--      limit the claim did not read for it (created since: jobs.set_limit waits for the
--      claims in progress, but a row written into jobs.limits by hand does not) does not
--      start; the caller claims again;
--   4. pick rows in pool order while every group a row belongs to has room and mark
--      them RUNNING. Rows of a group at its limit stay QUEUED (backpressure),
--      except new scheduled occurrences (jobs._new_occurrence: not a retry, not a run
--      snoozed since it began) of overlap_policy = 'skip' definitions that find no
--      free slot at all, which are recorded as CANCELLED with failure_reason 'Skipped'.
-- One claim per transaction: a second call would still hold the first call's
-- dispatch locks and could wait out of order, so it is refused.
--
-- The pool starts at batch_size rows, which is all an uncapped queue needs, and
-- grows by 3 x batch_size (to the ~4x oversample) only when limits held rows back,
-- so one crowded group cannot starve the batch. Each further slice leaves out every
-- group with no room left: those the claim found full under their locks, and those
-- whose RUNNING count (or starts in the rate window) reads as at the limit when the
-- slice is taken. So a capped backlog far longer than the oversample cannot fill it,
-- and a run whose groups all have room is reached however many full groups precede
-- it. Where a slice still found another group with no room left (one that filled up
-- in the meantime), the batch is short and the queue has more, the pool grows by a
-- further 3 x batch_size, up to c_pool_rows (500) rows or 4 x batch_size where that
-- is more. A slice that found no new full group held its rows back for busy groups
-- only, whose next rows the following slice would most likely bring: the pool stops
-- growing there. Where a slice met more than one group and none of the pool's rows
-- could start, the next slice is taken before any wait (its rows may belong to groups
-- nobody holds). In the later rounds a group whose lock key is below one already held
-- is only try-locked (never waited for), which keeps every wait in ascending order;
-- all of a claim's waits end a second after its first began.
-- With no limit and no capped definition defined at all (the common case) there can be no
-- group, and steps 2 to 4 would take the first slice as it is: one statement then locks it,
-- starts it and returns it (no count, so no later snapshot is needed). That statement is the
-- whole of an uncapped claim that finds work: it reads the claim's settings (whether any limit
-- or capped definition exists, the paused queues, the login's scope, the claim-token rule) in
-- one-time filters of its own. Only when it starts nothing does the claim read them on their
-- own and take the steps. Where something is capped but nothing in the pool turns out to be,
-- step 4 starts the pool as it is.
-- With capped definitions and no limit defined, a run belongs to at most one group, its
-- definition, and a claim is two statements. The first locks a pool of 4 x batch_size (the
-- steps' oversample) and tries the locks of its capped definitions one at a time, in the
-- order of their first row in the pool, only until the rows they may start (by the RUNNING
-- count it reads, not yet under the lock) and the pool's uncapped rows would fill the batch
-- with a small margin; a definition that read as full is not tried. Every lock held blocks
-- the other claimers whose pools meet that definition until this claim commits, so a claim
-- holds no more of them than it is likely to use. The next statement counts RUNNING under
-- those locks and starts the first batch_size rows in pool order that can start (as many
-- rows of each locked definition as it has room for, and every row of nothing capped); only
-- where they fill the batch (or the pool holds the whole queue), and no definition of the
-- pool has an overlap policy other than 'queue'; otherwise the steps run in full.
-- With only roomy limits defined (below: no rate limit) and no capped definition, a batch of
-- up to 20 is two statements: one locks the pool, its groups (shared) and a stripe of each,
-- reading the settings itself as the common case's does, the next counts RUNNING under those
-- locks and starts the whole pool if every group has a shared holder's room for its rows
-- there, and the limits of the pool's queues and kinds are still those the first statement
-- read (step 3); otherwise the steps run in full.
--
-- A claim of capped runs (through the capped definitions' statements, or the steps when a
-- capped definition or a limit that is not roomy exists) first takes one of three claim slots
-- (jobs._claim_slot, helpers.sql), held until it commits: at most three such claims are in
-- progress at once, whatever the number of worker processes. Each holds its groups' dispatch
-- locks until its commit, so claims beyond a few only find one another's groups busy, lock
-- runs they cannot start and hold up the completions that would make room. A claim that finds
-- no slot free within 0.1 s goes on without one.
--
-- Roomy limits (max_running and rate_limit both at least 500, or absent) do not make
-- every claimer wait for the one before it to commit: their lock is taken in SHARED mode,
-- by many claimers at once, and each of them starts at most 20 runs of the group. A shared
-- holder also takes one of the group's 16 stripe locks EXCLUSIVE (only tried, never waited
-- for; with all 16 held the group counts as busy for this claim), so at most h = 16
-- claimers start its runs at once. Only then, in a later statement, does it count RUNNING
-- (c) and recent starts; its room is min(20, limit - c - (h - 1) x 20). Whoever took the
-- lock last saw every earlier holder either committed (in c) or still holding (one of
-- the other h - 1), so the sum never passes the limit. Where the bound of 16 leaves less
-- than 20 (near the limit), the claimer reads the exact h from pg_locks (itself included;
-- pg_locks takes every lock partition's lock, so it is read only then) and counts again
-- in a later statement: the same argument with the holders it read. A claimer that needs
-- exclusivity (a tight limit, a definition) takes the lock EXCLUSIVE and waits for the
-- shared holders to commit. Near a roomy limit this leaves up to (h - 1) x 20 slots
-- unused while claimers overlap; it never exceeds it.
--
-- Dispatch lock keys (the key table is in sql/helpers.sql): a definition's is
-- jobs._dispatch_key(id); a limit's is jobs._limit_key(label), label being the JSON array
-- [scope, name] or, per key, [scope, name, concurrency_key]. The claim computes them inline:
-- a call of a function that pins search_path saves and restores settings each time.
-- ===========================================================================

-- Claim up to batch_size due runs for worker (default: an id derived from this session).
-- kinds / queues: only runs of these kinds / queues (NULL = all). A login scoped by
-- jobs.scope_worker (jobs.worker_scopes, keyed by session_user, so SET ROLE cannot leave it)
-- gets only what both it asks for and its scope allows.
-- heartbeat => true stamps heartbeat_at at claim time: for a caller that heartbeats
-- from now on (the Python driver), so a crash right after the claim is reaped after the
-- heartbeat timeout; without it the run counts as never heartbeated (orphan timeout).
-- claim_token: a secret the worker generated (16 to 200 characters); only its sha256 is
-- stored, in claim_token_hash, and its later calls on these runs must present the same
-- token (worker.sql). Without one, the runs are fenced by the worker id alone; with
-- jobs.config.require_claim_token set, a claim without one is refused.
-- Its statements are planned once per session (generic plans): planning costs more than
-- running most of them. The plans of the statements that lock runs from the queue are made
-- with sorts disabled, so they can only walk runs_claim_idx (docs/performance.md); such a plan
-- looks expensive enough to be JIT-compiled, and none is worth it (jit = off).
-- The runs a claim may take now, before the caller's kinds, queues and paused queues: QUEUED,
-- due, and not waiting on dependencies, with the columns the claim's pool needs. The claim's
-- pool statements select from it; a view is expanded into the statement that reads it, so it
-- costs nothing when the claim runs and the claim's plans stay as they were.
CREATE OR REPLACE VIEW jobs._claimable AS
SELECT
    r.id,
    r.definition_id,
    r.origin,
    r.queue,
    r.kind,
    r.concurrency_key,
    r.priority,
    r.scheduled_for
FROM jobs.runs AS r
WHERE r.status = 'QUEUED' AND r.scheduled_for <= now() AND NOT r.blocked;
COMMENT ON VIEW jobs._claimable IS 'Private: the QUEUED runs that are due and not blocked, with the columns jobs.claim''s pool statements read.';

-- The same runs within the login's scope (jobs.worker_scopes) and outside paused queues, for
-- the statements that read those settings themselves. Each is read once per statement: no
-- scope row, a NULL array or no paused queue makes its test NULL (open) at once. A NULL
-- element of a scope array matches nothing, as in the steps.
CREATE OR REPLACE VIEW jobs._claimable_here AS
SELECT r.*
FROM jobs._claimable AS r
WHERE
    coalesce(r.kind = any((
        SELECT array_remove(s.kinds, NULL) FROM jobs.worker_scopes AS s
        WHERE s.role = session_user
    )::text[]), TRUE)
    AND coalesce(r.queue = any((
        SELECT array_remove(s.queues, NULL) FROM jobs.worker_scopes AS s
        WHERE s.role = session_user
    )::text[]), TRUE)
    AND coalesce(r.queue <> all((SELECT array_agg(p.name) FROM jobs.paused_queues AS p)::text[]), TRUE);
COMMENT ON VIEW jobs._claimable_here IS 'Private: jobs._claimable within the session login''s worker scope and outside paused queues.';

-- The limits whose dispatch lock jobs.claim takes exclusively: below 500 RUNNING or 500 starts
-- per period (the claim's c_shared_min); the others it locks shared. Claims of runs under such a
-- limit follow one another, commit after commit, so a worker that keeps several claims in
-- flight gains by keeping few while its batches hold such runs (the Python worker: at most 3).
-- Readable by jobs_worker.
CREATE OR REPLACE VIEW jobs.tight_limits AS
SELECT
    l.scope,
    l.name
FROM jobs.limits AS l
WHERE l.max_running < 500 OR l.rate_limit < 500;
COMMENT ON VIEW jobs.tight_limits IS 'The limits whose dispatch lock jobs.claim takes exclusively (below 500 running or 500 starts per period): claims of their runs follow one another commit by commit.';

-- What jobs.claim does when its common case did not claim: a limit or a capped definition is
-- defined (or a claim token is missing where one is required), or the queue had nothing due for
-- it. A function of its own, so that a session whose claims take only the common case never
-- compiles it: a session's first claim compiles what it calls, and this is most of the claim.
-- Called only by jobs.claim, under its settings and its identity, after its checks and locks;
-- worker and token_hash are what the claim stamps on the runs, hint the session's claim path.
CREATE OR REPLACE FUNCTION jobs._claim_rest(
    batch_size integer, worker text, kinds text[], heartbeat boolean, queues text[], token_hash bytea, hint text
)
RETURNS SETOF jobs.runs
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_void text;
    v_sort text;
    v_worker ALIAS FOR $2;          -- (the claim's own names, so its statements read alike)
    v_token_hash ALIAS FOR $6;
    v_hint ALIAS FOR $7;
    -- A limit of at least c_shared_min (running and rate) is locked in shared mode: many
    -- claimers hold it at once, each starting at most c_shared_batch of its runs, and each
    -- counts the others as if they all did (see step 3).
    c_shared_min CONSTANT integer := 500;
    c_shared_batch CONSTANT integer := 20;
    -- Each shared holder also holds one of c_stripes stripe locks of the group exclusively,
    -- so at most c_stripes claimers start its runs at once: a bound on them that needs no
    -- read of pg_locks (which takes every lock partition's lock) while the limit is far.
    c_stripes CONSTANT integer := 16;
    v_new_ids bigint[];
    v_any_limit boolean;
    v_roomy_ok boolean;             -- the roomy pool's groups are all locked shared, with a stripe
    v_lim_scope text[];             -- the roomy pool's groups: scope, name, per_key, key,
    v_lim_name text[];
    v_lim_per_key boolean[];
    v_lim_ckey text[];
    v_lim_max integer[];            --   max_running, and how many of the pool's rows are theirs
    v_lim_demand integer[];
    v_lim_queues text[];            -- the roomy pool's rows' queues and kinds
    v_lim_kinds text[];
    v_defs_pool bigint[];           -- the capped definitions' pool: each row's definition,
    v_defs_ids bigint[];            --   its capped definitions, their max_concurrent_runs
    v_defs_caps integer[];
    v_defs_locked boolean[];        --   and whether their locks were taken,
    v_defs_overlap boolean;         --   whether one has an overlap policy other than 'queue',
    v_defs_open integer;            --   how many rows are not of a definition found busy,
    v_defs_cover bigint;            --   and how many of them the RUNNING counts it read leave room for
    v_any_capped boolean;
    v_held_key bigint;              -- the highest dispatch lock key held before the steps
    v_slot boolean;                 -- a claim slot was taken (jobs._claim_slot); NULL: not tried
BEGIN
    -- Only roomy limits (max_running at least c_shared_min, no rate limit), no capped
    -- definition, and a batch no larger than c_shared_batch: the steps below would lock every
    -- group of the pool shared, each with a stripe, and find room for the whole pool unless a
    -- group is near its limit. Two statements do the same, the first locking the pool and its
    -- groups, the second counting RUNNING under those locks and starting the whole pool only
    -- if every group has room for its rows in the pool as a shared holder (limit - running -
    -- (c_stripes - 1) x c_shared_batch, step 3's bound). Where a lock or that room is missing,
    -- or a limit of the pool's queues and kinds is not as the first statement read it (changed,
    -- removed or created since: step 3), nothing is started and the steps below run from the
    -- start: they lock the same rows and groups again (locks held already are granted at once)
    -- and count exactly.
    -- The first statement reads the settings in one-time filters, as the common case's does: a
    -- capped definition or a missing claim token locks nothing, and the steps take the claim,
    -- as they do when a group of the pool is not roomy. A session takes this path when its last
    -- settings read found only roomy limits (the hint), so the first claim after that read
    -- takes the steps.
    IF v_hint = 'roomy' AND _claim_rest.batch_size <= c_shared_batch THEN
        v_sort := current_setting('enable_sort');
        v_void := set_config('enable_sort', 'off', TRUE);
        WITH c AS (
            SELECT r.id, r.queue, r.kind, r.concurrency_key
              FROM jobs._claimable_here AS r
             WHERE NOT EXISTS (SELECT FROM jobs.definitions AS d WHERE d.max_concurrent_runs IS NOT NULL)
               AND (v_token_hash IS NOT NULL OR NOT coalesce((SELECT c.require_claim_token FROM jobs.config AS c), FALSE))
               AND (_claim_rest.kinds IS NULL OR r.kind = ANY (_claim_rest.kinds))
               AND (_claim_rest.queues IS NULL OR r.queue = ANY (_claim_rest.queues))
             ORDER BY r.priority DESC, r.scheduled_for, r.id
             LIMIT _claim_rest.batch_size
               FOR UPDATE SKIP LOCKED
        ),
        g AS (   -- the pool's limit groups, as step 2 labels them, and their rows in the pool
            SELECT m.scope, m.name, m.per_key, CASE WHEN m.per_key THEN c.concurrency_key END AS ckey,
                   m.max_running, count(*)::integer AS demand,
                   coalesce(m.max_running, 0) >= c_shared_min AND m.rate_limit IS NULL AS roomy
              FROM c JOIN jobs.limits AS m
                ON (m.scope = 'queue' AND m.name = c.queue) OR (m.scope = 'kind' AND m.name = c.kind)
             GROUP BY m.scope, m.name, m.per_key, 4, m.max_running, m.rate_limit
        ),
        k AS (
            SELECT g.*, CASE WHEN g.per_key THEN jsonb_build_array(g.scope, g.name, g.ckey)::text
                             ELSE jsonb_build_array(g.scope, g.name)::text END AS label
              FROM g
        ),
        l AS (   -- try each group's lock shared, then one of its stripes (keys as in step 2)
            SELECT k.*,
                   CASE WHEN NOT k.roomy THEN FALSE
                        WHEN NOT pg_try_advisory_xact_lock_shared(hashtextextended('dispatch:' || k.label, 0))
                            THEN FALSE
                        ELSE EXISTS (SELECT FROM generate_series(0, c_stripes - 1) AS j
                                      WHERE pg_try_advisory_xact_lock(hashtextextended(
                                            'dispatch:' || k.label || '#' || (pg_backend_pid() + j) % c_stripes, 0)))
                   END AS locked
              FROM k
        )
        SELECT (SELECT coalesce(array_agg(c.id), '{}') FROM c),
               (SELECT array_agg(c.queue) FROM c), (SELECT array_agg(c.kind) FROM c),
               EXISTS (SELECT FROM jobs.limits),
               coalesce(bool_and(l.locked), TRUE),
               array_agg(l.scope), array_agg(l.name), array_agg(l.per_key), array_agg(l.ckey),
               array_agg(l.max_running), array_agg(l.demand)
          INTO v_new_ids, v_lim_queues, v_lim_kinds, v_any_limit, v_roomy_ok, v_lim_scope, v_lim_name,
               v_lim_per_key, v_lim_ckey, v_lim_max, v_lim_demand
          FROM l;
        v_void := set_config('enable_sort', v_sort, TRUE);
        IF NOT v_any_limit THEN   -- the hint is stale: the statement's groups were none
            v_void := set_config('pgtick.claim_steps', 'off', FALSE);
        END IF;
        IF v_roomy_ok AND cardinality(v_new_ids) > 0 THEN
            RETURN QUERY
            WITH rc AS MATERIALIZED (
                SELECT r.queue, r.kind, r.concurrency_key AS ckey, count(*) AS n
                  FROM jobs.runs AS r
                 WHERE r.status = 'RUNNING'
                 GROUP BY r.queue, r.kind, r.concurrency_key
            ),
            -- Room only where every limit of the pool still holds the settings the first
            -- statement read (a limit changed or removed since then was locked by its old
            -- grouping) and none was created since for a queue or kind of the pool.
            room AS (
                SELECT coalesce(bool_and(
                           m.max_running IS NOT DISTINCT FROM g.max_running AND m.per_key = g.per_key
                           AND m.rate_limit IS NULL AND m.rate_period IS NULL
                           AND g.max_running
                               - (SELECT coalesce(sum(rc.n), 0) FROM rc
                                   WHERE CASE g.scope WHEN 'queue' THEN rc.queue = g.name ELSE rc.kind = g.name END
                                     AND (NOT g.per_key OR rc.ckey IS NOT DISTINCT FROM g.ckey))
                               - (c_stripes - 1) * c_shared_batch >= g.demand), TRUE)
                       AND NOT EXISTS (
                           SELECT FROM jobs.limits AS n
                            WHERE ((n.scope = 'queue' AND n.name = ANY (v_lim_queues))
                                   OR (n.scope = 'kind' AND n.name = ANY (v_lim_kinds)))
                              AND NOT EXISTS (SELECT FROM unnest(v_lim_scope, v_lim_name) AS u (scope, name)
                                               WHERE u.scope = n.scope AND u.name = n.name)) AS ok
                  FROM unnest(v_lim_scope, v_lim_name, v_lim_per_key, v_lim_ckey, v_lim_max, v_lim_demand)
                       AS g (scope, name, per_key, ckey, max_running, demand)
                  LEFT JOIN jobs.limits AS m ON m.scope = g.scope AND m.name = g.name
            ),
            t AS MATERIALIZED (SELECT clock_timestamp() AS at),
            started AS (
                UPDATE jobs.runs AS r
                   SET status = 'RUNNING', started_at = (SELECT t.at FROM t), worker = v_worker,
                       claim_token_hash = v_token_hash,
                       heartbeat_at = CASE WHEN _claim_rest.heartbeat THEN (SELECT t.at FROM t) END
                 WHERE r.id = ANY (v_new_ids) AND (SELECT room.ok FROM room)
                RETURNING r.*
            )
            SELECT s.* FROM started AS s ORDER BY s.priority DESC, s.scheduled_for, s.id;
            IF FOUND THEN
                RETURN;
            END IF;
        END IF;
    -- Capped definitions but no limit (the header says what the two statements do). The
    -- definitions' locks are only tried, never waited for, so in any order. The rows started are
    -- picked greedily in pool order, as the steps pick, except that a definition this claim did
    -- not try counts as busy (its rows are the next claim's); where they do not fill the batch,
    -- or a definition of the pool has an overlap policy other than 'queue',
    -- nothing is started here and the steps take the claim from the start (they grow the pool
    -- past the held-back rows, wait for busy definitions and apply the overlap policies). The
    -- locks taken here stay held; the steps count them as held (v_held_key), so their waits
    -- keep the ascending order.
    ELSIF v_hint = 'defs' THEN
        v_slot := jobs._claim_slot();
        v_sort := current_setting('enable_sort');
        v_void := set_config('enable_sort', 'off', TRUE);
        WITH RECURSIVE c AS (
            SELECT r.id, r.definition_id
              FROM jobs._claimable_here AS r
             WHERE NOT EXISTS (SELECT FROM jobs.limits AS l)
               AND (v_token_hash IS NOT NULL OR NOT coalesce((SELECT c.require_claim_token FROM jobs.config AS c), FALSE))
               AND (_claim_rest.kinds IS NULL OR r.kind = ANY (_claim_rest.kinds))
               AND (_claim_rest.queues IS NULL OR r.queue = ANY (_claim_rest.queues))
             ORDER BY r.priority DESC, r.scheduled_for, r.id
             LIMIT 4 * _claim_rest.batch_size
               FOR UPDATE SKIP LOCKED
        ),
        p AS MATERIALIZED (   -- the pool, numbered in claim order (c's rows come in the order locked)
            SELECT c.id, c.definition_id, row_number() OVER () AS ord FROM c
        ),
        f AS MATERIALIZED (   -- its capped definitions, numbered by their first row (key: helpers.sql)
            SELECT d.id, d.max_concurrent_runs, d.overlap_policy,
                   hashtextextended('dispatch:' || d.id, 0) AS lock_key, x.n,
                   row_number() OVER (ORDER BY x.first) AS k
              FROM (SELECT p.definition_id, count(*) AS n, min(p.ord) AS first
                      FROM p WHERE p.definition_id IS NOT NULL
                     GROUP BY p.definition_id) AS x
              JOIN jobs.definitions AS d ON d.id = x.definition_id AND d.max_concurrent_runs IS NOT NULL
        ),
        -- The walk: one definition per step, in order, while the rows it may start (covered:
        -- the uncapped rows, then each locked definition's rows up to the room it read) fall
        -- short of the batch and its margin. A recursive query runs its steps one after another,
        -- so the locks past that point are never tried.
        w (k, covered, id, locked) AS (
            SELECT 0::bigint, (SELECT count(*) FROM p) - (SELECT coalesce(sum(f.n), 0) FROM f), NULL::bigint, FALSE
            UNION ALL
            SELECT e.k, w.covered + CASE WHEN e.locked THEN e.room ELSE 0 END, e.id, e.locked
              FROM w CROSS JOIN LATERAL (
                   SELECT q.k, q.id, q.room,
                          CASE WHEN q.room > 0 THEN pg_try_advisory_xact_lock(q.lock_key) ELSE FALSE END AS locked
                     FROM (SELECT f.k, f.id, f.lock_key,
                                  greatest(least(f.n, f.max_concurrent_runs
                                                      - (SELECT count(*) FROM jobs.runs AS r
                                                          WHERE r.status = 'RUNNING' AND r.definition_id = f.id)),
                                           0) AS room
                             FROM f
                            WHERE f.k = w.k + 1 AND w.covered < _claim_rest.batch_size + 1 + _claim_rest.batch_size / 5
                           OFFSET 0) AS q
                   ) AS e
        ),
        d AS MATERIALIZED (   -- every capped definition of the pool; those not tried count as busy
            SELECT f.id, f.max_concurrent_runs, f.overlap_policy, f.lock_key, coalesce(w.locked, FALSE) AS locked
              FROM f LEFT JOIN w ON w.id = f.id
        )
        SELECT (SELECT coalesce(array_agg(c.id), '{}') FROM c),
               (SELECT coalesce(array_agg(c.definition_id), '{}') FROM c),
               coalesce(array_agg(d.id), '{}'),
               coalesce(array_agg(d.max_concurrent_runs), '{}'),
               coalesce(array_agg(d.locked), '{}'),
               coalesce(bool_or(d.overlap_policy <> 'queue'), FALSE),
               max(d.lock_key) FILTER (WHERE d.locked),
               EXISTS (SELECT FROM jobs.definitions AS x WHERE x.max_concurrent_runs IS NOT NULL),
               (SELECT count(*) FROM c WHERE c.definition_id IS NULL
                                          OR c.definition_id NOT IN (SELECT d.id FROM d WHERE NOT d.locked)),
               (SELECT max(w.covered) FROM w)
          INTO v_new_ids, v_defs_pool, v_defs_ids, v_defs_caps, v_defs_locked, v_defs_overlap, v_held_key,
               v_any_capped, v_defs_open, v_defs_cover
          FROM d;
        v_void := set_config('enable_sort', v_sort, TRUE);
        IF NOT v_any_capped THEN   -- the hint is stale: nothing is capped any more
            v_void := set_config('pgtick.claim_steps', 'off', FALSE);
        END IF;
        -- (Rows of a definition whose lock is busy, or was not tried, cannot start: where the
        -- room the first statement read cannot fill the batch from a full pool, or nothing can
        -- start from a pool that holds the whole queue, the steps take the claim at once.)
        IF cardinality(v_new_ids) > 0 AND NOT v_defs_overlap
           AND (CASE WHEN cardinality(v_new_ids) < 4 * _claim_rest.batch_size THEN v_defs_open >= 1
                     ELSE v_defs_cover >= _claim_rest.batch_size END) THEN
            RETURN QUERY
            WITH g AS (   -- each capped definition's room: none where its lock is busy
                SELECT u.id,
                       CASE WHEN u.locked
                            THEN greatest(u.cap - (SELECT count(*) FROM jobs.runs AS r
                                                    WHERE r.status = 'RUNNING' AND r.definition_id = u.id), 0)
                            ELSE 0 END AS free
                  FROM unnest(v_defs_ids, v_defs_caps, v_defs_locked) AS u (id, cap, locked)
            ),
            p AS (
                SELECT u.id, u.ord, u.def, row_number() OVER (PARTITION BY u.def ORDER BY u.ord) AS nth
                  FROM unnest(v_new_ids, v_defs_pool) WITH ORDINALITY AS u (id, def, ord)
            ),
            can AS (   -- the rows that can start, numbered in pool order
                SELECT p.id, row_number() OVER (ORDER BY p.ord) AS k
                  FROM p LEFT JOIN g ON g.id = p.def
                 WHERE g.id IS NULL OR p.nth <= g.free
            ),
            pick AS (
                SELECT array_agg(can.id) AS ids FROM can WHERE can.k <= _claim_rest.batch_size
            ),
            t AS MATERIALIZED (SELECT clock_timestamp() AS at),
            started AS (
                UPDATE jobs.runs AS r
                   SET status = 'RUNNING', started_at = (SELECT t.at FROM t), worker = v_worker,
                       claim_token_hash = v_token_hash,
                       heartbeat_at = CASE WHEN _claim_rest.heartbeat THEN (SELECT t.at FROM t) END
                 WHERE r.id = ANY ((SELECT pick.ids FROM pick)::bigint[])
                   AND ((SELECT cardinality(pick.ids) FROM pick) = _claim_rest.batch_size
                        OR cardinality(v_new_ids) < 4 * _claim_rest.batch_size)
                RETURNING r.*
            )
            SELECT s.* FROM started AS s ORDER BY s.priority DESC, s.scheduled_for, s.id;
            IF FOUND THEN
                RETURN;
            END IF;
        END IF;
    END IF;

    -- The steps: their variables are a block of their own, set up only when they run.
    DECLARE
        -- How long a claim that found nothing pickable polls its busy groups before it returns
        -- what it has (nothing): the caller claims again.
        c_wait CONSTANT interval := interval '1 second';
        v_wait_until timestamptz;       -- set by the first wait: every wait of the claim ends by then
        -- The pool grows past the ~4x oversample only while the groups it meets keep turning out
        -- full, and stops at c_pool_rows rows (4 x batch_size where that is more).
        c_pool_rows CONSTANT integer := 500;
        v_pool_max integer := greatest(4 * _claim_rest.batch_size, c_pool_rows);
        v_exact boolean;
        v_striped boolean[] := '{}';    -- per group: holds one of its stripes
        v_holders integer[];
        v_started timestamptz;
        v_require_token boolean;
        v_round integer := 0;
        v_limit integer;
        v_paused text[];
        v_kinds text[] := _claim_rest.kinds;     -- what is asked, narrowed to the login's scope
        v_queues text[] := _claim_rest.queues;
        v_scope_kinds text[];
        v_scope_queues text[];
        v_has_limits boolean;
        v_has_tight boolean;            -- some limit is not roomy (below c_shared_min, or a rate)
        v_has_capped boolean;
        v_has_exclusive boolean;        -- some limit is locked exclusively (jobs.tight_limits)
        v_path text;                    -- what the hint should say (v_hint)
        v_overlap boolean := FALSE;     -- some group is a definition with overlap_policy
        v_new_overlap boolean;          --   buffer_one or cancel_other (this slice's)
        v_pool_ids bigint[] := '{}';    -- pool in claim order, and per row:
        v_pool_defs bigint[] := '{}';   --   definition (NULL: ad-hoc)
        v_pool_origin text[] := '{}';   --   origin
        v_pool_queues text[] := '{}';   --   queue
        v_pool_kinds text[] := '{}';    --   kind
        v_pool_keys text[] := '{}';     --   concurrency_key
        v_groups jobs._claim_group[] := '{}';   -- every capped group met so far
        v_labels text[] := '{}';        -- their labels, for lookups
        v_new jobs._claim_group[];
        v_g jobs._claim_group;
        v_max_key bigint := v_held_key; -- highest dispatch lock key held
        v_busy boolean;                 -- some group could not be locked yet
        v_todo boolean;
        v_shared_todo boolean;
        v_waited boolean;               -- this round waited for a busy group
        v_waited_any boolean := FALSE;  -- some round did: the paused queues are read again
        v_nfull integer := 0;           -- how many groups are known to have no room left,
        v_nfull_before integer;         --   and how many were before this round's slice
        v_more boolean;                 -- the batch is short and a further slice may fill it
        v_room integer[];
        v_row_groups integer[] := '{}'; -- per pool row, 3 slots: its definition, queue, kind group
        v_unread boolean[] := '{}';     -- per pool row: a limit of its queue or kind was created since
        v_new_slots integer[];
        j integer;
        v_gi integer;
        v_ok boolean;
        v_pick bigint[];
        v_room_defs bigint[];           -- capped definitions counted under their locks, and
        v_room_free integer[];          --   their free slots (for the overlap policies)
        v_skip bigint[];
        v_full_defs bigint[] := '{}';   -- groups with no room for another pool row
        v_full text[] := '{}';
        i integer;
    BEGIN
        -- What the claim needs to know before it looks at the queue, in one statement: paused
        -- queues, whether any limit or capped definition exists, the login's scope and whether a
        -- claim token is required. A pause or scope committed before this statement starts is
        -- seen by it.
        SELECT coalesce((SELECT array_agg(p.name) FROM jobs.paused_queues AS p), '{}'),
               (SELECT bool_or(l.rate_limit IS NOT NULL OR coalesce(l.max_running, 0) < c_shared_min)
                  FROM jobs.limits AS l),   -- NULL: no limit at all
               EXISTS (SELECT FROM jobs.definitions AS d WHERE d.max_concurrent_runs IS NOT NULL),  -- definitions_capped_idx
               EXISTS (SELECT FROM jobs.tight_limits),
               s.kinds, s.queues,
               (SELECT c.require_claim_token FROM jobs.config AS c)
          INTO v_paused, v_has_tight, v_has_capped, v_has_exclusive, v_scope_kinds, v_scope_queues,
               v_require_token
          FROM (SELECT) AS one
          LEFT JOIN jobs.worker_scopes AS s ON s.role = session_user;
        v_has_limits := v_has_tight IS NOT NULL;
        v_path := CASE WHEN v_has_tight OR (v_has_capped AND v_has_limits) THEN 'on'
                       WHEN v_has_capped THEN 'defs' WHEN v_has_limits THEN 'roomy' ELSE 'off' END;
        IF v_path <> v_hint THEN   -- the hint follows the settings
            v_void := set_config('pgtick.claim_steps', v_path, FALSE);
        END IF;
        -- A claim slot where a group may be locked exclusively (a capped definition, a limit that
        -- is not roomy); roomy limits alone are locked shared, by many claims at once.
        IF (v_has_capped OR v_has_exclusive) AND v_slot IS NULL THEN
            v_slot := jobs._claim_slot();
        END IF;
        IF v_token_hash IS NULL AND v_require_token THEN
            RAISE EXCEPTION 'claim_token is required (jobs.config.require_claim_token) and none was given'
                USING ERRCODE = '22023',
                      HINT = 'Pass claim_token => a secret generated once per worker process, and the same token to heartbeat, complete and fail.';
        END IF;
        IF v_scope_kinds IS NOT NULL THEN
            v_kinds := CASE WHEN v_kinds IS NULL THEN v_scope_kinds
                            ELSE ARRAY(SELECT k FROM unnest(v_kinds) AS k WHERE k = ANY (v_scope_kinds)) END;
        END IF;
        IF v_scope_queues IS NOT NULL THEN
            v_queues := CASE WHEN v_queues IS NULL THEN v_scope_queues
                             ELSE ARRAY(SELECT q FROM unnest(v_queues) AS q WHERE q = ANY (v_scope_queues)) END;
        END IF;
        IF cardinality(v_kinds) = 0 OR cardinality(v_queues) = 0 THEN
            RETURN;   -- nothing asked for is in the scope
        END IF;

        -- Nothing is capped anywhere: the common case's statement started what there was (if
        -- the hint skipped it, the steps below take the batch; none of its groups is capped).
        IF v_path = 'off' AND v_hint = 'off' THEN
            RETURN;   -- nothing due
        END IF;

        LOOP
            v_round := v_round + 1;
            v_limit := CASE WHEN v_round = 1 THEN _claim_rest.batch_size
                            ELSE least(3 * _claim_rest.batch_size, v_pool_max - cardinality(v_pool_ids)) END;
            v_nfull_before := v_nfull;

            -- 1. Lock the next slice of the candidate pool, in claim order. Both slices'
            -- statements are planned once per session (and again only when jobs.runs changes)
            -- with sorts disabled: then no plan can sort the queue, and the only ordered path
            -- left is runs_claim_idx, whatever the statistics say about the backlog and
            -- whatever the LIMIT and the exclusions (tests/sql/test_claim.py checks both plans
            -- on a long backlog). A plan made for each second slice's values would cost more to
            -- make than the statement costs to run.
            v_sort := current_setting('enable_sort');
            v_void := set_config('enable_sort', 'off', TRUE);
            IF v_round = 1 THEN
                WITH c AS (
                    SELECT r.*
                      FROM jobs._claimable AS r
                     WHERE (v_kinds IS NULL OR r.kind = ANY (v_kinds))
                       AND (v_queues IS NULL OR r.queue = ANY (v_queues))
                       AND r.queue <> ALL (v_paused)
                     ORDER BY r.priority DESC, r.scheduled_for, r.id
                     LIMIT v_limit
                       FOR UPDATE SKIP LOCKED
                )
                -- The pool's arrays come from one pass over c, which holds its rows in the order
                -- they were locked (claim order, the LIMIT over the ordered index scan): they
                -- stay aligned and in claim order with no sort per array.
                SELECT coalesce(array_agg(c.id), '{}'),
                       coalesce(array_agg(c.definition_id), '{}'),
                       coalesce(array_agg(c.origin), '{}'),
                       coalesce(array_agg(c.queue), '{}'),
                       coalesce(array_agg(c.kind), '{}'),
                       coalesce(array_agg(c.concurrency_key), '{}')
                  INTO v_new_ids, v_pool_defs, v_pool_origin, v_pool_queues, v_pool_kinds,
                       v_pool_keys
                  FROM c;
                v_void := set_config('enable_sort', v_sort, TRUE);
                IF cardinality(v_new_ids) = 0 THEN
                    RETURN;   -- nothing due
                END IF;
            ELSE
                -- A further slice leaves out the groups with no room: those the claim found full
                -- under their locks, and those whose RUNNING runs (or starts within the rate
                -- window) read as at their limit now. The latter are read without their locks,
                -- so a group read as full may have room by the time the claim counts: then the
                -- claim is as one that read a moment earlier, and it never starts more than a
                -- limit allows (starts are counted under the locks). Definitions with an overlap
                -- policy other than 'queue' are left out only when found full. The lookups are
                -- hashed (NOT IN over a subquery), so a slice reads its rows at one cost each
                -- however many groups are full.
                WITH rc AS MATERIALIZED (   -- the RUNNING runs per queue, kind, key and definition
                    SELECT r.queue, r.kind, r.concurrency_key AS ckey, r.definition_id, count(*) AS n
                      FROM jobs.runs AS r
                     WHERE r.status = 'RUNNING'
                     GROUP BY r.queue, r.kind, r.concurrency_key, r.definition_id
                ),
                fd AS MATERIALIZED (
                    SELECT unnest(v_full_defs) AS id
                    UNION
                    SELECT d.id
                      FROM (SELECT rc.definition_id, sum(rc.n) AS n FROM rc
                             WHERE rc.definition_id IS NOT NULL GROUP BY rc.definition_id) AS x
                      JOIN jobs.definitions AS d ON d.id = x.definition_id
                     WHERE d.overlap_policy = 'queue' AND x.n >= d.max_concurrent_runs
                ),
                fl AS MATERIALIZED (   -- labels as in step 2
                    SELECT unnest(v_full) AS label
                    UNION
                    SELECT g.label
                      FROM (SELECT CASE WHEN m.per_key THEN jsonb_build_array(m.scope, m.name, rc.ckey)::text
                                        ELSE jsonb_build_array(m.scope, m.name)::text END AS label,
                                   m.max_running, rc.n
                              FROM jobs.limits AS m
                              JOIN rc ON CASE m.scope WHEN 'queue' THEN rc.queue = m.name ELSE rc.kind = m.name END
                             WHERE v_has_limits AND m.max_running IS NOT NULL) AS g
                     GROUP BY g.label, g.max_running
                    HAVING sum(g.n) >= g.max_running
                    UNION
                    SELECT x.label
                      FROM jobs._rate_starts AS x
                      JOIN jobs.limits AS m
                        ON m.scope = (x.label::jsonb) ->> 0 AND m.name = (x.label::jsonb) ->> 1
                       AND jsonb_array_length(x.label::jsonb) = CASE WHEN m.per_key THEN 3 ELSE 2 END
                     WHERE v_has_limits AND m.rate_limit IS NOT NULL AND x.started_at > now() - m.rate_period
                     GROUP BY x.label, m.rate_limit
                    HAVING sum(x.starts) >= m.rate_limit
                )
                SELECT coalesce(array_agg(c.id ORDER BY c.priority DESC, c.scheduled_for, c.id), '{}'),
                       v_pool_defs || coalesce(array_agg(c.definition_id ORDER BY c.priority DESC, c.scheduled_for, c.id), '{}'),
                       v_pool_origin || coalesce(array_agg(c.origin ORDER BY c.priority DESC, c.scheduled_for, c.id), '{}'),
                       v_pool_queues || coalesce(array_agg(c.queue ORDER BY c.priority DESC, c.scheduled_for, c.id), '{}'),
                       v_pool_kinds || coalesce(array_agg(c.kind ORDER BY c.priority DESC, c.scheduled_for, c.id), '{}'),
                       v_pool_keys || coalesce(array_agg(c.concurrency_key ORDER BY c.priority DESC, c.scheduled_for, c.id), '{}')
                  INTO v_new_ids, v_pool_defs, v_pool_origin, v_pool_queues, v_pool_kinds, v_pool_keys
                  FROM (SELECT r.*
                          FROM jobs._claimable AS r
                         WHERE (v_kinds IS NULL OR r.kind = ANY (v_kinds))
                           AND (v_queues IS NULL OR r.queue = ANY (v_queues))
                           AND r.queue <> ALL (v_paused)
                           AND r.id NOT IN (SELECT unnest(v_pool_ids))
                           AND (r.definition_id IS NULL OR r.definition_id NOT IN (SELECT fd.id FROM fd))
                           AND (NOT EXISTS (SELECT FROM fl)
                                OR (jsonb_build_array('queue', r.queue)::text NOT IN (SELECT fl.label FROM fl)
                                    AND jsonb_build_array('queue', r.queue, r.concurrency_key)::text
                                        NOT IN (SELECT fl.label FROM fl)
                                    AND jsonb_build_array('kind', r.kind)::text NOT IN (SELECT fl.label FROM fl)
                                    AND jsonb_build_array('kind', r.kind, r.concurrency_key)::text
                                        NOT IN (SELECT fl.label FROM fl)))
                         ORDER BY r.priority DESC, r.scheduled_for, r.id
                         LIMIT v_limit
                           FOR UPDATE SKIP LOCKED) AS c;
                v_void := set_config('enable_sort', v_sort, TRUE);
            END IF;
            v_pool_ids := v_pool_ids || v_new_ids;

            -- 2. The capped groups new in this slice, in ascending lock key order; first only
            -- try their dispatch locks: a busy one is someone else's claim in flight.
            -- The same statement places each new pool row in its groups: three slots per row
            -- (definition, queue limit, kind limit) holding the group's position in v_groups
            -- (0: none), new groups numbered after the known ones in the order they are added.
            -- (An ad-hoc slice with no limit defined has none: skip the query.)
            v_new := '{}';
            v_new_slots := array_fill(0, ARRAY[3 * cardinality(v_new_ids)]);
            IF v_has_limits OR cardinality(array_remove(v_pool_defs[cardinality(v_pool_ids) - cardinality(v_new_ids) + 1:], NULL)) > 0 THEN
                WITH p AS (
                    SELECT *
                      FROM unnest(v_pool_defs[cardinality(v_pool_ids) - cardinality(v_new_ids) + 1:],
                                  v_pool_queues[cardinality(v_pool_ids) - cardinality(v_new_ids) + 1:],
                                  v_pool_kinds[cardinality(v_pool_ids) - cardinality(v_new_ids) + 1:],
                                  v_pool_keys[cardinality(v_pool_ids) - cardinality(v_new_ids) + 1:])
                           WITH ORDINALITY AS p (definition_id, queue, kind, ckey, ord)
                ),
                x AS (
                    SELECT p.ord, 1 AS slot, 'd' || d.id AS label,
                           hashtextextended('dispatch:' || d.id, 0) AS lock_key,   -- jobs._dispatch_key, inline
                           'definition' AS scope, NULL::text AS name, NULL::text AS ckey,
                           FALSE AS per_key, d.id AS definition_id,
                           d.max_concurrent_runs AS max_running, NULL::integer AS rate_limit,
                           NULL::interval AS rate_period, d.overlap_policy = 'skip' AS skip,
                           d.overlap_policy IN ('buffer_one', 'cancel_other') AS overlap
                      FROM p JOIN jobs.definitions AS d
                        ON d.id = p.definition_id AND d.max_concurrent_runs IS NOT NULL
                    UNION ALL
                    SELECT l.ord, l.slot, l.label, hashtextextended('dispatch:' || l.label, 0),   -- jobs._limit_key
                           l.scope, l.name, l.ckey, l.per_key, NULL,
                           l.max_running, l.rate_limit, l.rate_period, FALSE, FALSE
                      FROM (SELECT p.ord, CASE m.scope WHEN 'queue' THEN 2 ELSE 3 END AS slot, m.*,
                                   CASE WHEN m.per_key THEN p.ckey END AS ckey,
                                   CASE WHEN m.per_key
                                        THEN jsonb_build_array(m.scope, m.name, p.ckey)::text
                                        ELSE jsonb_build_array(m.scope, m.name)::text END AS label
                              FROM p JOIN jobs.limits AS m
                                ON v_has_limits
                               AND ((m.scope = 'queue' AND m.name = p.queue)
                                    OR (m.scope = 'kind' AND m.name = p.kind))) AS l
                ),
                g AS (
                    SELECT DISTINCT x.label, x.lock_key, x.scope, x.name, x.ckey, x.per_key, x.definition_id,
                           x.max_running, x.rate_limit, x.rate_period, x.skip
                      FROM x WHERE x.label <> ALL (v_labels)
                ),
                n AS (
                    SELECT g.*, cardinality(v_labels) + row_number() OVER (ORDER BY g.lock_key, g.label) AS pos
                      FROM g
                )
                SELECT (SELECT coalesce(array_agg(ROW(n.label, n.lock_key, n.scope, n.name, n.ckey, n.per_key,
                                                      n.definition_id, n.max_running, n.rate_limit, n.rate_period,
                                                      n.skip,
                                                      n.scope <> 'definition'
                                                      AND coalesce(n.max_running, 2147483647) >= c_shared_min
                                                      AND coalesce(n.rate_limit, 2147483647) >= c_shared_min,
                                                      FALSE, NULL)::jobs._claim_group
                                                  ORDER BY n.pos), '{}')
                          FROM n),
                       (SELECT array_agg(coalesce(n.pos, array_position(v_labels, x.label), 0)::integer
                                         ORDER BY p.ord, s.slot)
                          FROM p CROSS JOIN generate_series(1, 3) AS s (slot)
                          LEFT JOIN x ON x.ord = p.ord AND x.slot = s.slot
                          LEFT JOIN n ON n.label = x.label),
                       (SELECT coalesce(bool_or(x.overlap), FALSE) FROM x)
                  INTO v_new, v_new_slots, v_new_overlap;
                v_overlap := v_overlap OR v_new_overlap;
            END IF;
            v_row_groups := v_row_groups || v_new_slots;

            FOREACH v_g IN ARRAY v_new LOOP
                IF (CASE WHEN v_g.shared THEN pg_try_advisory_xact_lock_shared(v_g.lock_key)
                         ELSE pg_try_advisory_xact_lock(v_g.lock_key) END) THEN
                    v_g.locked := TRUE;
                    v_max_key := greatest(v_max_key, v_g.lock_key);
                END IF;
                v_groups := v_groups || v_g;
                v_labels := v_labels || v_g.label;
            END LOOP;
            v_waited := FALSE;

            LOOP
                -- A shared group is locked only with one of its stripes too: tried from one
                -- derived from this backend's pid, never waited for (so stripes take no part in
                -- the lock order); with all of them held, the group is busy.
                FOR i IN 1 .. cardinality(v_groups) LOOP
                    IF (v_groups[i]).shared AND (v_groups[i]).locked AND v_striped[i] IS NOT TRUE THEN
                        v_striped[i] := FALSE;
                        FOR j IN 0 .. c_stripes - 1 LOOP
                            IF pg_try_advisory_xact_lock(hashtextextended(   -- key: helpers.sql
                                   'dispatch:' || (v_groups[i]).label || '#' || (pg_backend_pid() + j) % c_stripes, 0)) THEN
                                v_striped[i] := TRUE;
                                EXIT;
                            END IF;
                        END LOOP;
                        IF NOT v_striped[i] THEN
                            v_g := v_groups[i];
                            v_g.locked := FALSE;
                            v_groups[i] := v_g;
                        END IF;
                    END IF;
                END LOOP;

                -- 3. Only now, under those locks, count per newly locked group what is RUNNING
                -- and, for a rate limit, what started within its trailing window.
                -- (Flags from plain loops, not queries: every statement costs a claim.)
                -- A shared group is first counted against the bound of c_stripes holders; only
                -- where that leaves less than c_shared_batch (near the limit) is it counted again
                -- against the holders read from pg_locks (v_exact).
                v_exact := FALSE;
                LOOP
                    v_todo := FALSE;
                    v_shared_todo := FALSE;
                    FOREACH v_g IN ARRAY v_groups LOOP
                        IF v_g.locked AND v_g.free IS NULL THEN
                            v_todo := TRUE;
                            v_shared_todo := v_shared_todo OR v_g.shared;
                        END IF;
                    END LOOP;
                    EXIT WHEN NOT v_todo;
                    -- Exact holders: first (its own statement, so that the counts below see
                    -- every holder that committed after this read) how many claimers hold it.
                    v_holders := '{}';
                    IF v_shared_todo AND v_exact THEN
                        SELECT array_agg(coalesce(h.n, 0)::integer ORDER BY g.ordinality)
                          INTO v_holders
                          FROM unnest(v_groups) WITH ORDINALITY AS g
                          LEFT JOIN (SELECT (l.classid::bigint << 32) | l.objid::bigint AS lock_key, count(*) AS n
                                       FROM pg_locks AS l
                                      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                                        AND l.mode = 'ShareLock'
                                        AND l.database = (SELECT d.oid FROM pg_database AS d
                                                           WHERE d.datname = current_database())
                                      GROUP BY 1) AS h
                                 ON h.lock_key = g.lock_key AND g.shared AND g.locked AND g.free IS NULL;
                    END IF;
                    -- The RUNNING rows are read once for every queue and kind group (rc, read only
                    -- if one of them is counted): each walk of the RUNNING set also steps over the
                    -- index entries that finished runs left behind, many under concurrent claimers.
                    WITH rc AS MATERIALIZED (
                        SELECT r.queue, r.kind, r.concurrency_key AS ckey, count(*) AS n
                          FROM jobs.runs AS r
                         WHERE r.status = 'RUNNING'
                         GROUP BY r.queue, r.kind, r.concurrency_key
                    )
                    SELECT array_agg(ROW(g.label, g.lock_key, g.scope, g.name, g.ckey, g.per_key,
                                         g.definition_id, g.max_running, g.rate_limit, g.rate_period,
                                         g.skip, g.shared, g.locked,
                                         CASE WHEN NOT (g.locked AND g.free IS NULL) THEN g.free
                                              WHEN c.changed THEN 0
                                              WHEN g.shared AND NOT v_exact THEN   -- full room, or count again
                                                  CASE WHEN coalesce(g.max_running - c.running - c.others, 2147483647)
                                                            >= c_shared_batch
                                                        AND coalesce(g.rate_limit - c.starts - c.others, 2147483647)
                                                            >= c_shared_batch
                                                       THEN c_shared_batch END
                                              WHEN g.shared THEN   -- each holder adds at most c_shared_batch
                                                  greatest(least(c_shared_batch,
                                                      coalesce(g.max_running - c.running - c.others, 2147483647),
                                                      coalesce(g.rate_limit - c.starts - c.others, 2147483647)), 0)
                                              ELSE greatest(least(coalesce(g.max_running - c.running, 2147483647),
                                                                  coalesce(g.rate_limit - c.starts, 2147483647)), 0)
                                         END
                                     )::jobs._claim_group ORDER BY g.ordinality),
                           -- Per pool row: its queue or kind has a limit now that this claim did
                           -- not read for it (created since): not started (no lock, no count).
                           (SELECT array_agg((v_row_groups[3 * p.ord - 1] = 0
                                              AND p.queue IN (SELECT m.name FROM jobs.limits AS m
                                                               WHERE m.scope = 'queue'))
                                             OR (v_row_groups[3 * p.ord] = 0
                                                 AND p.kind IN (SELECT m.name FROM jobs.limits AS m
                                                                 WHERE m.scope = 'kind'))
                                             ORDER BY p.ord)
                              FROM unnest(v_pool_queues, v_pool_kinds) WITH ORDINALITY AS p (queue, kind, ord))
                      INTO v_groups, v_unread
                      FROM unnest(v_groups) WITH ORDINALITY AS g
                      LEFT JOIN LATERAL (
                           SELECT CASE WHEN g.max_running IS NULL THEN 0
                                       WHEN g.scope = 'definition' THEN
                                           (SELECT count(*) FROM jobs.runs AS r
                                             WHERE r.status = 'RUNNING' AND r.definition_id = g.definition_id)
                                       ELSE
                                           (SELECT coalesce(sum(rc.n), 0)::bigint FROM rc
                                             WHERE CASE g.scope WHEN 'queue' THEN rc.queue = g.name ELSE rc.kind = g.name END
                                               AND (NOT g.per_key OR rc.ckey IS NOT DISTINCT FROM g.ckey))
                                  END AS running,
                                  CASE WHEN g.rate_limit IS NULL THEN 0
                                       ELSE (SELECT coalesce(sum(x.starts), 0) FROM jobs._rate_starts AS x
                                              WHERE x.label = g.label AND x.started_at > now() - g.rate_period)
                                  END AS starts,
                                  (CASE WHEN v_exact THEN coalesce(v_holders[g.ordinality], 1) ELSE c_stripes END - 1)
                                  * c_shared_batch AS others,
                                  -- A limit whose row is gone or no longer holds the settings the
                                  -- group was read with (its lock, grouping or bounds are others
                                  -- now): no room in this claim.
                                  g.scope <> 'definition' AND NOT EXISTS (
                                      SELECT FROM jobs.limits AS m
                                       WHERE m.scope = g.scope AND m.name = g.name AND m.per_key = g.per_key
                                         AND m.max_running IS NOT DISTINCT FROM g.max_running
                                         AND m.rate_limit IS NOT DISTINCT FROM g.rate_limit
                                         AND m.rate_period IS NOT DISTINCT FROM g.rate_period) AS changed
                            WHERE g.locked AND g.free IS NULL
                      ) AS c ON TRUE;
                    EXIT WHEN v_exact OR NOT v_shared_todo;
                    v_exact := TRUE;
                END LOOP;

                -- 4. Pick in pool order while every group of the row has room (a busy group has
                -- none). A scheduled row of a skip-policy definition that found no slot is a skip
                -- candidate (skipped below if it is a new occurrence).
                v_pick := '{}';
                v_skip := '{}';
                IF cardinality(v_groups) = 0 THEN
                    v_pick := v_pool_ids[1:_claim_rest.batch_size];   -- nothing capped: the fast path
                ELSE
                    -- Greedy, in pool order, over each row's three group slots (v_row_groups).
                    v_room := array_fill(0, ARRAY[cardinality(v_groups)]);
                    FOR j IN 1 .. cardinality(v_groups) LOOP
                        v_room[j] := coalesce((v_groups[j]).free, 0);
                    END LOOP;
                    FOR i IN 1 .. cardinality(v_pool_ids) LOOP
                        v_ok := v_unread[i] IS NOT TRUE;
                        FOR j IN 3 * i - 2 .. 3 * i LOOP
                            v_gi := v_row_groups[j];
                            IF v_gi > 0 AND v_room[v_gi] <= 0 THEN
                                v_ok := FALSE;
                            END IF;
                        END LOOP;
                        IF v_ok THEN
                            IF cardinality(v_pick) < _claim_rest.batch_size THEN
                                v_pick := v_pick || v_pool_ids[i];
                                FOR j IN 3 * i - 2 .. 3 * i LOOP
                                    v_gi := v_row_groups[j];
                                    IF v_gi > 0 THEN
                                        v_room[v_gi] := v_room[v_gi] - 1;
                                    END IF;
                                END LOOP;
                            END IF;
                        ELSIF v_pool_origin[i] = 'schedule' AND v_row_groups[3 * i - 2] > 0 THEN
                            v_gi := v_row_groups[3 * i - 2];
                            IF (v_groups[v_gi]).skip AND (v_groups[v_gi]).free = 0 THEN
                                v_skip := v_skip || v_pool_ids[i];
                            END IF;
                        END IF;
                    END LOOP;
                    v_nfull := 0;
                    FOR j IN 1 .. cardinality(v_groups) LOOP
                        IF (v_groups[j]).locked AND v_room[j] <= 0 THEN
                            v_nfull := v_nfull + 1;
                        END IF;
                    END LOOP;
                END IF;
                -- A further slice may fill the batch where this one was full (the queue has more)
                -- and, after the first, where this one found a group with no room left that the
                -- next leaves out. Where it found none, the rows it held back wait for busy groups,
                -- and the next slice would most likely bring more of theirs.
                v_more := cardinality(v_pick) < _claim_rest.batch_size AND cardinality(v_new_ids) = v_limit
                          AND cardinality(v_pool_ids) < v_pool_max AND (v_round = 1 OR v_nfull > v_nfull_before);

                -- Nothing claimable without waiting: where the pool met more than one group, first
                -- the next slice of the pool, if there can be one (its rows may belong to groups
                -- nobody holds; one busy group's pool would most likely bring more of its own);
                -- then wait for the busy groups, but only for keys above every lock held (try the
                -- others), in ascending order. A wait is polling (a try every millisecond, for at
                -- most c_wait in all, over all the claim's rounds), never a wait in the lock
                -- manager: this claim holds row locks, and not only on its pool (FOR UPDATE
                -- follows a row's update chain and keeps its lock on a newer version it then
                -- leaves out). A lock-manager wait here is one edge of a cycle that any holder of
                -- the group's lock needing one of those rows would close, and PostgreSQL would end
                -- one of the two with a deadlock error; a poll only delays that holder.
                EXIT WHEN cardinality(v_pick) > 0 OR v_waited OR cardinality(v_groups) = 0
                       OR (v_more AND (v_round > 1 OR cardinality(v_groups) > 1));
                v_busy := FALSE;
                FOREACH v_g IN ARRAY v_groups LOOP
                    v_busy := v_busy OR NOT v_g.locked;
                END LOOP;
                EXIT WHEN NOT v_busy;
                v_waited := TRUE;
                v_waited_any := TRUE;
                v_wait_until := coalesce(v_wait_until, clock_timestamp() + c_wait);
                FOR i IN SELECT g.ordinality FROM unnest(v_groups) WITH ORDINALITY AS g
                          WHERE NOT g.locked ORDER BY g.lock_key, g.label LOOP
                    v_g := v_groups[i];
                    IF v_max_key IS NULL OR v_g.lock_key > v_max_key THEN
                        LOOP
                            v_g.locked := CASE WHEN v_g.shared THEN pg_try_advisory_xact_lock_shared(v_g.lock_key)
                                               ELSE pg_try_advisory_xact_lock(v_g.lock_key) END;
                            EXIT WHEN v_g.locked OR clock_timestamp() >= v_wait_until;
                            PERFORM pg_sleep(0.001);
                        END LOOP;
                        IF v_g.locked THEN
                            v_max_key := v_g.lock_key;
                        END IF;
                    ELSIF v_g.shared THEN   -- (held already when only its stripes were busy)
                        v_g.locked := pg_try_advisory_xact_lock_shared(v_g.lock_key);
                    ELSE
                        v_g.locked := pg_try_advisory_xact_lock(v_g.lock_key);
                    END IF;
                    v_groups[i] := v_g;
                END LOOP;
            END LOOP;

            EXIT WHEN NOT v_more;   -- batch full, queue exhausted, pool at its bound, or no progress

            -- Going round again: the next slice skips every group known to have no room left
            -- after the picks, or a capped backlog longer than the oversample would fill it all
            -- again. (Not groups whose rows in the pool merely outnumber their room: those rows
            -- may have been held back by another of their groups, and the group's room would go
            -- unused.)
            SELECT coalesce(array_agg(g.definition_id) FILTER (WHERE g.scope = 'definition'), '{}'),
                   coalesce(array_agg(g.label) FILTER (WHERE g.scope <> 'definition'), '{}')
              INTO v_full_defs, v_full
              FROM unnest(v_groups) WITH ORDINALITY AS g
             WHERE g.locked AND v_room[g.ordinality] <= 0;
        END LOOP;

        -- A claim that waited for a busy group (up to c_wait), in any of its rounds, reads the
        -- paused queues again: a queue paused while it waited starts nothing. (A claim that did
        -- not wait read them a few statements ago, before the pause committed: it is a claim
        -- from before the pause.)
        IF v_waited_any AND cardinality(v_pick) > 0 THEN
            SELECT coalesce(array_agg(p.id), '{}') INTO v_pick
              FROM unnest(v_pick) AS p (id)
              JOIN jobs.runs AS r ON r.id = p.id
             WHERE NOT EXISTS (SELECT FROM jobs.paused_queues AS q WHERE q.name = r.queue);
        END IF;

        -- buffer_one and cancel_other act on the definitions whose dispatch locks are held (only
        -- where the pool met such a definition: the call and its read of them cost a claim).
        IF v_overlap THEN
            SELECT array_agg(g.definition_id), array_agg(g.free)
              INTO v_room_defs, v_room_free
              FROM unnest(v_groups) AS g
             WHERE g.scope = 'definition' AND g.locked AND g.free IS NOT NULL;
            IF v_room_defs IS NOT NULL THEN
                PERFORM jobs._apply_overlap(v_room_defs, v_room_free, v_pick);
            END IF;
        END IF;

        -- The skip candidates are skipped only if they are new occurrences: a run snoozed since it
        -- began (or a retry, left out by origin above) waits for room like a manual run.
        IF cardinality(v_skip) > 0 THEN
            WITH skipped AS (
                UPDATE jobs.runs AS r
                   SET status = 'CANCELLED', finished_at = now(), failure_reason = 'Skipped',
                       error = 'skipped: definition at max_concurrent_runs (overlap_policy skip)'
                  FROM jobs.definitions AS d
                 WHERE r.id = ANY (v_skip) AND d.id = r.definition_id
                   AND jobs._new_occurrence(r.origin, r.definition_id, r.occurrence_at, r.scheduled_for, d.jitter)
                RETURNING r.id
            )
            SELECT coalesce(array_agg(skipped.id), '{}') INTO v_skip FROM skipped;
            IF cardinality(v_skip) > 0 THEN
                PERFORM jobs._cascade_dependency_failure(v_skip);
            END IF;
        END IF;

        -- started_at is the clock now, not the transaction start: a claim that waited for a
        -- lock starts its runs after whatever committed meanwhile (a dependency's completion,
        -- another claimer's starts), and the recorded times keep that order.
        v_started := clock_timestamp();
        -- Rate-limited groups: record how many of their runs start now (their windows' counts),
        -- and drop what no window reaches any more (rows another claimer is dropping: skipped).
        v_todo := FALSE;
        IF v_has_limits AND cardinality(v_pick) > 0 THEN
            FOREACH v_g IN ARRAY v_groups LOOP
                v_todo := v_todo OR v_g.rate_limit IS NOT NULL;
            END LOOP;
        END IF;
        IF v_todo THEN
            INSERT INTO jobs._rate_starts (label, started_at, starts)
            SELECT g.label, v_started, count(*)
              FROM unnest(v_groups) AS g
              JOIN unnest(v_pick) AS p (id) ON TRUE
              JOIN jobs.runs AS r ON r.id = p.id
             WHERE g.rate_limit IS NOT NULL
               AND CASE g.scope WHEN 'queue' THEN r.queue = g.name ELSE r.kind = g.name END
               AND (NOT g.per_key OR r.concurrency_key IS NOT DISTINCT FROM g.ckey)
             GROUP BY g.label;
            DELETE FROM jobs._rate_starts AS x
             WHERE x.ctid IN (SELECT o.ctid FROM jobs._rate_starts AS o
                                JOIN unnest(v_groups) AS g ON g.label = o.label AND g.rate_limit IS NOT NULL
                               WHERE o.started_at <= v_started - g.rate_period
                                 FOR UPDATE OF o SKIP LOCKED);
        END IF;
        RETURN QUERY
        WITH started AS (
            UPDATE jobs.runs AS r
               SET status = 'RUNNING', started_at = v_started, worker = v_worker,
                   claim_token_hash = v_token_hash,
                   heartbeat_at = CASE WHEN _claim_rest.heartbeat THEN v_started END
             WHERE r.id = ANY (v_pick)
            RETURNING r.*
        )
        SELECT s.* FROM started AS s ORDER BY s.priority DESC, s.scheduled_for, s.id;
    END;
END $$;
COMMENT ON FUNCTION jobs._claim_rest(integer, text, text[], boolean, text[], bytea, text) IS 'Private: jobs.claim past its common case (limits, capped definitions, the settings read and the steps); called only by jobs.claim.';

-- Argument checks are plain expressions and the common case is one statement: in a claim,
-- each statement costs its plan-cache check and executor start, and each variable with a
-- default its set-up. Everything past the common case is jobs._claim_rest (above): a
-- session's first call of a PL/pgSQL function compiles all of it, so a session whose claims
-- find nothing capped compiles only this much.
CREATE OR REPLACE FUNCTION jobs.claim(
    batch_size integer DEFAULT 1,
    worker text DEFAULT NULL,
    kinds text[] DEFAULT NULL,
    heartbeat boolean DEFAULT FALSE,
    queues text[] DEFAULT NULL,
    claim_token text DEFAULT NULL
)
RETURNS SETOF jobs.runs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off  -- its plans outlive the size of jobs.runs they were made at (worker.sql)
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_void text;
    v_sort text;
    v_worker text;
    v_token_hash bytea;
    -- The path the session's last settings read chose (the session hint pgtick.claim_steps):
    -- 'off' nothing capped, 'roomy' only roomy limits, 'on' the steps.
    v_hint text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'jobs.claim needs READ COMMITTED isolation, not %',
            current_setting('transaction_isolation')
            USING ERRCODE = '25000',
                  HINT = 'Each step must see a fresh snapshot; call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
    END IF;
    IF current_setting('pgtick.claimed', TRUE) = 'yes' THEN
        -- The dispatch locks of the first call are still held: a second call could
        -- wait on a lower lock key and break the ascending lock order.
        RAISE EXCEPTION 'jobs.claim was already called in this transaction'
            USING ERRCODE = '25000', HINT = 'Commit between claims (autocommit does).';
    END IF;
    v_void := set_config('pgtick.claimed', 'yes', TRUE);  -- transaction-local
    -- The argument checks are plain expressions (no statement); the helpers, called only
    -- when one fails, own the messages.
    IF claim.batch_size IS NULL OR claim.batch_size NOT BETWEEN 1 AND 1000 THEN
        PERFORM jobs._check_range('batch_size', claim.batch_size, 1, 1000);
    END IF;
    -- The worker id is written on the runs, where operators read it (jobs.running, the CLI, the
    -- dashboard, reap messages): a name as jobs.register_worker takes it, no escape sequence.
    IF claim.worker IS NOT NULL AND NOT jobs._plain_name(claim.worker) THEN
        PERFORM jobs._check_name('worker', claim.worker);
    END IF;
    IF claim.kinds IS NOT NULL
       AND (cardinality(claim.kinds) NOT BETWEEN 1 AND 1000 OR array_ndims(claim.kinds) > 1
            OR array_position(claim.kinds, NULL) IS NOT NULL OR array_position(claim.kinds, '') IS NOT NULL) THEN
        RAISE EXCEPTION 'kinds must hold 1 to 1000 non-empty kind names without NULLs in one list (or be NULL for all), got %', jobs._shown(claim.kinds::text)
            USING ERRCODE = '22023';
    END IF;
    IF claim.queues IS NOT NULL THEN   -- (nested: the subquery makes the test a statement)
        IF cardinality(claim.queues) NOT BETWEEN 1 AND 1000 OR array_ndims(claim.queues) > 1 OR EXISTS (
                SELECT FROM unnest(claim.queues) AS q WHERE q IS NULL OR length(q) NOT BETWEEN 1 AND 200) THEN
            RAISE EXCEPTION 'queues must hold 1 to 1000 non-empty queue names of up to 200 characters in one list (or be NULL for all)'
                USING ERRCODE = '22023';
        END IF;
    END IF;
    IF claim.claim_token IS NOT NULL THEN
        v_token_hash := jobs._claim_token_hash(claim.claim_token);
    END IF;
    v_worker := claim.worker;
    IF v_worker IS NULL THEN
        -- The session's own name, read once per session: pg_stat_activity copies the state of
        -- every backend slot. The name stays the server process's (its pid and start), so the
        -- session setting is kept only while it names this process.
        v_worker := current_setting('pgtick.session_worker', TRUE);
        IF v_worker IS NULL OR NOT starts_with(v_worker, 'sql-' || pg_backend_pid() || '-') THEN
            -- (A statement of its own: a statement's executor start builds every subquery it
            -- holds, used or not.)
            SELECT format('sql-%s-%s', a.pid, to_char(a.backend_start, 'YYYYMMDDHH24MISSUS'))
              INTO v_worker
              FROM pg_stat_activity AS a WHERE a.pid = pg_backend_pid();
            v_void := set_config('pgtick.session_worker', v_worker, FALSE);
        END IF;
    END IF;
    -- The worker's claim lock, shared (the key is jobs._claim_key's, inline), before any row:
    -- held until this claim commits or rolls back, so a jobs.hand_back_unheld of this worker
    -- (exclusive) waits for it and sees what it claimed, even when its client is gone. With it,
    -- the claiming lock (jobs._claiming_key, inline), shared: a change that caps runs this claim
    -- may read as uncapped (a new limit, a definition's first cap) waits for it to commit.
    PERFORM pg_advisory_xact_lock_shared(
                hashtextextended('claim:' || v_worker || coalesce(':' || encode(v_token_hash, 'hex'), ''), 0)),
            pg_advisory_xact_lock_shared(8099570450837488460);

    -- The common case first, in one statement: no limit and no capped definition defined, and
    -- no claim token missing where one is required. Then there is no group to count under a
    -- lock, so the statement locks the first batch_size due runs in claim order (within the
    -- login's scope, outside paused queues), starts them and returns them; its one-time
    -- filters read those settings in the same snapshot. Planned with sorts disabled, as the
    -- steps' first slice is (its only sort is of the rows it returns; the claim never
    -- JIT-compiles). When it starts nothing (the queue is empty for this caller, or a setting
    -- rules this path out), the settings are read on their own and the claim goes on from there.
    -- A session whose last such read found something capped skips that statement: it goes to
    -- the roomy limits' statements (jobs._claim_rest) if that was all it found, to the capped
    -- definitions' statements if those were all it found, else to the steps (the session setting
    -- pgtick.claim_steps: 'roomy', 'defs' or 'on'; a hint only: behind a transaction pooler it
    -- may reach another client's claim, and RESET ALL drops it). A read that finds the hint
    -- stale sets it right, and the steps take that one claim.
    v_hint := CASE current_setting('pgtick.claim_steps', TRUE) WHEN 'on' THEN 'on' WHEN 'roomy' THEN 'roomy'
                                                                WHEN 'defs' THEN 'defs' ELSE 'off' END;
    IF v_hint = 'off' THEN
        v_sort := current_setting('enable_sort');
        v_void := set_config('enable_sort', 'off', TRUE);
        RETURN QUERY
        WITH c AS (
            SELECT r.id
              FROM jobs._claimable_here AS r
             WHERE NOT EXISTS (SELECT FROM jobs.limits AS l)
               AND NOT EXISTS (SELECT FROM jobs.definitions AS d WHERE d.max_concurrent_runs IS NOT NULL)
               AND (v_token_hash IS NOT NULL OR NOT coalesce((SELECT c.require_claim_token FROM jobs.config AS c), FALSE))
               AND (claim.kinds IS NULL OR r.kind = ANY (claim.kinds))
               AND (claim.queues IS NULL OR r.queue = ANY (claim.queues))
             ORDER BY r.priority DESC, r.scheduled_for, r.id
             LIMIT claim.batch_size
               FOR UPDATE SKIP LOCKED
        ),
        -- The start time is the clock after the rows are locked, as in step 4 (v_started).
        t AS MATERIALIZED (SELECT clock_timestamp() AS at),
        started AS (
            UPDATE jobs.runs AS r
               SET status = 'RUNNING', started_at = (SELECT t.at FROM t), worker = v_worker,
                   claim_token_hash = v_token_hash,
                   heartbeat_at = CASE WHEN claim.heartbeat THEN (SELECT t.at FROM t) END
             WHERE r.id = ANY ((SELECT array_agg(c.id) FROM c)::bigint[])
            RETURNING r.*
        )
        SELECT s.* FROM started AS s ORDER BY s.priority DESC, s.scheduled_for, s.id;
        v_void := set_config('enable_sort', v_sort, TRUE);
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM jobs._claim_rest(claim.batch_size, v_worker, claim.kinds, claim.heartbeat, claim.queues,
                                                v_token_hash, v_hint);
END $$;
COMMENT ON FUNCTION jobs.claim(integer, text, text[], boolean, text[], text) IS 'Claim up to batch_size due QUEUED runs (optionally only of kinds and of queues) for worker, skipping paused queues and runs whose dependencies have not completed, and keeping every definition''s max_concurrent_runs and every queue/kind limit (running and rate, per concurrency key where per_key); returns them RUNNING. A login scoped in jobs.worker_scopes gets only runs within its scope. heartbeat => true stamps heartbeat_at at claim. claim_token: a worker secret whose sha256 is stored on the runs; their later calls must present it.';
