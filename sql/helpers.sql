-- ===========================================================================
-- helpers.sql: private validation and notification helpers used by the API.
-- Every reference is schema-qualified. Every function's search_path is pinned to
-- pg_catalog, pg_temp once, for all of them, at the end of the install (sql/roles.sql);
-- the install's transaction uses that path too, so SQL function bodies are checked
-- against the same names they will run with.
-- ===========================================================================

SET LOCAL search_path = pg_catalog, pg_temp;

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
--   (a limit's stripes)     transaction  jobs.claim (with each       hashtextextended('dispatch:' || label
--                           (exclusive)  shared limit lock: one of   || '#' || stripe, 0), stripe 0..15;
--                                        its 16 stripes)             only tried, never waited for
--   jobs._definition_key    transaction  jobs.run_now, retries       hashtextextended('definition:'
--   (id)                    (shared)     (jobs._enqueue_retries):    || id % 256, 0): one of 256
--                                        adding a run of a definition stripes, so a reap that retries
--                           (exclusive)  jobs.undefine, before it    runs of thousands of definitions
--                                        locks the row to delete it  takes at most 256 locks
--   jobs._unique_key        transaction  jobs.enqueue with a         hashtextextended('unique:' ||
--   (kind, unique_key)                   unique_key (before it reads  jsonb_build_array(kind, key)::text,
--                                        the key's runs); jobs.fail   0); taken before any run's row, so
--                                        and jobs.reap, before they   an enqueue that waited for a holder
--                                        fail a holder and queue its  to fail sees the retry queued with
--                                        retry (jobs.reap only tries  the failure
--                                        it, and leaves the run for
--                                        the next pass when busy)
--   jobs._claim_key(worker, transaction  jobs.claim (shared, first   hashtextextended('claim:' || worker
--   token_hash)             (shared)     thing it locks)             [|| ':' || hex of the claim token's
--                                                                    hash], 0): one per worker id and
--                                                                    token; a recovery
--                           (exclusive)  jobs.hand_back_unheld       waits for the worker's claims in
--                                                                    flight to commit or roll back
--   jobs._heartbeat_key     transaction  jobs.heartbeat (shared,     hashtextextended('heartbeat:' ||
--   (worker, token_hash)    (shared)     only tried, first thing:    worker [|| ':' || hex of the claim
--                                                                    token's hash], 0): a heartbeat in flight,
--                                        before it waits for any     even one waiting behind a table
--                                        lock on jobs.runs)          lock, keeps the reaper off its
--                           (exclusive)  jobs.reap (session level,   worker's runs until it commits
--                           (session)    only tried and released at
--                                        once, before it locks a run
--                                        overdue but for Timeout:
--                                        jobs._heartbeat_in_flight)
--   jobs._claiming_key()    transaction  jobs.claim (shared, with    8099570450837488460 ('pgtickCL')
--                           (shared)     its claim lock)
--                           (exclusive)  jobs.set_limit of a new
--                                        limit, jobs.define giving a
--                                        definition its first cap
--                                        (jobs._wait_for_claims)
--   jobs._claim_slot()      transaction  jobs.claim of capped runs   8099570450837492528 + n, n = 0..2
--   (takes one of 3 slots)  (exclusive)  (capped definitions, or     ('pgtickS0', 'pgtickS1', 'pgtickS2'):
--                                        limits not all roomy)       only tried, for at most 0.1 s
--   jobs._window_key        transaction  jobs.set_limit (after the   hashtextextended('window:' ||
--   (scope, name)           (exclusive)  limit's dispatch locks),    jsonb_build_array(scope, name)::text,
--                           (shared)     jobs._give_back_starts      0): a recount and a give-back of a
--                                        (unclaim, hand_back_unheld) rate window never cross row locks
--
-- The 'pgtick..' keys are the ASCII bytes as a big-endian bigint, so they stand
-- out in pg_locks and cannot meet a hash of another application by accident.

-- Private: the scheduler leader lock key.
CREATE OR REPLACE FUNCTION jobs._leader_key() RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT 8099570450837490756::bigint $$;
COMMENT ON FUNCTION jobs._leader_key() IS 'Private: advisory lock key of the scheduler leader (''pgtickLD'').';

-- Private: the dispatch lock key of one definition (serializes claims of a capped definition).
CREATE OR REPLACE FUNCTION jobs._dispatch_key(definition_id bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtextextended('dispatch:' || definition_id, 0) $$;
COMMENT ON FUNCTION jobs._dispatch_key(bigint) IS 'Private: transaction advisory lock key that jobs.claim takes per capped definition before counting its RUNNING rows.';

-- Private: the dispatch lock key of one queue or kind limit group (label: see jobs.claim).
CREATE OR REPLACE FUNCTION jobs._limit_key(label text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtextextended('dispatch:' || label, 0) $$;
COMMENT ON FUNCTION jobs._limit_key(text) IS 'Private: transaction advisory lock key that jobs.claim takes per queue or kind limit group before counting it.';

-- Private: the key that serializes the enqueues of one unique key with the failures (and
-- their retries) of its runs.
CREATE OR REPLACE FUNCTION jobs._unique_key(kind text, unique_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtextextended('unique:' || jsonb_build_array(kind, unique_key)::text, 0) $$;
COMMENT ON FUNCTION jobs._unique_key(text, text) IS 'Private: transaction advisory lock key of a kind and unique key, held by jobs.enqueue while it reads the key''s runs and inserts, and by jobs.fail and jobs.reap when they fail a run of the key and queue its retry.';

-- Private: the claim lock key of one worker id and claim token (its hash; NULL: none): every
-- jobs.claim holds it shared until it commits, so jobs.hand_back_unheld, holding it exclusive,
-- sees the outcome of every claim of that worker and token begun before it (a claim whose
-- client is gone may still be running). The token is part of the key: a caller that knows
-- only the worker id (another login) cannot hold up that worker's claims, as it cannot hand
-- back its runs.
DROP FUNCTION IF EXISTS jobs._claim_key(text);
CREATE OR REPLACE FUNCTION jobs._claim_key(worker text, token_hash bytea DEFAULT NULL) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtextextended('claim:' || worker || coalesce(':' || encode(token_hash, 'hex'), ''), 0)
$$;
COMMENT ON FUNCTION jobs._claim_key(text, bytea) IS 'Private: transaction advisory lock key of a worker id and claim token hash (NULL: none), held shared by each jobs.claim of that worker and token and exclusive by jobs.hand_back_unheld.';

-- Private: the heartbeat key of one worker id and claim token (its hash; NULL: none): every
-- jobs.heartbeat of that worker and token tries it shared before it touches jobs.runs, so a
-- heartbeat that waits behind a table lock (an ALTER TABLE, a LOCK TABLE, a migration) holds it
-- all the while; jobs.reap tries it exclusive before it takes a run for a missing heartbeat, and
-- leaves the runs claimed with that id and token alone while it is held. The token is part of
-- the key: a caller that knows only the worker id (another login) cannot keep its runs from the
-- reaper by holding a heartbeat open, as it cannot stamp them.
DROP FUNCTION IF EXISTS jobs._heartbeat_key(text);
CREATE OR REPLACE FUNCTION jobs._heartbeat_key(worker text, token_hash bytea) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtextextended('heartbeat:' || worker || coalesce(':' || encode(token_hash, 'hex'), ''), 0)
$$;
COMMENT ON FUNCTION jobs._heartbeat_key(text, bytea) IS 'Private: transaction advisory lock key of a worker id and claim token hash (NULL: none), tried shared by each jobs.heartbeat of that worker and token before it touches jobs.runs, and tried exclusive by jobs.reap before it fails one of the runs claimed with them as HeartbeatLost or Orphaned.';

-- Private: is a heartbeat of this worker in flight (its heartbeat key held shared)? Tried
-- exclusive and released at once rather than held to the end of the reap: a reap fails the
-- runs of many workers, and a lock held per worker took as many slots of the server's shared
-- lock table, which a few thousand dead workers filled (every reap then failed, out of shared
-- memory). Held or not, the key changes nothing for a heartbeat that comes after the try (it
-- only tries it, and skips the rows the reap has locked).
DROP FUNCTION IF EXISTS jobs._heartbeat_in_flight(text);
CREATE OR REPLACE FUNCTION jobs._heartbeat_in_flight(worker text, token_hash bytea) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_key bigint := jobs._heartbeat_key(worker, token_hash);
BEGIN
    IF pg_try_advisory_lock(v_key) THEN
        PERFORM pg_advisory_unlock(v_key);
        RETURN FALSE;
    END IF;
    RETURN TRUE;
END $$;
COMMENT ON FUNCTION jobs._heartbeat_in_flight(text, bytea) IS 'Private: true while a jobs.heartbeat of this worker and claim token hash holds their heartbeat key; tries the key exclusive at session level and releases it at once (no lock is left held).';

-- Private: the key every jobs.claim holds shared until it commits, whatever it claims. A
-- change that makes runs capped which were not (a new limit, a definition's first
-- max_concurrent_runs) takes it exclusive (jobs._wait_for_claims): a claim in progress may
-- have read them as uncapped and started them without any group lock, and its starts are
-- not visible until it commits, so the change waits for it to commit before it counts or
-- commits itself, and the claims after it wait for the change.
CREATE OR REPLACE FUNCTION jobs._claiming_key() RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT 8099570450837488460::bigint $$;
COMMENT ON FUNCTION jobs._claiming_key() IS 'Private: advisory lock key (''pgtickCL'') held shared by every jobs.claim and exclusive by a change that caps runs which were not capped.';

-- Private: take one of the three claim slots (key table above) for this transaction; FALSE
-- when none came free within 0.1 s. Every claim of capped runs (a capped definition, or a
-- limit that is not roomy) takes one before it locks anything, so at most three such claims
-- are in progress at once across every worker process. A capped claim holds the dispatch
-- locks of its definitions and groups until it commits, and every other claim whose pool
-- meets one of them passes over its runs: with more claims at once they mostly find each
-- other's groups busy, and go on to lock runs further down the queue that they cannot start
-- either. The slots are only tried, a try every half millisecond (a claim may already hold row
-- locks, so it never waits in the lock manager), and a claim that finds none within 0.1 s goes
-- on without one: a transaction left open after its claim cannot hold up the others for longer.
CREATE OR REPLACE FUNCTION jobs._claim_slot() RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_until timestamptz := clock_timestamp() + interval '100 ms';
BEGIN
    LOOP
        FOR n IN 0 .. 2 LOOP
            IF pg_try_advisory_xact_lock(8099570450837492528 + n) THEN
                RETURN TRUE;
            END IF;
        END LOOP;
        IF clock_timestamp() >= v_until THEN
            RETURN FALSE;
        END IF;
        PERFORM pg_sleep(0.0005);
    END LOOP;
END $$;
COMMENT ON FUNCTION jobs._claim_slot() IS 'Private: try for at most 0.1 s to take one of the three claim slots (''pgtickS0''..''pgtickS2''), held until the transaction ends, that bound the claims of capped runs in progress at once; TRUE if one was taken.';

-- Private: wait (at most 5 s, or the session's shorter lock_timeout) until no claim is in
-- progress, and hold off new claims until this transaction ends; 55P03 naming what when
-- the claims in progress do not finish in time (the caller's transaction is then rolled
-- back: nothing changed).
CREATE OR REPLACE FUNCTION jobs._wait_for_claims(what text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_was text := current_setting('lock_timeout');
BEGIN
    IF v_was::interval = interval '0' OR v_was::interval > interval '5 s' THEN
        PERFORM set_config('lock_timeout', '5s', TRUE);
    END IF;
    PERFORM pg_advisory_xact_lock(jobs._claiming_key());
    PERFORM set_config('lock_timeout', v_was, TRUE);
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION '% waits for the claims in progress, and they did not finish within %: nothing changed',
        what, CASE WHEN v_was::interval = interval '0' OR v_was::interval > interval '5 s' THEN '5s' ELSE v_was END
        USING ERRCODE = '55P03',
              HINT = 'A transaction that called jobs.claim and is still open holds them up; try again once it ends.';
END $$;
COMMENT ON FUNCTION jobs._wait_for_claims(text) IS 'Private: take jobs._claiming_key() exclusive, waiting at most 5 s (or a shorter session lock_timeout) for the claims in progress; 55P03 naming what otherwise.';

-- Private: the key that serializes adding runs of a definition with deleting it.
-- A FOR KEY SHARE row lock alone does not: PostgreSQL can lose one taken while a concurrent
-- UPDATE of the row (the scheduler moving its cursor) has the page unlocked midway, and then
-- jobs.undefine's FOR UPDATE would not wait for the run being added. Definitions share the
-- key in 256 stripes: an undefine may also wait for runs of another definition being added.
CREATE OR REPLACE FUNCTION jobs._definition_key(definition_id bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtextextended('definition:' || definition_id % 256, 0) $$;
COMMENT ON FUNCTION jobs._definition_key(bigint) IS 'Private: transaction advisory lock key of a definition''s stripe (id % 256), held shared while a run of it is added (jobs.run_now, retries) and exclusive by jobs.undefine.';

-- Private: lock a definition by id to add a run of it (for_delete false: the key shared, the
-- row FOR KEY SHARE) or to delete it (true: the key exclusive, the row FOR UPDATE). The key
-- comes first, so an undefine waits for a run being added, or the adder waits for the delete
-- and then finds no row; the row lock finds a delete committed after the statement's
-- snapshot. Returns the row, or a row of NULLs when the definition is gone.
CREATE OR REPLACE FUNCTION jobs._hold_definition(definition_id bigint, for_delete boolean) RETURNS jobs.definitions
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_def jobs.definitions;
BEGIN
    IF for_delete THEN
        PERFORM pg_advisory_xact_lock(jobs._definition_key(_hold_definition.definition_id));
        SELECT d.* INTO v_def FROM jobs.definitions AS d WHERE d.id = _hold_definition.definition_id FOR UPDATE;
    ELSE
        PERFORM pg_advisory_xact_lock_shared(jobs._definition_key(_hold_definition.definition_id));
        SELECT d.* INTO v_def FROM jobs.definitions AS d WHERE d.id = _hold_definition.definition_id FOR KEY SHARE;
    END IF;
    RETURN v_def;
END $$;
COMMENT ON FUNCTION jobs._hold_definition(bigint, boolean) IS 'Private: the definition with this id, locked for adding a run (its key shared, the row FOR KEY SHARE) or for deleting it (key exclusive, FOR UPDATE); all NULLs when it no longer exists.';

-- Private: look up the named definition and lock it (jobs._hold_definition); P0002 when no
-- definition has the name.
CREATE OR REPLACE FUNCTION jobs._lock_definition(name text, for_delete boolean) RETURNS jobs.definitions
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_id bigint;
    v_def jobs.definitions;
BEGIN
    LOOP
        SELECT d.id INTO v_id FROM jobs.definitions AS d WHERE d.name = _lock_definition.name;
        IF v_id IS NULL THEN
            RETURN jobs._known_definition(NULL, _lock_definition.name);
        END IF;
        v_def := jobs._hold_definition(v_id, for_delete);
        IF v_def.id IS NOT NULL THEN
            RETURN v_def;
        END IF;
        -- Deleted meanwhile: the name may have been defined again since.
    END LOOP;
END $$;
COMMENT ON FUNCTION jobs._lock_definition(text, boolean) IS 'Private: the named definition, locked for adding a run (its key shared, the row FOR KEY SHARE) or for deleting it (key exclusive, FOR UPDATE); P0002 when none has the name.';

-- Raise 22023 (invalid_parameter_value) naming the field when a text is empty or too long.
CREATE OR REPLACE FUNCTION jobs._check_text(field text, value text, max_length integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL OR length(value) = 0 THEN
        RAISE EXCEPTION '% must be a non-empty text', field USING ERRCODE = '22023';
    END IF;
    IF length(value) > max_length THEN
        RAISE EXCEPTION '% is % characters long; the limit is %', field, length(value), max_length
            USING ERRCODE = '22023';
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_text(text, text, integer) IS 'Private: raises 22023 naming the field if the text is NULL, empty or longer than max_length.';

-- Raise 22023 naming the field when a *_problem function found something wrong (NULL: nothing).
CREATE OR REPLACE FUNCTION jobs._refuse(field text, problem text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION '% %', field, problem USING ERRCODE = '22023';
    END IF;
END $$;
COMMENT ON FUNCTION jobs._refuse(text, text) IS 'Private: raises 22023 with the message "field problem" unless problem is NULL.';

-- What is wrong with a payload (NULL when nothing): not a JSON object, larger than max_bytes,
-- or nested deeper than 100 levels. PostgreSQL stores far deeper JSON, but a driver decodes it
-- recursively (Python's json gives up near 1000 levels), and a run whose payload cannot be
-- decoded is lost with the rest of its claimed batch. The depth walk looks no deeper than level
-- 100 (the root is level 0): an array or object there is the 101st level.
-- In PL/pgSQL, whose expressions are planned once per session: a SQL function is not inlined
-- here (every function pins search_path, roles.sql), so it would be planned at every call.
CREATE OR REPLACE FUNCTION jobs._payload_problem(payload jsonb, max_bytes integer) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN CASE
        WHEN payload IS NULL OR jsonb_typeof(payload) <> 'object' THEN
            format('must be a JSON object, got %s', coalesce(jsonb_typeof(payload), 'NULL'))
        WHEN octet_length(payload::text) > max_bytes THEN
            format('is %s bytes; the limit is %s (jobs.config.max_payload_bytes)',
                   octet_length(payload::text), max_bytes)
        WHEN jsonb_path_exists(payload, 'strict $.**{100} ? (@.type() == "object" || @.type() == "array")') THEN
            'nests deeper than 100 levels of arrays and objects'
    END;
END $$;
COMMENT ON FUNCTION jobs._payload_problem(jsonb, integer) IS 'Private: why a payload is refused (not a JSON object, larger than max_bytes, nested deeper than 100 levels), or NULL.';

-- Raise 22023 unless the payload is a JSON object within jobs.config.max_payload_bytes and 100 levels deep.
CREATE OR REPLACE FUNCTION jobs._check_payload(field text, payload jsonb) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM jobs._refuse(field, jobs._payload_problem(payload, c.max_payload_bytes)) FROM jobs.config AS c;
END $$;
COMMENT ON FUNCTION jobs._check_payload(text, jsonb) IS 'Private: raises 22023 unless the value is a JSON object no larger than jobs.config.max_payload_bytes and nested at most 100 levels deep.';

-- Raise 22023 naming the field when a number is NULL or outside [low, high].
CREATE OR REPLACE FUNCTION jobs._check_range(field text, value bigint, low bigint, high bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL OR value < low OR value > high THEN
        RAISE EXCEPTION '% must be between % and %, got %', field, low, high, coalesce(value::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_range(text, bigint, bigint, bigint) IS 'Private: raises 22023 naming the field if the number is NULL or out of range.';

-- Raise 22023 naming run_ids unless it is an array of at most max_length ids.
CREATE OR REPLACE FUNCTION jobs._check_run_ids(run_ids bigint[], max_length integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF run_ids IS NULL THEN
        RAISE EXCEPTION 'run_ids must not be NULL' USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_range('number of run_ids', cardinality(run_ids), 0, max_length);
END $$;
COMMENT ON FUNCTION jobs._check_run_ids(bigint[], integer) IS 'Private: raises 22023 naming run_ids unless it is a non-NULL array of at most max_length ids (10,000 for a worker''s batch, 100,000 for an operator''s).';

-- The definition a caller's lookup by name found, or P0002 naming the name when it found none
-- (definition.id NULL). Each caller keeps its own query and lock; the rule lives here.
CREATE OR REPLACE FUNCTION jobs._known_definition(definition jobs.definitions, name text) RETURNS jobs.definitions
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF definition.id IS NULL THEN
        PERFORM jobs._check_name('name', name);  -- NULL or '' is no name at all: 22023
        RAISE EXCEPTION 'definition % does not exist', quote_literal(name)
            USING ERRCODE = 'P0002', COLUMN = 'name';
    END IF;
    RETURN definition;
END $$;
COMMENT ON FUNCTION jobs._known_definition(jobs.definitions, text) IS 'Private: returns the definition row a lookup by name found; raises P0002 "definition ''name'' does not exist" (column name) when it found none (id NULL).';

-- A run by id, live or moved to history; no row when there is none. jobs.runs first (the live
-- runs and the last archive_after of finished ones): history is read only when the run is not
-- there, so a lookup of a recent run opens and locks none of its days (reading jobs.runs_all
-- plans every day of history, two to ten locks a day, whatever it finds).
-- A run in history is read back as a row of jobs.runs, whose keys refuse a blank one; history
-- itself is not checked, so a run that held one before such keys were refused (migration 0026)
-- is still there. Raise 22023 naming the key, the run and the fix, rather than the domain's
-- bare constraint, before such a run is read.
CREATE OR REPLACE FUNCTION jobs._check_history_keys(run_id bigint, finished_at timestamptz DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_field text;
BEGIN
    -- Planned for its values, so that a finished_at given reads its day alone (jobs._moved_run).
    EXECUTE 'SELECT f.field FROM jobs.run_history AS h'
            ' CROSS JOIN LATERAL (VALUES (''idempotency_key'', h.idempotency_key), (''unique_key'', h.unique_key),'
            '                            (''concurrency_key'', h.concurrency_key)) AS f (field, value)'
            ' WHERE h.id = $1 AND ($2::timestamptz IS NULL OR h.finished_at = $2) AND jobs._blank_key(f.value)'
            ' LIMIT 1'
       INTO v_field USING _check_history_keys.run_id, _check_history_keys.finished_at;
    IF v_field IS NOT NULL THEN
        RAISE EXCEPTION 'run % (in history) holds a blank %, stored before blank keys were refused: it cannot be read as a run',
            run_id, v_field
            USING ERRCODE = '22023',
                  HINT = format('Clear it: UPDATE jobs.run_history SET %I = NULL WHERE id = %s '
                                '(docs/operations.md, Blank keys).', v_field, run_id);
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_history_keys(bigint, timestamptz) IS 'Private: raises 22023 naming the key when the run with this id in jobs.run_history (finished at finished_at, when given) holds a blank idempotency, unique or concurrency key, which a row of jobs.runs refuses.';

CREATE OR REPLACE FUNCTION jobs.get_run(run_id bigint) RETURNS SETOF jobs.runs
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    v_run jobs.runs;
BEGIN
    RETURN QUERY SELECT r.* FROM jobs.runs AS r WHERE r.id = get_run.run_id;
    IF NOT FOUND THEN
        -- The same snapshot as the read above (a STABLE function reads its caller's), in which
        -- the run is in exactly one of the two tables. (Read into a row of jobs.runs: history's
        -- columns have the base types of its domains.)
        PERFORM jobs._check_history_keys(get_run.run_id);
        SELECT h.* INTO v_run FROM jobs.run_history AS h WHERE h.id = get_run.run_id;
        IF FOUND THEN
            RETURN NEXT v_run;
        END IF;
    END IF;
END $$;
COMMENT ON FUNCTION jobs.get_run(bigint) IS 'The run with this id, live or moved to jobs.run_history (no row when there is none); reads history only for a run jobs.runs no longer holds. What Client.get_run calls.';

-- A run by id, live or in history, for an operator's call on it: 22023 naming run_id when it
-- is NULL, P0002 naming the id when there is no such run. With for_update the row is
-- locked; a run moved to history while the caller waited for its lock is found there.
DROP FUNCTION IF EXISTS jobs._known_run(jobs.runs, bigint);
CREATE OR REPLACE FUNCTION jobs._known_run(run_id bigint, for_update boolean) RETURNS jobs.runs
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_run jobs.runs;
BEGIN
    IF run_id IS NULL THEN
        RAISE EXCEPTION 'run_id must not be NULL' USING ERRCODE = '22023';
    END IF;
    IF for_update THEN
        SELECT r.* INTO v_run FROM jobs.runs AS r WHERE r.id = _known_run.run_id FOR UPDATE;
        IF NOT FOUND THEN
            PERFORM jobs._check_history_keys(_known_run.run_id);
            SELECT h.* INTO v_run FROM jobs.run_history AS h WHERE h.id = _known_run.run_id FOR UPDATE;
        END IF;
    ELSE
        SELECT g.* INTO v_run FROM jobs.get_run(_known_run.run_id) AS g;
    END IF;
    IF v_run.id IS NULL THEN
        RAISE EXCEPTION 'run % does not exist', run_id USING ERRCODE = 'P0002', COLUMN = 'run_id';
    END IF;
    RETURN v_run;
END $$;
COMMENT ON FUNCTION jobs._known_run(bigint, boolean) IS 'Private: the run with this id, live or in history (locked FOR UPDATE when for_update); raises 22023 naming run_id when it is NULL, and P0002 "run N does not exist" (column run_id) when there is none.';

-- The stored form of a worker's claim token: its sha256 (NULL for no token).
-- Raises 22023 naming claim_token unless it is 16 to 200 characters: a short token
-- could be guessed, and a worker that presents one means to be fenced by it.
CREATE OR REPLACE FUNCTION jobs._claim_token_hash(claim_token text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
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
END $$;
COMMENT ON FUNCTION jobs._claim_token_hash(text) IS 'Private: sha256 of a claim token (NULL for NULL), the only form in which it is stored; raises 22023 naming claim_token unless it is 16 to 200 characters.';

DROP FUNCTION IF EXISTS jobs._run_fence(bigint, text, text);  -- one run is fenced by jobs._hold_own_run

-- What is wrong with a time a run may be given (NULL when nothing): NULL, infinite, or outside
-- the years 1 to 9999 with a day to spare, which every driver can hold in any time zone
-- (Python's datetime ends there: a claimed run it cannot read is lost with its batch).
-- (In PL/pgSQL, so that it is planned once per session: see jobs._payload_problem.)
CREATE OR REPLACE FUNCTION jobs._instant_problem(value timestamptz) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN CASE
        WHEN value IS NULL OR NOT isfinite(value)
          OR value < '0001-01-02 00:00:00+00' OR value >= '9999-12-31 00:00:00+00' THEN
            format('must be a finite timestamp from 0001-01-02 to 9999-12-30 UTC, got %s',
                   CASE WHEN value IS NULL THEN 'NULL'
                        WHEN NOT isfinite(value) THEN value::text
                        ELSE to_char(value AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS BC') || ' UTC' END)
    END;
END $$;
COMMENT ON FUNCTION jobs._instant_problem(timestamptz) IS 'Private: why a timestamp is refused (NULL, infinite, outside 0001-01-02 .. 9999-12-30 UTC), or NULL.';

-- Raise 22023 naming the field unless the timestamp is one every driver can hold.
CREATE OR REPLACE FUNCTION jobs._check_instant(field text, value timestamptz) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM jobs._refuse(field, jobs._instant_problem(value));
END $$;
COMMENT ON FUNCTION jobs._check_instant(text, timestamptz) IS 'Private: raises 22023 naming the field if the timestamp is NULL, infinite or outside 0001-01-02 .. 9999-12-30 UTC.';

-- Private: is the text only spaces, of any script (the characters Unicode counts as white
-- space, but for the control characters that a name may not hold anyway)?
CREATE OR REPLACE FUNCTION jobs._blank(value text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN btrim(value, U&' \00A0\1680\2000\2001\2002\2003\2004\2005\2006\2007\2008\2009\200A\2028\2029\202F\205F\3000') = '';
END $$;
COMMENT ON FUNCTION jobs._blank(text) IS 'Private: true when the text is made only of (non-control) white space.';

-- Private: is the key blank as jobs._check_key and the keys' constraints (migration 0026) take
-- it: only white space once the control characters are taken out? NULL for NULL.
CREATE OR REPLACE FUNCTION jobs._blank_key(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$ SELECT jobs._blank(regexp_replace(value, '[[:cntrl:]]', '', 'g')) $$;
COMMENT ON FUNCTION jobs._blank_key(text) IS 'Private: true when the key is only white space and control characters (jobs._check_key refuses it); NULL for NULL.';

-- Private: why a definition holding a blank concurrency key (written before such keys were
-- refused) can have no run: the runs' key refuses it.
CREATE OR REPLACE FUNCTION jobs._blank_key_problem(name text, concurrency_key text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('definition %s: concurrency_key must not be blank (only spaces), got %s; declare it '
                  'again with a key, or none (docs/operations.md, Blank keys)',
                  quote_literal(name), to_json(concurrency_key))
$$;
COMMENT ON FUNCTION jobs._blank_key_problem(text, text) IS 'Private: the error recorded for a definition whose blank concurrency key (from before it was refused) keeps it from having runs.';

-- A text that is certainly a name as jobs._check_name takes it: 1 to 200 printable ASCII
-- characters, at least one of them not a space. Where it is false, jobs._check_name decides.
-- A SQL-standard body, inlined into the expression that calls it (roles.sql leaves its
-- search_path unpinned): a hot call's check of its name costs no function call. (The length is
-- not a bound of the pattern: PostgreSQL's regular expressions repeat a bounded atom's states,
-- and {1,200} made each test twenty times slower.)
CREATE OR REPLACE FUNCTION jobs._plain_name(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN length(value) <= 200 AND value ~ '^[ -~]+$' AND value ~ '[!-~]';
COMMENT ON FUNCTION jobs._plain_name(text) IS 'Private: true when the text is certainly a name (1 to 200 printable ASCII characters, not only spaces); where false, jobs._check_name decides.';

-- The first character of the text that hides in it or turns the text after it around, or NULL:
-- bidirectional overrides, isolates and marks (U+202E, U+2066, U+200F, U+061C...), line and
-- paragraph separators, zero-width space, word joiner and the other invisible format characters
-- (U+00AD soft hyphen, U+2061-2064, U+206A-206F, U+180E, U+FFF9-FFFB, U+1D173-1D17A, the
-- language tag U+E0001), the combining grapheme joiner, the Hangul fillers and Khmer inherent
-- vowels that show nothing (a name of U+3164 alone reads as blank), the byte order mark. A name
-- holding one would read, in a terminal, a log line or the dashboard, as another name. Not
-- refused: the zero-width (non-)joiners and variation selectors that scripts and emoji need,
-- and the tags that spell a flag's region.
CREATE OR REPLACE FUNCTION jobs._hidden_character(value text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT substring(value FROM U&'[\00AD\034F\061C\115F\1160\17B4\17B5\180E\200B\200E\200F\2028-\202E\2060-\2064\2066-\206F\3164\FEFF\FFA0\FFF9-\FFFB\+01D173-\+01D17A\+0E0001]')
$$;
COMMENT ON FUNCTION jobs._hidden_character(text) IS 'Private: the first character of the text that is invisible or turns text around (bidirectional overrides, isolates and marks, separators, zero-width space, invisible format characters, fillers that show nothing, the byte order mark), or NULL: what jobs._check_name refuses in a name.';

-- How an error message shows a refused text: quoted as quote_literal quotes it, at most 100
-- characters (then how many there were), control and invisible or text-direction characters
-- written as \n, \t, \r or \uXXXX (and a backslash as \\), so the message stays one short line
-- that reads as what was sent, whatever was sent (10 MB, a forged log line, a U+202E); NULL
-- as NULL.
CREATE OR REPLACE FUNCTION jobs._shown(value text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_char text;
    v_out text := '';
BEGIN
    IF value IS NULL THEN
        RETURN 'NULL';
    END IF;
    IF length(value) <= 100 AND value !~ '[[:cntrl:]\\]' AND jobs._hidden_character(value) IS NULL THEN
        RETURN quote_literal(value);
    END IF;
    FOREACH v_char IN ARRAY regexp_split_to_array(left(value, 100), '') LOOP
        v_out := v_out || CASE
            WHEN v_char = E'\n' THEN '\n'
            WHEN v_char = E'\r' THEN '\r'
            WHEN v_char = E'\t' THEN '\t'
            WHEN v_char = '\' THEN '\\'
            WHEN v_char = '''' THEN ''''''
            WHEN v_char ~ '[[:cntrl:]]' OR jobs._hidden_character(v_char) IS NOT NULL
                THEN '\u' || lpad(upper(to_hex(ascii(v_char))), greatest(4, length(to_hex(ascii(v_char)))), '0')
            ELSE v_char
        END;
    END LOOP;
    RETURN '''' || v_out || ''''
        || CASE WHEN length(value) > 100 THEN format('... (%s characters)', length(value)) ELSE '' END;
END $$;
COMMENT ON FUNCTION jobs._shown(text) IS 'Private: a refused text as an error message shows it: quoted, at most 100 characters (then its length), control and invisible characters escaped (\n, \uXXXX); NULL as NULL.';

-- Raise 22023 naming the field unless the text is a name: 1 to 200 characters, none of them a
-- control character (a newline or escape in a kind, queue or definition name would forge lines
-- in logs and break the CLI's tables) or one that hides or turns text around, nor only spaces.
CREATE OR REPLACE FUNCTION jobs._check_name(field text, value text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_hidden text;
BEGIN
    PERFORM jobs._check_text(field, value, 200);
    IF value ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION '% must not contain control characters, got %', field, to_json(value)
            USING ERRCODE = '22023';
    END IF;
    IF jobs._blank(value) THEN
        RAISE EXCEPTION '% must not be blank (only spaces), got %', field, to_json(value)
            USING ERRCODE = '22023';
    END IF;
    v_hidden := upper(to_hex(ascii(jobs._hidden_character(value))));
    IF v_hidden IS NOT NULL THEN
        RAISE EXCEPTION '% must not contain invisible or text-direction characters, got U+% at character %',
            field, lpad(v_hidden, greatest(4, length(v_hidden)), '0'),
            strpos(value, jobs._hidden_character(value))
            USING ERRCODE = '22023';
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_name(text, text) IS 'Private: raises 22023 naming the field unless the text is 1 to 200 characters without control characters, invisible or text-direction characters (U+202E and the like), and not only spaces.';

-- Raise 22023 naming the field unless the text is a key (idempotency, unique or concurrency):
-- 1 to 200 characters, not only spaces (or tabs and line breaks). A key is opaque data, so other
-- characters are the caller's; but a blank key is no key, as an empty one: every enqueue that
-- sends it (a form field of spaces, a padded column) would be one job, or one tenant.
CREATE OR REPLACE FUNCTION jobs._check_key(field text, value text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM jobs._check_text(field, value, 200);
    IF jobs._blank(regexp_replace(value, '[[:cntrl:]]', '', 'g')) THEN
        RAISE EXCEPTION '% must not be blank (only spaces), got %', field, to_json(value)
            USING ERRCODE = '22023';
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_key(text, text) IS 'Private: raises 22023 naming the field unless the text is a key: 1 to 200 characters, not only white space and control characters.';

-- Raise 22023 naming the field unless the array is NULL (no list) or holds 1 to 1000 names
-- (each as jobs._check_name takes it; a bad element is named by its position, e.g. kinds[3]).
CREATE OR REPLACE FUNCTION jobs._check_names(field text, value text[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    i integer;
BEGIN
    IF value IS NULL THEN
        RETURN;  -- no list: any name
    END IF;
    IF cardinality(value) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION '% must hold 1 to 1000 names, got %', field, cardinality(value) USING ERRCODE = '22023';
    END IF;
    IF array_ndims(value) > 1 THEN
        RAISE EXCEPTION '% must be a list of names, not an array of % dimensions', field, array_ndims(value)
            USING ERRCODE = '22023';
    END IF;
    -- By the list's own subscripts ('[0:1]={a,b}' holds [0] and [1]): an element is named where it is.
    FOR i IN array_lower(value, 1) .. array_upper(value, 1) LOOP
        PERFORM jobs._check_name(format('%s[%s]', field, i), value[i]);
    END LOOP;
END $$;
COMMENT ON FUNCTION jobs._check_names(text, text[]) IS 'Private: raises 22023 naming the field (and the element) unless the array is NULL (no list: any name) or a one-dimensional list of 1 to 1000 names of 1 to 200 characters without control characters.';

-- Raise 22023 unless the interval is NULL (allowed: "use the default") or strictly positive.
CREATE OR REPLACE FUNCTION jobs._check_positive(field text, value interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NOT NULL AND value <= interval '0' THEN
        RAISE EXCEPTION '% must be a positive interval, got %', field, value USING ERRCODE = '22023';
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_positive(text, interval) IS 'Private: raises 22023 naming the field if the interval is zero or negative.';

-- The bounds of every duration pgtick stores, by field: the one list that jobs._check_duration,
-- jobs.define_many and the jobs.config trigger read (the CHECK constraints on the tables, from
-- migrations/0010_bounds.sql, say the same for a direct UPDATE; but jobs.limits' CHECK on
-- rate_period, from migrations/0004_flow_control.sql, takes any positive period up to 1 day, so
-- a row written by hand, or before jobs.set_limit refused them, may hold a shorter one, which
-- jobs.claim enforces as written). Within them, now() plus or minus
-- any value stays far inside timestamptz's range, a driver can hold it (Python's timedelta ends
-- at 999999999 days), and no timeout is so short that a worker cannot keep its run alive.
-- Intervals compare as PostgreSQL orders them: a month counts 30 days.
-- (In PL/pgSQL, so that its query is planned once per session: see jobs._payload_problem.)
CREATE OR REPLACE FUNCTION jobs._duration_bounds(field text, OUT low text, OUT high text)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    SELECT b.low, b.high INTO _duration_bounds.low, _duration_bounds.high
      FROM (VALUES ('timeout', '1 second', '366 days'),
                   ('heartbeat_timeout', '100 milliseconds', '366 days'),
                   ('orphan_timeout', '100 milliseconds', '366 days'),
                   ('backoff_initial', '0 seconds', '366 days'),
                   ('backoff_max', '0 seconds', '366 days'),
                   ('unique_for', '1 millisecond', '100 years'),
                   ('retention', '1 second', '100 years'),
                   ('archive_after', '1 hour', '3660 days'),
                   ('older_than', '0 seconds', '100 years'),
                   ('lookahead', '0 seconds', '100 years'),
                   ('rate_period', '1 second', '1 day'),
                   ('misfire_grace', '0 seconds', '100 years')) AS b (field, low, high)
     WHERE b.field = _duration_bounds.field;
END $$;
COMMENT ON FUNCTION jobs._duration_bounds(text) IS 'Private: the smallest and largest interval accepted for a duration field (timeout, heartbeat_timeout, orphan_timeout, backoff_initial, backoff_max, unique_for, retention, archive_after, older_than, lookahead, rate_period, misfire_grace).';

-- Whether an interval's months, days and time have different signs ('-11 months 331 days',
-- '1 day -23 hours'). PostgreSQL compares such a value counting a month as 30 days and a day as
-- 24 hours, but adds it to a timestamp part by part, in calendar months and in days of the
-- session's time zone: how long it then lasts depends on the date, and can be nothing or less
-- (a lease of '-11 months 331 days', a day as compared, expires days before it is taken).
CREATE OR REPLACE FUNCTION jobs._mixed_signs(value interval) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (p.months > interval '0' OR p.days > interval '0' OR p.time > interval '0')
       AND (p.months < interval '0' OR p.days < interval '0' OR p.time < interval '0')
      FROM (SELECT date_trunc('month', value) AS months,
                   date_trunc('day', value) - date_trunc('month', value) AS days,
                   value - date_trunc('day', value) AS time) AS p
$$;
COMMENT ON FUNCTION jobs._mixed_signs(interval) IS 'Private: true when the months, days and time of an interval do not all have the same sign (zeros aside), so that its length as added to a timestamp depends on the date; NULL for NULL.';

-- The refusal of such an interval, with the value it compares as.
CREATE OR REPLACE FUNCTION jobs._mixed_signs_problem(value interval) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT CASE WHEN jobs._mixed_signs(value) THEN
        format('must not mix positive and negative parts (months, days, time), got %s: its length would '
               'depend on the date; give it in parts of one sign, such as %s', value, justify_interval(value))
    END
$$;
COMMENT ON FUNCTION jobs._mixed_signs_problem(interval) IS 'Private: why an interval whose parts have different signs is refused (jobs._mixed_signs), naming the value it compares as; NULL when its parts agree or it is NULL.';

-- What is wrong with a duration (NULL when nothing, or when the value is NULL: "the default").
-- A field with no bounds is a mistake in pgtick's own code: XX000.
CREATE OR REPLACE FUNCTION jobs._duration_problem(field text, value interval) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    b record;
BEGIN
    IF value IS NULL THEN
        RETURN NULL;
    END IF;
    b := jobs._duration_bounds(field);
    IF b.low IS NULL THEN
        RAISE EXCEPTION 'no bounds are known for the duration %', field USING ERRCODE = 'XX000';
    END IF;
    IF value NOT BETWEEN b.low::interval AND b.high::interval THEN
        RETURN format('must be an interval between %s and %s, got %s', b.low, b.high, value);
    END IF;
    RETURN jobs._mixed_signs_problem(value);
END $$;
COMMENT ON FUNCTION jobs._duration_problem(text, interval) IS 'Private: why the interval is out of the bounds of its field (jobs._duration_bounds) or mixes signs (jobs._mixed_signs), or NULL when it is within them or NULL; XX000 for a field with no bounds.';

-- Raise 22023 naming the field when a duration is outside its bounds (NULL passes: "the default").
-- Every check here is a plain expression: the common call, with NULL, costs no statement.
CREATE OR REPLACE FUNCTION jobs._check_duration(field text, value interval, bound text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NOT NULL THEN
        PERFORM jobs._refuse(field, jobs._duration_problem(coalesce(bound, field), value));
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_duration(text, interval, text) IS 'Private: raises 22023 naming the field if the interval is outside the bounds that jobs._duration_bounds gives for bound (default: the field).';

-- Wake idle workers: one NOTIFY on channel "jobs" per transaction, however many rows it queues.
-- Not when the transaction set pgtick.defer_wake to on: its caller notifies once it has
-- committed. PostgreSQL holds the notify queue's lock from a notifying commit's start to its
-- end, the WAL flush included, so durable transactions that notify commit one at a time
-- whatever the number of sessions; deferred, they share their flushes, and the caller's NOTIFY
-- in a transaction of its own with synchronous_commit off (SELECT set_config(
-- 'synchronous_commit', 'off', true), pg_notify('jobs', '')) holds the lock for moments.
CREATE OR REPLACE FUNCTION jobs._notify() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF current_setting('pgtick.notified', TRUE) IS DISTINCT FROM 'yes'
       AND current_setting('pgtick.defer_wake', TRUE) IS DISTINCT FROM 'on' THEN
        PERFORM pg_notify('jobs', '');
        PERFORM set_config('pgtick.notified', 'yes', TRUE);  -- transaction-local
    END IF;
END $$;
COMMENT ON FUNCTION jobs._notify() IS 'Private: NOTIFY jobs once per transaction so idle workers wake at once; not when the transaction set pgtick.defer_wake to on (its caller notifies after its commit).';

-- What a call that may have let runs start returns: whether it did, after waking idle workers if so.
CREATE OR REPLACE FUNCTION jobs._notify_if(changed boolean) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF changed THEN
        PERFORM jobs._notify();
    END IF;
    RETURN coalesce(changed, FALSE);
END $$;
COMMENT ON FUNCTION jobs._notify_if(boolean) IS 'Private: jobs._notify() when changed (a queue resumed, a limit removed, a run snoozed); returns changed (false for NULL).';

-- What a call that queued a number of runs returns: the number, after waking idle workers if it is not 0.
CREATE OR REPLACE FUNCTION jobs._notify_queued(queued integer) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF queued > 0 THEN
        PERFORM jobs._notify();
    END IF;
    RETURN queued;
END $$;
COMMENT ON FUNCTION jobs._notify_queued(integer) IS 'Private: jobs._notify() when queued > 0 (runs were queued or released); returns queued.';
