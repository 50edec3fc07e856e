-- ===========================================================================
-- helpers.sql: private validation and notification helpers used by the API.
-- All functions pin search_path; every reference is schema-qualified.
-- ===========================================================================

-- Advisory lock keys: every key pgtick takes, named once.
--
--   key                     scope        taken by                     value
--   ----------------------  -----------  ---------------------------  ------------------------------------
--   migration               session      sql/install.sql, migrate.py  8099570450837491015 ('pgtickMG');
--                                                                    a literal in sql/install.sql
--                                                                    (\set pgtick_migration_lock): it is
--                                                                    taken before the schema exists
--   jobs._leader_key()      session      jobs.try_lead / resign       8099570450837490756 ('pgtickLD'; in
--                                                                    pg_locks classid 1885828201, objid
--                                                                    1667976260, objsubid 1; spelled out
--                                                                    in the jobs.leader view)
--   jobs._dispatch_key(id)  transaction  jobs.claim (capped          hashtextextended('dispatch:' || id, 0)
--                                        definitions)
--   jobs._limit_key(label)  transaction  jobs.claim (queue and kind  hashtextextended('dispatch:' || label, 0)
--                           (shared for  limits; label: the JSON    (one sorted order with the
--                           big limits)  array [scope, name(, key)]) definition keys: no cycles)
--
-- The 'pgtick..' keys are the ASCII bytes as a big-endian bigint, so they stand
-- out in pg_locks and cannot meet a hash of another application by accident.

-- Private: the scheduler leader lock key.
CREATE OR REPLACE FUNCTION jobs._leader_key()
RETURNS bigint
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT 8099570450837490756::bigint $$;
COMMENT ON FUNCTION jobs._leader_key() IS 'Private: advisory lock key of the scheduler leader (''pgtickLD'').';

-- Private: the dispatch lock key of one definition (serializes claims of a capped definition).
CREATE OR REPLACE FUNCTION jobs._dispatch_key(definition_id bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT hashtextextended('dispatch:' || definition_id, 0) $$;
COMMENT ON FUNCTION jobs._dispatch_key(bigint) IS
'Private: transaction advisory lock key that jobs.claim takes per capped definition before counting its RUNNING rows.';

-- Private: the dispatch lock key of one queue or kind limit group (label: see jobs.claim).
CREATE OR REPLACE FUNCTION jobs._limit_key(label text)
RETURNS bigint
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT hashtextextended('dispatch:' || label, 0) $$;
COMMENT ON FUNCTION jobs._limit_key(text) IS
'Private: transaction advisory lock key that jobs.claim takes per queue or kind limit group before counting it.';

-- Raise 22023 (invalid_parameter_value) naming the field when a text is empty or too long.
CREATE OR REPLACE FUNCTION jobs._check_text(field text, value text, max_length integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL OR length(value) = 0 THEN
        RAISE EXCEPTION '% must be a non-empty text', field USING ERRCODE = '22023';
    END IF;
    IF length(value) > max_length THEN
        RAISE EXCEPTION '% is % characters long; the limit is %', field, length(value), max_length
            USING ERRCODE = '22023';
    END IF;
END
$$;
COMMENT ON FUNCTION jobs._check_text(text, text, integer) IS
'Private: raises 22023 naming the field if the text is NULL, empty or longer than max_length.';

-- Raise 22023 unless the payload is a JSON object within jobs.config.max_payload_bytes.
CREATE OR REPLACE FUNCTION jobs._check_payload(field text, payload jsonb)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_limit integer := (SELECT c.max_payload_bytes FROM jobs.config AS c);
    v_size integer;
BEGIN
    IF payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
        RAISE EXCEPTION '% must be a JSON object, got %', field, coalesce(jsonb_typeof(payload), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    v_size := octet_length(payload::text);
    IF v_size > v_limit THEN
        RAISE EXCEPTION '% is % bytes; the limit is % (jobs.config.max_payload_bytes)', field, v_size, v_limit
            USING ERRCODE = '22023';
    END IF;
END
$$;
COMMENT ON FUNCTION jobs._check_payload(text, jsonb) IS
'Private: raises 22023 unless the value is a JSON object no larger than jobs.config.max_payload_bytes.';

-- Raise 22023 naming the field when a number is NULL or outside [low, high].
CREATE OR REPLACE FUNCTION jobs._check_range(field text, value bigint, low bigint, high bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL OR value < low OR value > high THEN
        RAISE EXCEPTION '% must be between % and %, got %', field, low, high, coalesce(value::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
END
$$;
COMMENT ON FUNCTION jobs._check_range(text, bigint, bigint, bigint) IS
'Private: raises 22023 naming the field if the number is NULL or out of range.';

-- Raise 22023 unless run_ids is an array of at most 10,000 ids and worker a valid worker id.
CREATE OR REPLACE FUNCTION jobs._check_run_batch(run_ids bigint[], worker text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF run_ids IS NULL THEN
        RAISE EXCEPTION 'run_ids must be an array of run ids, got NULL' USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_range('run_ids length', cardinality(run_ids), 0, 10000);
    PERFORM jobs._check_text('worker', worker, 200);
END
$$;
COMMENT ON FUNCTION jobs._check_run_batch(bigint[], text) IS
'Private: raises 22023 naming the field unless run_ids is a non-NULL array of at most 10,000 ids and worker a non-empty text of at most 200 characters.';

-- The stored form of a worker's claim token: its sha256 (NULL for no token).
-- Raises 22023 naming claim_token unless it is 16 to 200 characters: a short token
-- could be guessed, and a worker that presents one means to be fenced by it.
CREATE OR REPLACE FUNCTION jobs._claim_token_hash(claim_token text)
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF claim_token IS NULL THEN
        RETURN NULL;
    END IF;
    IF length(claim_token) NOT BETWEEN 16 AND 200 THEN
        RAISE EXCEPTION 'claim_token must be 16 to 200 characters (a secret the worker generated), got %',
            length(claim_token)
            USING ERRCODE = '22023',
                  HINT = 'Generate one per worker process, e.g. secrets.token_urlsafe(32) or openssl rand -hex 16.';
    END IF;
    RETURN pg_catalog.sha256(pg_catalog.convert_to(claim_token, 'UTF8'));
END
$$;
COMMENT ON FUNCTION jobs._claim_token_hash(text) IS
'Private: sha256 of a claim token (NULL for NULL), the only form in which it is stored; raises 22023 naming claim_token unless it is 16 to 200 characters.';

-- Raise 22023 unless the timestamp is present and finite.
CREATE OR REPLACE FUNCTION jobs._check_instant(field text, value timestamptz)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NULL OR NOT isfinite(value) THEN
        RAISE EXCEPTION '% must be a finite timestamp, got %', field, coalesce(value::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
END
$$;
COMMENT ON FUNCTION jobs._check_instant(text, timestamptz) IS
'Private: raises 22023 naming the field if the timestamp is NULL or infinite.';

-- Raise 22023 unless the interval is NULL (allowed: "use the default") or strictly positive.
CREATE OR REPLACE FUNCTION jobs._check_positive(field text, value interval)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NOT NULL AND value <= interval '0' THEN
        RAISE EXCEPTION '% must be a positive interval, got %', field, value USING ERRCODE = '22023';
    END IF;
END
$$;
COMMENT ON FUNCTION jobs._check_positive(text, interval) IS
'Private: raises 22023 naming the field if the interval is zero or negative.';

-- Wake idle workers: one NOTIFY on channel "jobs" per transaction, however many rows it queues.
CREATE OR REPLACE FUNCTION jobs._notify()
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('pgtick.notified', TRUE) IS DISTINCT FROM 'yes' THEN
        PERFORM pg_notify('jobs', '');
        PERFORM set_config('pgtick.notified', 'yes', TRUE);  -- transaction-local
    END IF;
END
$$;
COMMENT ON FUNCTION jobs._notify() IS
'Private: NOTIFY jobs once per transaction so idle workers wake at once.';
