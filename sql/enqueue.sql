-- ===========================================================================
-- enqueue.sql: ad-hoc runs (jobs.enqueue) and runs of a definition on demand (jobs.run_now).
-- ===========================================================================

-- Queue one ad-hoc run; with an idempotency key, a repeat returns the existing run.
CREATE OR REPLACE FUNCTION jobs.enqueue(
    kind text,
    payload jsonb DEFAULT '{}',
    run_at timestamptz DEFAULT now(),
    priority integer DEFAULT 0,
    idempotency_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    timeout interval DEFAULT NULL,
    heartbeat_timeout interval DEFAULT NULL
)
RETURNS jobs.runs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_run jobs.runs;
BEGIN
    PERFORM jobs._check_text('kind', enqueue.kind, 200);
    PERFORM jobs._check_payload('payload', enqueue.payload);
    PERFORM jobs._check_instant('run_at', enqueue.run_at);
    PERFORM jobs._check_range('priority', enqueue.priority, -1000, 1000);
    IF enqueue.idempotency_key IS NOT NULL THEN
        PERFORM jobs._check_text('idempotency_key', enqueue.idempotency_key, 200);
    END IF;
    IF enqueue.max_attempts IS NOT NULL THEN
        PERFORM jobs._check_range('max_attempts', enqueue.max_attempts, 1, 1000);
    END IF;
    PERFORM jobs._check_positive('timeout', enqueue.timeout);
    PERFORM jobs._check_positive('heartbeat_timeout', enqueue.heartbeat_timeout);
    PERFORM jobs._warn_unknown_kind(enqueue.kind);

    INSERT INTO jobs.runs AS r (
        kind, payload, scheduled_for, priority, idempotency_key, max_attempts,
        timeout, heartbeat_timeout, origin
    )
    VALUES (
        enqueue.kind, enqueue.payload, enqueue.run_at, enqueue.priority, enqueue.idempotency_key,
        enqueue.max_attempts, enqueue.timeout, enqueue.heartbeat_timeout, 'manual'
    )
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING r.* INTO v_run;

    IF NOT FOUND THEN
        -- The key exists (possibly committed a moment ago by a concurrent caller): return that run.
        SELECT r.* INTO v_run FROM jobs.runs AS r WHERE r.idempotency_key = enqueue.idempotency_key;
        RETURN v_run;
    END IF;
    PERFORM jobs._notify();
    RETURN v_run;
END
$$;
COMMENT ON FUNCTION jobs.enqueue(text, jsonb, timestamptz, integer, text, integer, interval, interval) IS
'Queue an ad-hoc run of kind at run_at. With idempotency_key, a second call returns the existing run and creates nothing.';

-- Queue a run of a definition now (origin manual); it counts against the definition's cap.
CREATE OR REPLACE FUNCTION jobs.run_now(name text, payload jsonb DEFAULT NULL)
RETURNS jobs.runs
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_def jobs.definitions;
    v_run jobs.runs;
BEGIN
    PERFORM jobs._check_text('name', name, 200);
    IF payload IS NOT NULL THEN
        PERFORM jobs._check_payload('payload', payload);
    END IF;
    SELECT d.* INTO v_def FROM jobs.definitions AS d WHERE d.name = run_now.name;
    IF v_def.id IS NULL THEN
        RAISE EXCEPTION 'definition % does not exist', quote_literal(run_now.name) USING ERRCODE = 'P0002';
    END IF;
    INSERT INTO jobs.runs AS r (
        definition_id, kind, payload, priority, max_attempts, timeout, heartbeat_timeout, origin
    )
    VALUES (
        v_def.id, v_def.kind, coalesce(run_now.payload, v_def.payload), v_def.priority,
        v_def.max_attempts, v_def.timeout, v_def.heartbeat_timeout, 'manual'
    )
    RETURNING r.* INTO v_run;
    PERFORM jobs._notify();
    RETURN v_run;
END
$$;
COMMENT ON FUNCTION jobs.run_now(text, jsonb) IS
'Queue a run of the named definition now (origin manual), optionally with another payload; it counts against the definition''s cap.';
