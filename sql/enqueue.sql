-- ===========================================================================
-- enqueue.sql: ad-hoc runs (jobs.enqueue) and runs of a definition on demand (jobs.run_now).
-- ===========================================================================

-- Private: a NOTICE when no worker has ever registered kind (called by jobs.enqueue and enqueue_many).
CREATE OR REPLACE FUNCTION jobs._warn_unknown_kind(kind text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM jobs.known_kinds AS k WHERE k.kind = _warn_unknown_kind.kind) THEN
        RAISE NOTICE 'no worker has ever registered kind %: the run waits until one does', quote_literal(kind)
            USING HINT = 'Check the spelling, or start a worker whose app registers this kind.';
    ELSE
        -- A kind once registered stays known: the session's next enqueue of it skips the look.
        PERFORM set_config('pgtick.known_kind', kind, FALSE);
    END IF;
END $$;
COMMENT ON FUNCTION jobs._warn_unknown_kind(text) IS 'Private: raise a NOTICE (not an error) when no worker ever registered the kind; jobs.enqueue and jobs.enqueue_many call it unless the session found the kind known already (the session setting pgtick.known_kind).';

-- Private: raise 22023 naming the field unless a queue / concurrency key text is valid.
CREATE OR REPLACE FUNCTION jobs._check_flow_args(queue text, concurrency_key text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM jobs._check_name('queue', queue);
    IF concurrency_key IS NOT NULL THEN
        PERFORM jobs._check_key('concurrency_key', concurrency_key);
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_flow_args(text, text) IS 'Private: raises 22023 naming the field unless queue is a name (1 to 200 characters, no control characters) and concurrency_key NULL or a key (1 to 200 characters, not blank).';

-- Private: raise 22023 or P0002 naming depends_on unless it is NULL or 1 to 1000 ids of runs
-- that exist (called by jobs.enqueue before it looks for a run of its unique key). It takes no
-- lock: where a run is inserted, jobs._dependency_state locks the chains and checks again.
-- STABLE: both reads share one snapshot, so a run moved to history meanwhile is in one of them.
CREATE OR REPLACE FUNCTION jobs._check_depends_on(depends_on bigint[]) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_missing bigint[];
BEGIN
    IF depends_on IS NULL THEN
        RETURN;
    END IF;
    IF cardinality(depends_on) NOT BETWEEN 1 AND 1000 OR array_ndims(depends_on) <> 1 OR array_lower(depends_on, 1) <> 1
       OR EXISTS (SELECT FROM unnest(depends_on) AS d WHERE d IS NULL) THEN
        RAISE EXCEPTION 'depends_on must be a list of 1 to 1000 run ids without NULLs (or be NULL)'
            USING ERRCODE = '22023';
    END IF;
    -- jobs.runs first; history only for the ids it does not hold (a read of history locks
    -- every day partition of it).
    SELECT array_agg(d ORDER BY d) INTO v_missing
      FROM unnest(depends_on) AS d
     WHERE NOT EXISTS (SELECT FROM jobs.runs AS r WHERE r.id = d);
    IF v_missing IS NOT NULL THEN
        SELECT array_agg(d ORDER BY d) INTO v_missing
          FROM unnest(v_missing) AS d
         WHERE NOT EXISTS (SELECT FROM jobs.run_history AS h WHERE h.id = d);
    END IF;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'depends_on names runs that do not exist: %', v_missing
            USING ERRCODE = 'P0002', HINT = 'A run can only depend on runs that already exist.';
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_depends_on(bigint[]) IS 'Private: raises 22023 unless depends_on is NULL or a one-dimensional array of 1 to 1000 run ids without NULLs, P0002 when one names no run (in jobs.runs or history); takes no lock.';

-- Queue one ad-hoc run. With an idempotency key (per kind), a repeat returns the existing
-- run for as long as it is kept (retention lets the key go with its run). With a unique key, while a run of the same kind and key is in the unique_while states
-- (and was created within unique_for), no run is added: on_conflict says what happens to the
-- existing one. Concurrent enqueues of one unique key are serialized by an advisory xact lock
-- on (kind, unique_key), then the check and the insert run under it.
-- With depends_on, the run is not claimable until every run listed has completed. Every
-- argument, depends_on included, is checked before the key is looked up, so a bad call fails
-- alike whether or not a run of the key exists, and changes nothing. A replace keeps what the
-- queued run waits on, so on_conflict replace refuses depends_on: the new payload would
-- otherwise run without waiting for the runs the caller named.
CREATE OR REPLACE FUNCTION jobs.enqueue(
    kind text,
    payload jsonb DEFAULT '{}',
    run_at timestamptz DEFAULT now(),
    priority integer DEFAULT 0,
    idempotency_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    timeout interval DEFAULT NULL,
    heartbeat_timeout interval DEFAULT NULL,
    queue text DEFAULT 'default',
    concurrency_key text DEFAULT NULL,
    unique_key text DEFAULT NULL,
    unique_while text DEFAULT 'active',
    unique_for interval DEFAULT NULL,
    on_conflict text DEFAULT 'ignore',
    depends_on bigint[] DEFAULT NULL
)
RETURNS jobs.runs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_run jobs.runs;
    v_moved jobs.runs;
    v_deps text;
    v_moved_id bigint;
    v_moved_at timestamptz;
    v_unique_since timestamptz;
BEGIN
    -- Each check is first a plain expression (no statement) that a valid argument passes; where
    -- it does not, the helper that owns the message decides, in the same order as ever, so a bad
    -- call fails as it always did. The payload's needs the size limit (one read of jobs.config);
    -- below 200 bytes of text a payload cannot nest 100 levels, so its depth is walked only above.
    IF NOT coalesce(jobs._plain_name(enqueue.kind), FALSE) THEN
        PERFORM jobs._check_name('kind', enqueue.kind);
    END IF;
    IF jsonb_typeof(enqueue.payload) IS DISTINCT FROM 'object'
       OR octet_length(enqueue.payload::text) > (SELECT c.max_payload_bytes FROM jobs.config AS c)
       OR (octet_length(enqueue.payload::text) >= 200
           AND jsonb_path_exists(enqueue.payload, 'strict $.**{100} ? (@.type() == "object" || @.type() == "array")'))
    THEN
        PERFORM jobs._check_payload('payload', enqueue.payload);
    END IF;
    IF NOT coalesce(isfinite(enqueue.run_at) AND enqueue.run_at >= '0001-01-02 00:00:00+00'
                    AND enqueue.run_at < '9999-12-31 00:00:00+00', FALSE) THEN
        PERFORM jobs._check_instant('run_at', enqueue.run_at);
    END IF;
    IF enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN -1000 AND 1000 THEN
        PERFORM jobs._check_range('priority', enqueue.priority, -1000, 1000);
    END IF;
    -- (A key with a printable ASCII character that is not a space is not blank: no call.)
    IF enqueue.idempotency_key IS NOT NULL
       AND (length(enqueue.idempotency_key) NOT BETWEEN 1 AND 200 OR enqueue.idempotency_key !~ '[!-~]') THEN
        PERFORM jobs._check_key('idempotency_key', enqueue.idempotency_key);
    END IF;
    IF enqueue.max_attempts IS NOT NULL AND enqueue.max_attempts NOT BETWEEN 1 AND 1000 THEN
        PERFORM jobs._check_range('max_attempts', enqueue.max_attempts, 1, 1000);
    END IF;
    IF enqueue.timeout IS NOT NULL THEN
        PERFORM jobs._check_duration('timeout', enqueue.timeout);
    END IF;
    IF enqueue.heartbeat_timeout IS NOT NULL THEN
        PERFORM jobs._check_duration('heartbeat_timeout', enqueue.heartbeat_timeout);
    END IF;
    IF NOT coalesce(jobs._plain_name(enqueue.queue), FALSE)
       OR length(enqueue.concurrency_key) NOT BETWEEN 1 AND 200 OR enqueue.concurrency_key !~ '[!-~]' THEN
        PERFORM jobs._check_flow_args(enqueue.queue, enqueue.concurrency_key);
    END IF;
    IF enqueue.unique_key IS NOT NULL
       AND (length(enqueue.unique_key) NOT BETWEEN 1 AND 200 OR enqueue.unique_key !~ '[!-~]') THEN
        PERFORM jobs._check_key('unique_key', enqueue.unique_key);
    END IF;
    IF enqueue.unique_while IS NULL OR enqueue.unique_while NOT IN ('queued', 'active', 'ever') THEN
        RAISE EXCEPTION 'unique_while must be queued, active or ever, got %', jobs._shown(enqueue.unique_while)
            USING ERRCODE = '22023';
    END IF;
    IF enqueue.unique_for IS NOT NULL THEN
        PERFORM jobs._check_duration('unique_for', enqueue.unique_for);
    END IF;
    IF enqueue.on_conflict IS NULL OR enqueue.on_conflict NOT IN ('ignore', 'replace', 'debounce') THEN
        RAISE EXCEPTION 'on_conflict must be ignore, replace or debounce, got %', jobs._shown(enqueue.on_conflict)
            USING ERRCODE = '22023';
    END IF;
    IF enqueue.unique_key IS NOT NULL AND enqueue.idempotency_key IS NOT NULL THEN
        RAISE EXCEPTION 'give unique_key or idempotency_key, not both' USING ERRCODE = '22023', COLUMN = 'idempotency_key';
    END IF;
    IF enqueue.unique_key IS NULL
       AND (enqueue.unique_for IS NOT NULL OR enqueue.unique_while <> 'active' OR enqueue.on_conflict <> 'ignore') THEN
        RAISE EXCEPTION 'unique_while, unique_for and on_conflict need a unique_key' USING ERRCODE = '22023', COLUMN = 'unique_key',
            HINT = 'Without a unique_key every enqueue adds a run: say which runs are one job.';
    END IF;
    IF enqueue.depends_on IS NOT NULL THEN
        PERFORM jobs._check_depends_on(enqueue.depends_on);
    END IF;
    IF enqueue.depends_on IS NOT NULL AND enqueue.on_conflict = 'replace' THEN
        RAISE EXCEPTION 'depends_on cannot be given with on_conflict replace: a replace keeps what the queued run waits on'
            USING ERRCODE = '22023',
                  HINT = 'Give depends_on with on_conflict ignore or debounce (a run of the key keeps its own), or cancel the queued run and enqueue again.';
    END IF;

    IF enqueue.idempotency_key IS NOT NULL THEN
        -- Its run may move to history meanwhile (jobs.archive): an older snapshot would find it
        -- in neither table and add a second run of the key.
        PERFORM jobs._require_read_committed('an enqueue with an idempotency_key');
    END IF;
    IF enqueue.unique_key IS NOT NULL THEN
        PERFORM jobs._require_read_committed('an enqueue with a unique_key');
        PERFORM pg_advisory_xact_lock(jobs._unique_key(enqueue.kind, enqueue.unique_key));
        -- unique_for as elapsed time (a day is 24 hours, a month 30 days, as jobs.reap counts):
        -- now() - interval '1 day' steps back a calendar day in the session's TimeZone, 23 or
        -- 25 hours across a DST change, so two callers with different settings would disagree
        -- on whether a run of the key is in the window, and both add one.
        v_unique_since := now() - make_interval(secs => extract(EPOCH FROM enqueue.unique_for));
        -- Under the lock, a fresh snapshot: any earlier enqueue of this key has committed.
        SELECT r.* INTO v_run
          FROM jobs.runs AS r
         WHERE r.kind = enqueue.kind AND r.unique_key = enqueue.unique_key
           AND CASE enqueue.unique_while
                   WHEN 'queued' THEN r.status = 'QUEUED'
                   WHEN 'active' THEN r.status IN ('QUEUED', 'RUNNING')
                   ELSE TRUE END
           AND (enqueue.unique_for IS NULL OR r.created_at > v_unique_since)
         ORDER BY r.id DESC
         LIMIT 1
           FOR UPDATE;
        IF NOT FOUND AND enqueue.unique_while = 'ever' THEN
            -- A finished run of the key may have moved to history (only finished runs move):
            -- its key is in jobs.run_history_keys, and the run is read from its day alone.
            SELECT k.run_id, k.finished_at INTO v_moved_id, v_moved_at
              FROM jobs.run_history_keys AS k
             WHERE k.kind = enqueue.kind AND k.unique_key = enqueue.unique_key
               AND (enqueue.unique_for IS NULL OR k.created_at > v_unique_since)
             ORDER BY k.run_id DESC
             LIMIT 1;
            IF v_moved_id IS NOT NULL THEN
                v_run := jobs._moved_run(v_moved_id, v_moved_at);
            END IF;
        END IF;
        IF v_run.id IS NOT NULL THEN
            IF v_run.status = 'QUEUED' AND enqueue.on_conflict = 'replace' THEN
                UPDATE jobs.runs AS r
                   SET payload = enqueue.payload, scheduled_for = enqueue.run_at
                 WHERE r.id = v_run.id AND r.status = 'QUEUED'
                RETURNING r.* INTO v_run;
                PERFORM jobs._notify();
            ELSIF v_run.status = 'QUEUED' AND enqueue.on_conflict = 'debounce' THEN
                UPDATE jobs.runs AS r
                   SET scheduled_for = enqueue.run_at
                 WHERE r.id = v_run.id AND r.status = 'QUEUED'
                RETURNING r.* INTO v_run;
                PERFORM jobs._notify();   -- moved earlier, it may be due before a worker wakes
            END IF;
            RETURN v_run;
        END IF;
    END IF;

    -- Locks the dependency chains until commit (and checks them again, now final).
    v_deps := CASE WHEN enqueue.depends_on IS NULL THEN 'met' ELSE jobs._dependency_state(enqueue.depends_on) END;
    IF current_setting('pgtick.known_kind', TRUE) IS DISTINCT FROM enqueue.kind THEN
        PERFORM jobs._warn_unknown_kind(enqueue.kind);
    END IF;

    INSERT INTO jobs.runs AS r (
        kind, payload, scheduled_for, priority, idempotency_key, max_attempts,
        timeout, heartbeat_timeout, origin, queue, concurrency_key, unique_key, depends_on,
        blocked, status, finished_at, failure_reason, error
    )
    VALUES (
        enqueue.kind, enqueue.payload, enqueue.run_at, enqueue.priority, enqueue.idempotency_key,
        enqueue.max_attempts, enqueue.timeout, enqueue.heartbeat_timeout, 'manual',
        enqueue.queue, enqueue.concurrency_key, enqueue.unique_key, enqueue.depends_on,
        v_deps = 'pending',
        CASE WHEN v_deps = 'failed' THEN 'CANCELLED'::jobs.run_status ELSE 'QUEUED'::jobs.run_status END,
        CASE WHEN v_deps = 'failed' THEN now() END,
        CASE WHEN v_deps = 'failed' THEN 'DependencyFailed' END,
        CASE WHEN v_deps = 'failed' THEN 'a run it depends on failed or was cancelled' END
    )
    ON CONFLICT (kind, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING r.* INTO v_run;

    IF NOT FOUND THEN
        -- The key exists (possibly committed a moment ago by a concurrent caller): return that
        -- run, wherever it is by now (moved to history in the meantime, its key moved with it).
        SELECT r.* INTO v_run FROM jobs.runs AS r
         WHERE r.kind = enqueue.kind AND r.idempotency_key = enqueue.idempotency_key;
        IF NOT FOUND THEN
            v_run := jobs._moved_run_of_key(enqueue.kind, enqueue.idempotency_key);
        END IF;
        RETURN v_run;
    END IF;
    IF enqueue.idempotency_key IS NOT NULL THEN
        -- The key's run may have moved to history. Looked up after the insert, not before: an
        -- insert that met the run in jobs.runs being moved waited for the move to commit, so
        -- this later statement sees its key (jobs.run_history_keys, written by the same move);
        -- then the new row was never seen by anyone.
        v_moved := jobs._moved_run_of_key(enqueue.kind, enqueue.idempotency_key);
        IF v_moved.id IS NOT NULL THEN
            DELETE FROM jobs.runs AS r WHERE r.id = v_run.id;
            RETURN v_moved;
        END IF;
    END IF;
    PERFORM jobs._notify();
    RETURN v_run;
END $$;
COMMENT ON FUNCTION jobs.enqueue(
    text, jsonb, timestamptz, integer, text, integer, interval, interval,
    text, text, text, text, interval, text, bigint[]
) IS
'Queue an ad-hoc run of kind at run_at in queue, with an optional concurrency_key. idempotency_key (per kind): a second call returns the existing run, while it is kept (a key whose run retention pruned adds a new run). unique_key: while a run of the kind with that key is queued | active | ever (unique_while; ever = until pruned), created within unique_for (elapsed time, whatever the session''s TimeZone: a day is 24 hours, a month 30 days), no run is added; on_conflict ignore returns it, replace updates a QUEUED one''s payload and scheduled_for, debounce moves a QUEUED one''s scheduled_for. depends_on: not claimable until those runs completed; cancelled (DependencyFailed) if one fails for good or is cancelled; refused with on_conflict replace (a replace keeps what the queued run waits on); ignore and debounce leave a run of the key its own. Every argument is checked before the key is looked up: a bad call fails alike whatever the key''s state and changes nothing.';

-- Queue many ad-hoc runs of one kind in one statement (one per element of the JSON array payloads).
CREATE OR REPLACE FUNCTION jobs.enqueue_many(
    kind text,
    payloads jsonb,
    run_at timestamptz DEFAULT now(),
    priority integer DEFAULT 0,
    queue text DEFAULT 'default',
    concurrency_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    timeout interval DEFAULT NULL,
    heartbeat_timeout interval DEFAULT NULL,
    depends_on bigint[] DEFAULT NULL
)
RETURNS SETOF jobs.runs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_deps text;
    v_bad bigint;
    v_problem text;
BEGIN
    PERFORM jobs._check_name('kind', enqueue_many.kind);
    IF enqueue_many.payloads IS NULL OR jsonb_typeof(enqueue_many.payloads) <> 'array' THEN
        RAISE EXCEPTION 'payloads must be a JSON array of objects, got %',
            coalesce(jsonb_typeof(enqueue_many.payloads), 'NULL') USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_range('payloads length', jsonb_array_length(enqueue_many.payloads), 1, 100000);
    SELECT e.n - 1, p.problem INTO v_bad, v_problem
      FROM jsonb_array_elements(enqueue_many.payloads) WITH ORDINALITY AS e (payload, n)
     CROSS JOIN jobs.config AS c
     CROSS JOIN LATERAL jobs._payload_problem(e.payload, c.max_payload_bytes) AS p (problem)
     WHERE p.problem IS NOT NULL
     ORDER BY e.n
     LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'payloads[%] %', v_bad, v_problem USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_instant('run_at', enqueue_many.run_at);
    PERFORM jobs._check_range('priority', enqueue_many.priority, -1000, 1000);
    PERFORM jobs._check_flow_args(enqueue_many.queue, enqueue_many.concurrency_key);
    IF enqueue_many.max_attempts IS NOT NULL THEN
        PERFORM jobs._check_range('max_attempts', enqueue_many.max_attempts, 1, 1000);
    END IF;
    PERFORM jobs._check_duration('timeout', enqueue_many.timeout);
    PERFORM jobs._check_duration('heartbeat_timeout', enqueue_many.heartbeat_timeout);
    v_deps := jobs._dependency_state(enqueue_many.depends_on);
    IF current_setting('pgtick.known_kind', TRUE) IS DISTINCT FROM enqueue_many.kind THEN
        PERFORM jobs._warn_unknown_kind(enqueue_many.kind);   -- as jobs.enqueue: a typo waits for ever
    END IF;

    RETURN QUERY
    INSERT INTO jobs.runs AS r (
        kind, payload, scheduled_for, priority, max_attempts, timeout, heartbeat_timeout, origin,
        queue, concurrency_key, depends_on, blocked, status, finished_at, failure_reason, error
    )
    SELECT enqueue_many.kind, e.payload, enqueue_many.run_at, enqueue_many.priority,
           enqueue_many.max_attempts, enqueue_many.timeout, enqueue_many.heartbeat_timeout, 'manual',
           enqueue_many.queue, enqueue_many.concurrency_key, enqueue_many.depends_on,
           v_deps = 'pending',
           CASE WHEN v_deps = 'failed' THEN 'CANCELLED'::jobs.run_status ELSE 'QUEUED'::jobs.run_status END,
           CASE WHEN v_deps = 'failed' THEN now() END,
           CASE WHEN v_deps = 'failed' THEN 'DependencyFailed' END,
           CASE WHEN v_deps = 'failed' THEN 'a run it depends on failed or was cancelled' END
      FROM jsonb_array_elements(enqueue_many.payloads) WITH ORDINALITY AS e (payload, n)
     ORDER BY e.n
    RETURNING r.*;
    PERFORM jobs._notify();
END $$;
COMMENT ON FUNCTION jobs.enqueue_many(
    text, jsonb, timestamptz, integer, text, text, integer, interval, interval, bigint[]
) IS
'Queue one ad-hoc run of kind per element of payloads (a JSON array of objects) in one statement and one NOTIFY; returns them in array order. The other arguments apply to every run. A NOTICE, as jobs.enqueue raises, when no worker ever registered the kind.';

-- Queue a run of a definition now (origin manual); it counts against the definition's cap.
CREATE OR REPLACE FUNCTION jobs.run_now(name text, payload jsonb DEFAULT NULL) RETURNS jobs.runs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    v_def jobs.definitions;
    v_run jobs.runs;
BEGIN
    PERFORM jobs._check_text('name', name, 200);
    IF payload IS NOT NULL THEN
        PERFORM jobs._check_payload('payload', payload);
    END IF;
    -- Held until commit: jobs.undefine waits for this run, or this call for its end.
    v_def := jobs._lock_definition(run_now.name, FALSE);
    -- A blank concurrency key from before such keys were refused: the runs' key refuses it.
    IF jobs._blank_key(v_def.concurrency_key) THEN
        RAISE EXCEPTION '%', jobs._blank_key_problem(v_def.name, v_def.concurrency_key) USING ERRCODE = '22023';
    END IF;
    INSERT INTO jobs.runs AS r (
        definition_id, kind, payload, priority, max_attempts, timeout, heartbeat_timeout, origin,
        queue, concurrency_key
    )
    VALUES (
        v_def.id, v_def.kind, coalesce(run_now.payload, v_def.payload), v_def.priority,
        v_def.max_attempts, v_def.timeout, v_def.heartbeat_timeout, 'manual',
        v_def.queue, v_def.concurrency_key
    )
    RETURNING r.* INTO v_run;
    PERFORM jobs._notify();
    RETURN v_run;
END $$;
COMMENT ON FUNCTION jobs.run_now(text, jsonb) IS 'Queue a run of the named definition now (origin manual), optionally with another payload; it counts against the definition''s cap.';
