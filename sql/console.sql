-- ===========================================================================
-- console.sql: what the operator's terminal calls, for psql users too.
--
-- Each `pgtick` command that reads or changes state is a thin call of one
-- object here (or in ops.sql):
--   pgtick workers       jobs.workers
--   pgtick status        jobs.definition_health, jobs.leader, jobs.queue_stats,
--                        jobs.kinds_without_worker
--   pgtick definitions   jobs.definition_list
--   pgtick show RUN      jobs.run_detail(run_id)
--   pgtick undefine NAME jobs.undefine_detail(name)
--   pgtick prune         jobs.prune_count(older_than), jobs.prune(older_than, batch_size)
-- Workers register themselves (jobs.register_worker) and say they are alive on
-- their heartbeat cadence (jobs.worker_seen); the scheduler records catch-ups
-- after downtime (jobs.record_catch_up).
-- ===========================================================================

-- ---------------------------------------------------------------------------
-- Workers
-- ---------------------------------------------------------------------------

-- A worker announces itself, the kinds it runs and the queues it claims from (NULL: every
-- queue), on start and on every reconnect.
-- What it registers is shown to operators (jobs.workers, jobs.known_kinds, the CLI, psql,
-- the dashboard) and any jobs_worker login may register: its worker id and kinds are names as
-- jobs._check_name takes them, and its host holds no control character, so a login cannot
-- write a terminal escape sequence or a forged line into what an operator reads.
DROP FUNCTION IF EXISTS jobs.register_worker(text, text[], text, integer);
CREATE OR REPLACE FUNCTION jobs.register_worker(
    worker text, kinds text[], host text DEFAULT NULL, pid integer DEFAULT NULL, queues text[] DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    PERFORM jobs._check_name('worker', register_worker.worker);
    IF register_worker.kinds IS NULL OR cardinality(register_worker.kinds) > 1000 THEN
        -- (at most what jobs.claim takes as its kinds)
        RAISE EXCEPTION 'kinds must be an array of at most 1000 names of 1 to 200 characters'
            USING ERRCODE = '22023';
    END IF;
    -- Each a kind name as jobs.enqueue takes it (jobs._check_name): the registry is shown in
    -- jobs.workers, `pgtick workers` and the dashboard, where a kind with a line break or a
    -- text-direction character would read as another line or another kind, and a blank one
    -- would enter jobs.known_kinds as served. An empty list stays allowed (a worker of no kind).
    IF cardinality(register_worker.kinds) > 0 THEN
        PERFORM jobs._check_names('kinds', register_worker.kinds);
    END IF;
    -- The queues as jobs.claim takes them: NULL for every queue, else 1 to 1000 names.
    PERFORM jobs._check_names('queues', register_worker.queues);
    IF register_worker.host ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'host must not contain control characters, got %', to_json(left(register_worker.host, 255))
            USING ERRCODE = '22023';
    END IF;
    -- The login is recorded: a worker id another login registers changes hands in plain sight.
    INSERT INTO jobs.worker_registry AS w (worker, host, pid, kinds, login, queues)
    VALUES (register_worker.worker, left(register_worker.host, 255), register_worker.pid, register_worker.kinds,
            session_user, register_worker.queues)
    ON CONFLICT (worker) DO UPDATE
       SET kinds = excluded.kinds, host = excluded.host, pid = excluded.pid,
           last_seen_at = now(), stopped_at = NULL, login = excluded.login, queues = excluded.queues;
    INSERT INTO jobs.known_kinds AS k (kind)
    SELECT DISTINCT u.kind FROM unnest(register_worker.kinds) AS u (kind)
    ORDER BY u.kind
    ON CONFLICT (kind) DO UPDATE SET last_registered_at = now();
END $$;
COMMENT ON FUNCTION jobs.register_worker(text, text[], text, integer, text[]) IS 'Worker: record (or refresh) this worker, the kinds it runs, the queues it claims from (NULL: every queue) and the login (session_user) that registers it; the kinds join jobs.known_kinds. Raises 22023 naming worker, kinds[i] or queues[i] unless each is a name (1 to 200 characters, no control, invisible or text-direction character, not only spaces), or host if it holds a control character.';

-- What a worker login may claim: jobs.claim intersects the kinds and queues its caller asks
-- for with the scope of session_user (the login; SET ROLE does not change it).
CREATE OR REPLACE FUNCTION jobs.scope_worker(role name, kinds text[] DEFAULT NULL, queues text[] DEFAULT NULL)
RETURNS jobs.worker_scopes
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_row jobs.worker_scopes;
    v_login boolean;
BEGIN
    PERFORM jobs._check_name('role', scope_worker.role::text);
    SELECT r.rolcanlogin INTO v_login FROM pg_catalog.pg_roles AS r WHERE r.rolname = scope_worker.role;
    IF v_login IS NULL THEN
        RAISE EXCEPTION 'role must name an existing role, got %', to_json(scope_worker.role::text) USING ERRCODE = '22023';
    ELSIF NOT v_login THEN
        RAISE EXCEPTION 'role must be a role that can log in (a scope binds the login a worker connects as), got %',
            to_json(scope_worker.role::text)
            USING ERRCODE = '22023', HINT = 'Scope each worker''s LOGIN role, not a group role such as jobs_worker.';
    END IF;
    IF scope_worker.kinds IS NULL AND scope_worker.queues IS NULL THEN
        RAISE EXCEPTION 'kinds and queues must not both be NULL (to lift a scope, call jobs.unscope_worker)'
            USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_names('kinds', scope_worker.kinds);
    PERFORM jobs._check_names('queues', scope_worker.queues);
    INSERT INTO jobs.worker_scopes AS s (role, kinds, queues)
    VALUES (scope_worker.role, scope_worker.kinds, scope_worker.queues)
    ON CONFLICT (role) DO UPDATE
       SET kinds = excluded.kinds, queues = excluded.queues, updated_at = now()
    RETURNING s.* INTO v_row;
    RETURN v_row;
END $$;
COMMENT ON FUNCTION jobs.scope_worker(name, text[], text[]) IS 'Operator: let the login role claim only runs of these kinds (NULL: any) in these queues (NULL: any); replaces its previous scope. Refuses (22023) a role that does not exist or cannot log in.';

-- Lift a login's scope; true if it had one.
CREATE OR REPLACE FUNCTION jobs.unscope_worker(role name) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    PERFORM jobs._check_name('role', unscope_worker.role::text);
    DELETE FROM jobs.worker_scopes AS s WHERE s.role = unscope_worker.role;
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION jobs.unscope_worker(name) IS 'Operator: let the login role claim any run again. Returns false if it had no scope.';

-- Every scoped login, and whether the role still exists (a dropped role's scope binds a new
-- role created with its name).
CREATE OR REPLACE VIEW jobs.worker_scope_list AS
SELECT
    s.role,
    s.kinds,
    s.queues,
    s.updated_at,
    s.role IN (SELECT r.rolname FROM pg_catalog.pg_roles AS r) AS role_exists
FROM jobs.worker_scopes AS s
ORDER BY s.role;
COMMENT ON VIEW jobs.worker_scope_list IS 'Each worker login''s scope (the kinds and queues jobs.claim may hand it; NULL: any), and whether the role exists.';

-- A worker's sign of life, or its clean stop: NULL when it is not registered by this login
-- (session_user), so another login that knows the worker id cannot keep a dead worker alive
-- or show a live one stopped. A row registered before the login was recorded is taken by the
-- first login that stamps it (its own worker, on its next heartbeat).
CREATE OR REPLACE FUNCTION jobs._stamp_worker(worker text, stopping boolean) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    UPDATE jobs.worker_registry AS w
       SET last_seen_at = now(), stopped_at = CASE WHEN _stamp_worker.stopping THEN now() END,
           login = session_user
     WHERE w.worker = _stamp_worker.worker AND (w.login IS NULL OR w.login = session_user)
    RETURNING TRUE
$$;
COMMENT ON FUNCTION jobs._stamp_worker(text, boolean) IS 'Private: stamp a worker this login registered seen now, and stopped now when stopping (else no longer stopped); NULL when no such worker is registered by this login.';

CREATE OR REPLACE FUNCTION jobs.worker_seen(worker text) RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER AS $$ SELECT jobs._stamp_worker(worker_seen.worker, FALSE) $$;
COMMENT ON FUNCTION jobs.worker_seen(text) IS 'Worker: stamp last_seen_at (called on the heartbeat cadence); NULL when the worker is not registered by this login (session_user).';

CREATE OR REPLACE FUNCTION jobs.worker_stopped(worker text) RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER AS $$ SELECT jobs._stamp_worker(worker_stopped.worker, TRUE) $$;
COMMENT ON FUNCTION jobs.worker_stopped(text) IS 'Worker: record a clean stop; jobs.workers shows it as stopped rather than lost. NULL (nothing changed) when the worker is not registered by this login (session_user).';

-- Every registered worker: alive (seen within the heartbeat timeout), stopped or lost; what it runs.
CREATE OR REPLACE VIEW jobs.workers AS
SELECT
    w.worker,
    CASE
        WHEN w.stopped_at IS NOT NULL THEN 'stopped'
        WHEN w.last_seen_at > now() - make_interval(secs => extract(EPOCH FROM c.heartbeat_timeout)) THEN 'alive'
        ELSE 'lost'
    END AS state,
    w.host,
    w.pid,
    w.kinds,
    w.started_at,
    w.last_seen_at,
    now() - w.last_seen_at AS seen_age,
    coalesce(r.running, 0) AS running,
    coalesce(r.run_ids, '{}') AS run_ids,
    r.oldest_heartbeat_age,
    r.oldest_heartbeat_at,
    w.login,
    w.queues
FROM jobs.worker_registry AS w
CROSS JOIN jobs.config AS c
LEFT JOIN LATERAL (
    SELECT
        count(*) AS running,
        array_agg(x.id ORDER BY x.id) AS run_ids,
        max(now() - x.heartbeat_at) AS oldest_heartbeat_age,
        min(x.heartbeat_at) AS oldest_heartbeat_at
    FROM jobs.runs AS x
    WHERE x.worker = w.worker AND x.status = 'RUNNING'
) AS r ON TRUE;
COMMENT ON VIEW jobs.workers IS 'Registered workers: state (alive: seen within jobs.config.heartbeat_timeout; stopped; lost), kinds, last seen and its age, the runs each holds and the oldest heartbeat age among them, and the login that registered it. Each line is what a worker login said of itself: see docs/operations.md on what it can be trusted for.';

-- Kinds with due QUEUED runs that no alive worker runs: none registered the kind, or those
-- that did claim from other queues than the runs'.
CREATE OR REPLACE VIEW jobs.kinds_without_worker AS
SELECT
    r.kind,
    count(*) AS queued,
    now() - min(r.scheduled_for) AS oldest_queued_age,
    r.kind IN (SELECT k.kind FROM jobs.known_kinds AS k) AS ever_registered,
    min(r.scheduled_for) AS oldest_queued_at,
    array_agg(DISTINCT r.queue::text ORDER BY r.queue::text) AS queues
FROM jobs.runs AS r
WHERE
    r.status = 'QUEUED' AND r.scheduled_for <= now()
    AND NOT EXISTS (
        SELECT FROM jobs.worker_registry AS w CROSS JOIN jobs.config AS c
        WHERE
            r.kind = any(w.kinds) AND (w.queues IS NULL OR r.queue = any(w.queues)) AND w.stopped_at IS NULL
            AND w.last_seen_at > now() - make_interval(secs => extract(EPOCH FROM c.heartbeat_timeout))
    )
GROUP BY r.kind;
COMMENT ON VIEW jobs.kinds_without_worker IS 'Kinds with due QUEUED runs that no alive worker runs (none registered the kind, or those that did claim from other queues), and the queues of those runs; ever_registered false means no worker ever did (a typo?).';

-- The registry's retention: worker ids and kinds leave it once nothing has said anything of
-- them for older_than (default jobs.config.retention), so that workers that took a new id at
-- each start, or a login that registered many kinds, do not fill jobs.workers, `pgtick
-- workers`, `pgtick status` and the dashboard with entries nobody runs. jobs.prune calls it,
-- so the leader's hourly prune keeps the registry to the retention too.
-- A worker goes when it was last seen before the cutoff, is not alive (it stopped, or was not
-- seen within jobs.config.heartbeat_timeout) and holds no RUNNING run. A kind goes when it was
-- last registered before the cutoff and no registered worker lists it (a worker registers its
-- kinds at start only: a worker that runs for months keeps them), no definition names it and
-- no QUEUED or RUNNING run is of it. Rows are locked SKIP LOCKED (a registration in flight
-- keeps its rows, to be looked at on the next call) and kinds in name order, the order
-- jobs.register_worker locks them in; each lock re-reads its row, so a worker or kind
-- registered again meanwhile stays.
CREATE OR REPLACE FUNCTION jobs.prune_registry(older_than interval DEFAULT NULL)
RETURNS TABLE (workers bigint, kinds bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_age interval := coalesce(prune_registry.older_than, (SELECT c.retention FROM jobs.config AS c));
    v_cutoff timestamptz;
    v_alive timestamptz := now() - (SELECT make_interval(secs => extract(EPOCH FROM c.heartbeat_timeout)) FROM jobs.config AS c);
    v_kinds text[];
BEGIN
    PERFORM jobs._check_duration('older_than', v_age);
    v_cutoff := now() - make_interval(secs => extract(EPOCH FROM v_age));  -- elapsed, as jobs.prune
    WITH gone AS (
        SELECT w.worker
          FROM jobs.worker_registry AS w
         WHERE w.last_seen_at < v_cutoff
           AND (w.stopped_at IS NOT NULL OR w.last_seen_at < v_alive)
         ORDER BY w.worker
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM jobs.worker_registry AS w
     USING gone AS g
     WHERE w.worker = g.worker
       AND NOT EXISTS (SELECT FROM jobs.runs AS r WHERE r.worker = w.worker AND r.status = 'RUNNING');
    GET DIAGNOSTICS workers = ROW_COUNT;
    -- The stale kinds first (jobs.known_kinds alone), then, only when there are some, set
    -- differences (one pass each, whatever the number of kinds and workers) with the kinds
    -- the registry, the definitions and the live runs still use.
    SELECT array_agg(k.kind) INTO v_kinds FROM jobs.known_kinds AS k WHERE k.last_registered_at < v_cutoff;
    kinds := 0;
    IF v_kinds IS NOT NULL THEN
        v_kinds := ARRAY(
            SELECT u.kind FROM unnest(v_kinds) AS u (kind)
            EXCEPT
            SELECT x.kind FROM jobs.worker_registry AS w CROSS JOIN LATERAL unnest(w.kinds) AS x (kind)
            EXCEPT
            SELECT d.kind::text FROM jobs.definitions AS d
            EXCEPT
            SELECT r.kind::text FROM jobs.runs AS r
             WHERE r.kind = ANY (v_kinds) AND r.status IN ('QUEUED', 'RUNNING')
        );
        WITH gone AS (
            SELECT k.kind
              FROM jobs.known_kinds AS k
             WHERE k.kind = ANY (v_kinds) AND k.last_registered_at < v_cutoff
             ORDER BY k.kind
               FOR UPDATE SKIP LOCKED
        )
        DELETE FROM jobs.known_kinds AS k USING gone AS g WHERE k.kind = g.kind;
        GET DIAGNOSTICS kinds = ROW_COUNT;
    END IF;
    RETURN NEXT;
END $$;
COMMENT ON FUNCTION jobs.prune_registry(interval) IS 'Remove from the worker registry what nothing has said anything of for older_than (default jobs.config.retention): workers last seen before it that are stopped or lost and hold no RUNNING run, and known kinds last registered before it that no registered worker lists, no definition names and no QUEUED or RUNNING run is of. Returns how many workers and kinds it removed. jobs.prune calls it. Raises 22023 naming older_than unless it is 0 seconds to 100 years.';

-- ---------------------------------------------------------------------------
-- Catch-ups after downtime
-- ---------------------------------------------------------------------------

-- An interval as an operator reads it: 45s, 2m30s, 1h05m, 3d4h.
CREATE OR REPLACE FUNCTION jobs.compact_interval(value interval) RETURNS text
LANGUAGE sql IMMUTABLE STRICT SECURITY DEFINER AS $$
    SELECT CASE
        WHEN s < 60 THEN s || 's'
        WHEN s < 3600 THEN (s / 60) || 'm' || CASE WHEN s % 60 > 0 THEN lpad((s % 60)::text, 2, '0') || 's' ELSE '' END
        WHEN s < 86400 THEN (s / 3600) || 'h' || CASE WHEN s % 3600 >= 60 THEN lpad((s % 3600 / 60)::text, 2, '0') || 'm' ELSE '' END
        ELSE (s / 86400) || 'd' || CASE WHEN s % 86400 >= 3600 THEN (s % 86400 / 3600) || 'h' ELSE '' END
    END
    FROM (SELECT greatest(round(extract(EPOCH FROM value)), 0)::bigint AS s) AS t
$$;
COMMENT ON FUNCTION jobs.compact_interval(interval) IS 'An interval as 45s, 2m30s, 1h05m or 3d4h.';

-- One catch-up as a sentence ("caught up after 2m30s of downtime: 15 occurrences coalesced into 1").
CREATE OR REPLACE FUNCTION jobs.describe_catch_up(c jobs.catch_ups) RETURNS text
LANGUAGE sql IMMUTABLE SECURITY DEFINER AS $$
    SELECT 'caught up after ' || jobs.compact_interval(c.caught_up_at - c.first_late) || ' of downtime: '
        || c.occurrences || CASE WHEN c.occurrences = 1 THEN ' occurrence' ELSE ' occurrences' END
        || CASE
            WHEN c.occurrences = 1 AND c.runs = 1 THEN ' run late'
            WHEN c.misfire_policy = 'coalesce' THEN ' coalesced into ' || c.runs
            WHEN c.misfire_policy = 'catch_up' THEN ' run late (' || c.runs || ' runs)'
            ELSE CASE WHEN c.runs = 0 THEN ' skipped' ELSE ': ' || (c.occurrences - c.runs) || ' skipped, ' || c.runs || ' run' END
                 || ' (past the misfire grace)'
        END
$$;
COMMENT ON FUNCTION jobs.describe_catch_up(jobs.catch_ups) IS 'A catch-up as one sentence, e.g. caught up after 2m30s of downtime: 15 occurrences coalesced into 1.';

-- Scheduler: record a catch-up (once per definition and first_late) and supersede the
-- definition's older QUEUED runs that the policy replaces.
CREATE OR REPLACE FUNCTION jobs.record_catch_up(
    definition_id bigint,
    misfire_policy text,
    first_late timestamptz,
    last_late timestamptz,
    occurrences integer,
    runs integer,
    next_run_at timestamptz
)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_superseded integer := 0;
    v_earliest timestamptz;
    v_skipped bigint[];
    v_row jobs.catch_ups;
BEGIN
    IF record_catch_up.first_late IS NULL OR record_catch_up.last_late IS NULL
       OR record_catch_up.last_late < record_catch_up.first_late THEN
        RAISE EXCEPTION 'first_late and last_late must be set, first_late <= last_late' USING ERRCODE = '22023';
    END IF;
    IF record_catch_up.misfire_policy IS NULL OR record_catch_up.misfire_policy NOT IN ('coalesce', 'catch_up', 'skip') THEN
        RAISE EXCEPTION 'misfire_policy must be coalesce, catch_up or skip' USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_range('occurrences', record_catch_up.occurrences, 1, 2147483647);
    PERFORM jobs._check_range('runs', record_catch_up.runs, 0, record_catch_up.occurrences);
    -- Only for the materialization that went through: the cursor is where it left it.
    IF NOT EXISTS (
        SELECT FROM jobs.definitions AS d
         WHERE d.id = record_catch_up.definition_id
           AND d.next_run_at IS NOT DISTINCT FROM record_catch_up.next_run_at
    ) THEN
        RETURN NULL;
    END IF;
    IF record_catch_up.misfire_policy <> 'catch_up' THEN
        -- Runs materialized before the downtime and never started are late occurrences too:
        -- coalesce runs only the latest, skip runs none of them. A run that began and snoozed
        -- is not one (jobs._new_occurrence): it asked to run later, and runs. The occurrences of
        -- a backfilled window are not either: an operator asked for each of them to run
        -- (jobs.backfill), and they may still wait for a worker or a free slot when the
        -- scheduler restarts.
        WITH stale AS (
            SELECT r.id FROM jobs.runs AS r
              JOIN jobs.definitions AS d ON d.id = r.definition_id
             WHERE r.definition_id = record_catch_up.definition_id AND r.status = 'QUEUED'
               AND r.origin = 'schedule' AND r.scheduled_for < record_catch_up.first_late
               AND jobs._new_occurrence(r.origin, r.definition_id, r.occurrence_at, r.scheduled_for, d.jitter)
               AND NOT EXISTS (SELECT FROM jobs.backfills AS b
                                WHERE b.definition_id = r.definition_id AND b.done_at IS NOT NULL
                                  AND b.error IS NULL
                                  AND coalesce(r.occurrence_at, r.scheduled_for)
                                      BETWEEN b.window_from AND b.window_to)
             ORDER BY r.id
               FOR UPDATE OF r SKIP LOCKED
        ),
        superseded AS (
            UPDATE jobs.runs AS r
               SET status = 'CANCELLED', finished_at = now(), failure_reason = 'Skipped',
                   error = CASE record_catch_up.misfire_policy
                       WHEN 'coalesce' THEN 'skipped: superseded by coalescing (a later occurrence runs instead)'
                       ELSE 'skipped: past the misfire grace (misfire_policy skip)'
                   END
              FROM stale WHERE r.id = stale.id
            RETURNING r.id, r.scheduled_for
        )
        SELECT count(*), min(superseded.scheduled_for), array_agg(superseded.id)
          INTO v_superseded, v_earliest, v_skipped
          FROM superseded;
        IF v_skipped IS NOT NULL THEN
            PERFORM jobs._cascade_dependency_failure(v_skipped);  -- runs waiting on them
        END IF;
    END IF;
    INSERT INTO jobs.catch_ups (
        definition_id, misfire_policy, resumed_from, first_late, last_late, occurrences, runs, superseded
    )
    SELECT d.id, record_catch_up.misfire_policy, record_catch_up.first_late,
           least(v_earliest, record_catch_up.first_late), record_catch_up.last_late,
           -- (the column's integer holds the count up to its largest value)
           least(record_catch_up.occurrences::bigint + v_superseded, 2147483647)::integer,
           record_catch_up.runs, v_superseded
      FROM jobs.definitions AS d WHERE d.id = record_catch_up.definition_id
    ON CONFLICT ON CONSTRAINT catch_ups_once DO NOTHING
    RETURNING * INTO v_row;
    RETURN CASE WHEN v_row.id IS NOT NULL THEN jobs.describe_catch_up(v_row) END;
END $$;
COMMENT ON FUNCTION jobs.record_catch_up(bigint, text, timestamptz, timestamptz, integer, integer, timestamptz) IS 'Scheduler, in the statement that materialized a catch-up (cursor now at next_run_at): record that occurrences first_late..last_late were late and how many runs the misfire policy made of them; with coalesce or skip, cancel (Skipped, with the reason) the definition''s older QUEUED scheduled runs that never started (not one snoozed since it began), except those of a backfilled window. Returns the catch-up as a sentence; NULL when nothing was recorded (a repeat by a second leader, or a stale cursor).';

-- ---------------------------------------------------------------------------
-- Definitions, runs, retention
-- ---------------------------------------------------------------------------

-- Every definition with its settings: what `pgtick definitions` lists.
CREATE OR REPLACE VIEW jobs.definition_list AS
SELECT
    d.id,
    d.name,
    d.kind,
    d.schedule,
    d.timezone,
    d.run_at,
    NOT d.enabled AS paused,
    d.finished_at IS NOT NULL AS finished,
    d.next_run_at,
    d.misfire_policy,
    d.overlap_policy,
    d.max_concurrent_runs,
    d.priority,
    d.max_attempts,
    d.timeout,
    d.payload,
    d.schedule_error,
    d.created_at,
    d.updated_at,
    -- The next start as jobs.definition_health.next_start_at reads it: the first QUEUED run
    -- not waiting on dependencies, else the cursor's run (its occurrence delayed by the jitter)
    -- while the scheduler advances it.
    CASE
        WHEN d.enabled AND d.finished_at IS NULL AND d.schedule_error IS NULL
            THEN least(queued.first_queued, d.next_run_at + jobs.jitter_offset(d.id, d.next_run_at, d.jitter))
        ELSE queued.first_queued
    END AS next_start_at
FROM jobs.definitions AS d
LEFT JOIN LATERAL (
    SELECT min(r.scheduled_for) AS first_queued FROM jobs.runs AS r
    WHERE r.definition_id = d.id AND r.status = 'QUEUED' AND NOT r.blocked
) AS queued ON TRUE;
COMMENT ON VIEW jobs.definition_list IS 'Every definition with its schedule, zone, state (paused, finished), cursor (next_run_at: how far its occurrences are materialized) and policies: what `pgtick definitions` lists. next_start_at: when its next run starts, the first QUEUED run not waiting on dependencies or else the cursor delayed by its jitter (the cursor only while it is enabled, not finished and its schedule readable; the runs it queued still start).';

-- One run in full, with its attempt chain (first attempt to last) and its definition.
-- (Dropped first: its columns grew definition_id, which a replace cannot add.)
DROP FUNCTION IF EXISTS jobs.run_detail(bigint);
CREATE FUNCTION jobs.run_detail(run_id bigint) RETURNS TABLE (
    id bigint,
    definition text,
    timezone text,
    kind text,
    status text,
    attempt integer,
    max_attempts integer,
    origin text,
    retry_of bigint,
    scheduled_for timestamptz,
    created_at timestamptz,
    started_at timestamptz,
    heartbeat_at timestamptz,
    finished_at timestamptz,
    worker text,
    cancel_requested boolean,
    failure_reason text,
    error text,
    payload jsonb,
    result jsonb,
    attempts jsonb,
    definition_id bigint
)
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    PERFORM jobs._known_run(run_detail.run_id, FALSE);
    RETURN QUERY
    WITH RECURSIVE back AS (
        SELECT r.id, r.retry_of, 0 AS depth FROM jobs.runs_all AS r WHERE r.id = run_detail.run_id
        UNION ALL
        SELECT p.id, p.retry_of, b.depth + 1 FROM jobs.runs_all AS p INNER JOIN back AS b ON p.id = b.retry_of
        WHERE b.depth < 1000
    ),
    -- From the earliest attempt there is: the first, or the earliest one left when earlier
    -- attempts were discarded or pruned (its retry_of names a run that is gone).
    chain AS (
        SELECT b.id, 0 AS depth FROM back AS b WHERE b.depth = (SELECT max(x.depth) FROM back AS x)
        UNION ALL
        SELECT n.id, c.depth + 1 FROM jobs.runs_all AS n INNER JOIN chain AS c ON n.retry_of = c.id
        WHERE c.depth < 1000
    )
    SELECT r.id, d.name, coalesce(d.timezone, 'UTC'), r.kind, r.status::text, r.attempt, r.max_attempts,
           r.origin, r.retry_of, r.scheduled_for, r.created_at, r.started_at, r.heartbeat_at,
           r.finished_at, r.worker, r.cancel_requested, r.failure_reason, r.error, r.payload, r.result,
           (SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'id', a.id, 'attempt', a.attempt, 'status', a.status::text,
                        'started_at', a.started_at, 'finished_at', a.finished_at, 'worker', a.worker,
                        'failure_reason', a.failure_reason,
                        'error', split_part(a.error, E'\n', 1)) ORDER BY a.attempt, a.id), '[]')
              FROM chain AS c INNER JOIN jobs.runs_all AS a ON a.id = c.id),
           r.definition_id
      FROM jobs.runs_all AS r
      LEFT JOIN jobs.definitions AS d ON r.definition_id = d.id
     WHERE r.id = run_detail.run_id;
END $$;
COMMENT ON FUNCTION jobs.run_detail(bigint) IS 'One run in full (timings, worker, payload, result, error as stored) with its definition and its attempt chain as a JSON array, first attempt first, then its definition_id (kept when the definition is deleted: definition is NULL then, as for an ad-hoc run, whose definition_id is NULL too); P0002 when the run does not exist.';

-- Runs with their definition's name, newest first by id: what `pgtick runs` lists.
CREATE OR REPLACE VIEW jobs.run_list AS
SELECT
    r.id,
    d.name AS definition,
    r.kind,
    r.status::text AS status,
    r.attempt,
    r.scheduled_for,
    r.started_at,
    r.finished_at,
    r.worker,
    r.failure_reason,
    left(r.error, 60) AS error,
    coalesce(d.timezone, 'UTC') AS timezone,
    coalesce(r.finished_at, CASE WHEN r.status = 'RUNNING' THEN now() END) - r.started_at AS duration,
    r.origin,
    r.definition_id
FROM jobs.runs AS r
LEFT JOIN jobs.definitions AS d ON r.definition_id = d.id;
COMMENT ON VIEW jobs.run_list IS 'Runs with their definition name (NULL for ad-hoc runs), status as text, the first 60 characters of the error, the zone to show times in (the definition''s, else UTC), the duration (so far, while RUNNING) and the origin, then the definition_id (kept when the definition is deleted, where definition is NULL); what `pgtick runs` lists, newest first.';

-- Delete a definition (jobs.undefine) and say what became of its runs.
CREATE OR REPLACE FUNCTION jobs.undefine_detail(name text)
RETURNS TABLE (definition text, cancelled integer, still_running bigint[], history bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_id bigint;
    v_cancelled integer;
BEGIN
    PERFORM jobs._check_text('name', undefine_detail.name, 200);
    v_id := (jobs._lock_definition(undefine_detail.name, TRUE)).id;  -- as jobs.undefine locks it
    v_cancelled := jobs.undefine(undefine_detail.name);
    RETURN QUERY
    SELECT undefine_detail.name, v_cancelled,
           coalesce(array_agg(r.id ORDER BY r.id) FILTER (WHERE r.status = 'RUNNING'), '{}'),
           count(*) FILTER (WHERE r.status <> 'RUNNING')
      FROM jobs.runs_all AS r WHERE r.definition_id = v_id;
END $$;
COMMENT ON FUNCTION jobs.undefine_detail(text) IS 'Delete the named definition (jobs.undefine): its QUEUED runs are cancelled, RUNNING runs finish normally, finished runs stay as history. Returns cancelled count, the ids still running and the history kept.';

-- How many finished runs jobs.prune(older_than) would delete now.
CREATE OR REPLACE FUNCTION jobs.prune_count(older_than interval DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_age interval := coalesce(prune_count.older_than, (SELECT c.retention FROM jobs.config AS c));
    v_cutoff timestamptz;
    v_kept bigint[];
    v_day record;
    v_rows bigint;
    v_held boolean;
    v_count bigint;
BEGIN
    PERFORM jobs._check_duration('older_than', v_age);  -- as jobs.prune
    v_cutoff := now() - make_interval(secs => extract(EPOCH FROM v_age));  -- elapsed, as jobs.prune
    v_kept := jobs._waited_on();  -- kept by jobs.prune, with their days
    SELECT count(*) INTO v_count FROM jobs.runs AS r WHERE r.finished_at < v_cutoff AND r.id <> ALL (v_kept);
    -- By name, and a day that a prune dropped while this waited for it counts nothing (as
    -- jobs.prune passes over it).
    FOR v_day IN SELECT format('%s.%I', c.relnamespace::regnamespace, c.relname) AS name
                   FROM jobs._history_days_before(v_cutoff) AS d
                   JOIN pg_catalog.pg_class AS c ON c.oid = d.part
                  ORDER BY d.day LOOP
        BEGIN
            EXECUTE format('SELECT count(*), coalesce(bool_or(h.id = ANY ($1)), FALSE) FROM %s AS h', v_day.name)
               INTO v_rows, v_held USING v_kept;
        EXCEPTION WHEN undefined_table THEN
            v_rows := 0;
        END;
        v_count := v_count + CASE WHEN v_held THEN 0 ELSE v_rows END;
    END LOOP;
    RETURN v_count;
END $$;
COMMENT ON FUNCTION jobs.prune_count(interval) IS 'How many finished runs jobs.prune(older_than) would delete now (default jobs.config.retention): the days of history that ended before the cutoff and the runs of jobs.runs finished before it. The dry run of `pgtick prune`.';
