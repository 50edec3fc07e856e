-- ===========================================================================
-- define_many.sql: creating or replacing many definitions in one call.
-- ===========================================================================

DROP FUNCTION IF EXISTS jobs._schedule_shape_ok(text);  -- jobs._schedule_problem (schedule.sql) says what is wrong

DROP FUNCTION IF EXISTS jobs._definition_problem(jsonb);  -- now told which zones are known good

-- Private: the first thing wrong with one element of jobs.define_many's array, or NULL. The
-- caller checks each distinct zone once and passes those without a problem as good_zones.
CREATE OR REPLACE FUNCTION jobs._definition_problem(e jsonb, good_zones text[] DEFAULT '{}') RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_key text;
    v_text text;
    v_low integer;
    v_high integer;
BEGIN
    IF jsonb_typeof(e) IS DISTINCT FROM 'object' THEN
        RETURN 'must be a JSON object';
    END IF;
    SELECT k INTO v_key FROM jsonb_object_keys(e) AS k
     WHERE k NOT IN ('name', 'kind', 'schedule', 'timezone', 'run_at', 'payload', 'enabled',
                     'max_concurrent_runs', 'priority', 'max_attempts', 'misfire_policy',
                     'overlap_policy', 'timeout', 'heartbeat_timeout', 'dst_gap', 'dst_repeat', 'jitter',
                     'pause_after_failures', 'queue', 'concurrency_key')
     LIMIT 1;
    IF v_key IS NOT NULL THEN
        RETURN format('unknown field %s', v_key);
    END IF;
    FOREACH v_key IN ARRAY ARRAY['name', 'kind'] LOOP
        IF jsonb_typeof(e -> v_key) IS DISTINCT FROM 'string'
           OR length(e ->> v_key) NOT BETWEEN 1 AND 200 OR (e ->> v_key) ~ '[[:cntrl:]]'
           OR jobs._blank(e ->> v_key) THEN
            RETURN format('%s must be a string of 1 to 200 characters, not blank, without control characters', v_key);
        END IF;
    END LOOP;
    FOREACH v_key IN ARRAY ARRAY['schedule', 'timezone', 'run_at', 'misfire_policy', 'overlap_policy',
                                 'dst_gap', 'dst_repeat', 'queue', 'concurrency_key'] LOOP
        IF jsonb_typeof(e -> v_key) NOT IN ('string', 'null') THEN
            RETURN format('%s must be a string', v_key);
        END IF;
    END LOOP;
    IF (e ->> 'schedule' IS NULL) = (e ->> 'run_at' IS NULL) THEN
        RETURN 'give exactly one of schedule (recurring) or run_at (one-shot)';
    END IF;
    IF e ->> 'schedule' IS NOT NULL AND length(e ->> 'schedule') NOT BETWEEN 1 AND 4000 THEN
        RETURN 'schedule must be 1 to 4000 characters';
    END IF;
    IF e ->> 'schedule' IS NOT NULL THEN
        v_text := jobs._schedule_problem(e ->> 'schedule');
        IF v_text IS NOT NULL THEN
            RETURN v_text;
        END IF;
    END IF;
    IF NOT coalesce(e ->> 'timezone', 'UTC') = ANY (good_zones) THEN
        v_text := jobs._zone_problem(coalesce(e ->> 'timezone', 'UTC'));
    END IF;
    IF v_text IS NOT NULL THEN
        RETURN v_text;
    END IF;
    IF e ->> 'run_at' IS NOT NULL THEN
        BEGIN
            v_text := jobs._instant_problem(jobs._json_run_at(e ->> 'run_at', coalesce(e ->> 'timezone', 'UTC')));
            IF v_text IS NOT NULL THEN
                RETURN 'run_at ' || v_text;
            END IF;
        EXCEPTION WHEN data_exception THEN
            RETURN format('run_at must be a timestamp, got %s', jobs._shown(e ->> 'run_at'));
        END;
    END IF;
    IF e ? 'payload' THEN
        v_text := jobs._payload_problem(e -> 'payload', (SELECT c.max_payload_bytes FROM jobs.config AS c));
        IF v_text IS NOT NULL THEN
            RETURN 'payload ' || v_text;
        END IF;
    END IF;
    IF jsonb_typeof(e -> 'enabled') NOT IN ('boolean', 'null') THEN
        RETURN 'enabled must be true, false or null';
    END IF;
    FOREACH v_key IN ARRAY ARRAY['max_concurrent_runs', 'priority', 'max_attempts', 'pause_after_failures'] LOOP
        CONTINUE WHEN coalesce(jsonb_typeof(e -> v_key), 'null') = 'null';
        v_low := CASE v_key WHEN 'priority' THEN -1000 ELSE 1 END;
        v_high := CASE v_key WHEN 'max_concurrent_runs' THEN 100000 ELSE 1000 END;
        IF jsonb_typeof(e -> v_key) <> 'number' OR (e ->> v_key)::numeric NOT BETWEEN v_low AND v_high
           OR (e ->> v_key)::numeric % 1 <> 0 THEN
            RETURN format('%s must be an integer from %s to %s', v_key, v_low, v_high);
        END IF;
    END LOOP;
    IF coalesce(e ->> 'misfire_policy', 'coalesce') NOT IN ('coalesce', 'catch_up', 'skip') THEN
        RETURN 'misfire_policy must be coalesce, catch_up or skip';
    END IF;
    IF coalesce(e ->> 'overlap_policy', 'queue') NOT IN ('queue', 'skip', 'buffer_one', 'cancel_other') THEN
        RETURN 'overlap_policy must be queue, skip, buffer_one or cancel_other';
    END IF;
    FOREACH v_key IN ARRAY ARRAY['timeout', 'heartbeat_timeout'] LOOP
        IF jsonb_typeof(e -> v_key) IN ('number', 'string') THEN
            BEGIN
                v_text := jobs._duration_problem(v_key, jobs._json_interval(e -> v_key));
            EXCEPTION WHEN data_exception THEN
                SELECT format('%s must be a number of seconds or an interval between %s and %s, got %s',
                              v_key, b.low, b.high, jobs._shown((e -> v_key)::text))
                  INTO v_text FROM jobs._duration_bounds(v_key) AS b;
                RETURN v_text;
            END;
            IF v_text IS NOT NULL THEN
                RETURN v_key || ' ' || v_text;
            END IF;
        ELSIF jsonb_typeof(e -> v_key) NOT IN ('null') THEN
            RETURN format('%s must be a number of seconds or an interval', v_key);
        END IF;
    END LOOP;
    IF jsonb_typeof(e -> 'jitter') NOT IN ('number', 'string', 'null') THEN
        RETURN 'jitter must be a number of seconds or an interval';
    END IF;
    IF NOT e ?| ARRAY['queue', 'concurrency_key', 'dst_gap', 'dst_repeat', 'jitter', 'pause_after_failures'] THEN
        RETURN NULL;
    END IF;
    BEGIN  -- the rules jobs.define checks, with its messages
        PERFORM jobs._check_flow_args(coalesce(e ->> 'queue', 'default'), e ->> 'concurrency_key');
        PERFORM jobs._check_schedule_controls(
            e ->> 'schedule' IS NOT NULL, e ->> 'dst_gap', e ->> 'dst_repeat', jobs._json_interval(e -> 'jitter'),
            (e ->> 'pause_after_failures')::numeric::integer   -- (a whole number, checked above)
        );
    EXCEPTION
        WHEN invalid_parameter_value THEN
            RETURN SQLERRM;
        WHEN data_exception THEN
            RETURN format('jitter must be a number of seconds or an interval, got %s', jobs._shown((e -> 'jitter')::text));
    END;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION jobs._definition_problem(jsonb, text[]) IS 'Private: the first problem with one jobs.define_many element (a field named), or NULL when it is valid; zones in good_zones are not checked again.';

-- Private: an interval field of a define_many element (seconds as a number, or interval text).
CREATE OR REPLACE FUNCTION jobs._json_interval(value jsonb) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE jsonb_typeof(value)
               -- Past 1e12 seconds make_interval would saturate silently: make it raise 22008.
               WHEN 'number' THEN make_interval(secs => CASE WHEN abs((value #>> '{}')::numeric) <= 1e12
                                                            THEN (value #>> '{}')::double precision
                                                            ELSE 'Infinity' END)
               WHEN 'string' THEN (value #>> '{}')::interval
           END
$$;
COMMENT ON FUNCTION jobs._json_interval(jsonb) IS 'Private: a JSON number of seconds or an interval string as an interval; NULL otherwise.';

-- Private: a define_many element's run_at text as an instant. Text that names its instant (a UTC
-- offset, Z, a zone, 'now') is that instant; text without one is wall time in zone (the element's
-- timezone), never in the calling session's TimeZone, read as the driver reads it
-- (pgtick.client.read_time): a wall time the clocks skip with the offset before the gap (as
-- PostgreSQL reads it), one they repeat at its first pass. Bad text raises 22007/22008.
CREATE OR REPLACE FUNCTION jobs._json_run_at(value text, zone text) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_session text := current_setting('TimeZone');
    v_utc timestamptz;
    v_east timestamptz;
    v_wall timestamp;
    v_at timestamptz;
    v_first timestamptz;
BEGIN
    IF value IS NULL THEN
        RETURN NULL;
    END IF;
    -- Read under two session zones 14 hours apart: text that names its instant reads alike.
    PERFORM set_config('TimeZone', 'UTC', TRUE);
    v_utc := value::timestamptz;
    PERFORM set_config('TimeZone', 'Etc/GMT-14', TRUE);
    v_east := value::timestamptz;
    PERFORM set_config('TimeZone', zone, TRUE);
    v_wall := value::timestamp;  -- ('today' is today in zone)
    PERFORM set_config('TimeZone', v_session, TRUE);
    IF v_utc = v_east OR NOT isfinite(v_utc) THEN
        RETURN v_utc;
    END IF;
    v_at := v_wall AT TIME ZONE zone;
    -- A repeated wall time has two readings, one per UTC offset around it: keep the earlier.
    SELECT min(c.at) INTO v_first
      FROM (SELECT (v_wall - ((t.at AT TIME ZONE zone) - (t.at AT TIME ZONE 'UTC'))) AT TIME ZONE 'UTC' AS at
              FROM unnest(ARRAY[v_at - interval '1 day', v_at, v_at + interval '1 day']) AS t (at)) AS c
     WHERE c.at AT TIME ZONE zone = v_wall;
    RETURN coalesce(v_first, v_at);
END $$;
COMMENT ON FUNCTION jobs._json_run_at(text, text) IS 'Private: a define_many element''s run_at text as an instant: with a UTC offset (or zone) that instant; without one, wall time in zone (not the session''s TimeZone), a skipped wall time read with the offset before the gap, a repeated one at its first pass, as the driver reads it.';

-- Create or replace many definitions by name in one call, validated like jobs.define.
CREATE OR REPLACE FUNCTION jobs.define_many(definitions jsonb)
RETURNS TABLE (id bigint, name text, created boolean, rescheduled boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_problem record;
    v_good_zones text[];
BEGIN
    IF jsonb_typeof(define_many.definitions) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'definitions must be a JSON array of objects' USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_range('definitions length', jsonb_array_length(define_many.definitions), 0, 1000000);
    -- Each zone is checked once, not once per definition (a definition without a zone is UTC).
    SELECT array_agg(z.zone) INTO v_good_zones
      FROM (SELECT DISTINCT coalesce(e ->> 'timezone', 'UTC') AS zone
              FROM jsonb_array_elements(define_many.definitions) AS e
             WHERE jsonb_typeof(e) = 'object') AS z
     WHERE jobs._zone_problem(z.zone) IS NULL;
    SELECT x.n, x.e ->> 'name' AS name, x.problem INTO v_problem
      FROM (SELECT o.n, o.e, jobs._definition_problem(o.e, coalesce(v_good_zones, '{}')) AS problem
              FROM jsonb_array_elements(define_many.definitions) WITH ORDINALITY AS o (e, n)) AS x
     WHERE x.problem IS NOT NULL
     ORDER BY x.n LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'definitions[%] (%): %', v_problem.n - 1, coalesce(v_problem.name, 'no name'),
            v_problem.problem USING ERRCODE = '22023';
    END IF;
    SELECT x.name INTO v_problem
      FROM (SELECT e ->> 'name' AS name FROM jsonb_array_elements(define_many.definitions) AS e) AS x
     GROUP BY x.name HAVING count(*) > 1 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'definitions: name % appears more than once', quote_literal(v_problem.name)
            USING ERRCODE = '22023';
    END IF;

    RETURN QUERY
    SELECT x.*
      FROM jobs._declare(array(
          SELECT jsonb_populate_record(NULL::jobs.definitions, jsonb_build_object(
                     'name', e ->> 'name', 'kind', e ->> 'kind', 'schedule', e ->> 'schedule',
                     'timezone', coalesce(e ->> 'timezone', 'UTC'),
                     'run_at', jobs._json_run_at(e ->> 'run_at', coalesce(e ->> 'timezone', 'UTC')),
                     'payload', coalesce(e -> 'payload', '{}'), 'enabled', e -> 'enabled',
                     -- Whole numbers as integers: JSON may write them 10.0 or 1e3 (checked above).
                     'max_concurrent_runs', (e ->> 'max_concurrent_runs')::numeric::integer,
                     'priority', coalesce((e ->> 'priority')::numeric::integer, 0),
                     'max_attempts', (e ->> 'max_attempts')::numeric::integer,
                     'misfire_policy', coalesce(e ->> 'misfire_policy', 'coalesce'),
                     'overlap_policy', coalesce(e ->> 'overlap_policy', 'queue'),
                     'timeout', jobs._json_interval(e -> 'timeout'),
                     'heartbeat_timeout', jobs._json_interval(e -> 'heartbeat_timeout'),
                     'dst_gap', e ->> 'dst_gap', 'dst_repeat', e ->> 'dst_repeat',
                     'jitter', jobs._json_interval(e -> 'jitter'),
                     'pause_after_failures', (e ->> 'pause_after_failures')::numeric::integer,
                     'queue', coalesce(e ->> 'queue', 'default'), 'concurrency_key', e ->> 'concurrency_key'
                 ))
            FROM jsonb_array_elements(define_many.definitions) AS e
      )) AS x;
END $$;
COMMENT ON FUNCTION jobs.define_many(jsonb) IS 'Create or replace many definitions by name in one call: a JSON array of objects with the parameters of jobs.define (name, kind, schedule or run_at, timezone, payload, enabled, max_concurrent_runs, priority, max_attempts, misfire_policy, overlap_policy, timeout, heartbeat_timeout; intervals as seconds or interval text; a run_at without a UTC offset is wall time in the element''s timezone, not the session''s). All are validated first: a bad element raises 22023 naming its index and field, and nothing is applied. Returns one row per definition: created (new name), rescheduled (schedule, timezone, DST policy, jitter or run_at changed: the cursor restarts at this instant and the old schedule''s never-started runs for later occurrences, and a moved one-shot''s, are deleted; the new schedule re-creates those the two share, once). A changed kind, payload, priority, max_attempts, timeout, heartbeat_timeout, queue or concurrency_key also applies to the scheduled runs that have not started yet. An element that matches its stored definition changes nothing.';
