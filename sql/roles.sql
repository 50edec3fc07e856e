-- ===========================================================================
-- roles.sql: least privilege. Nothing is executable by PUBLIC. Every public
-- function is SECURITY DEFINER with search_path pinned to pg_catalog, pg_temp
-- (pg_temp last, so a caller's temporary objects can never shadow anything)
-- and every reference schema-qualified: callers need no table privileges, and
-- a hostile search_path in the caller's session changes nothing. jobs_operator is a
-- member of both jobs_reader and jobs_worker; jobs_worker is not a reader.
--   jobs_reader   : SELECT on the tables and views (the psql console)
--   jobs_worker   : claim, heartbeat, complete, complete_many, fail, acknowledge_cancel, snooze,
--                   unclaim, hand_back_unheld, next_due and its registry calls; it reads no table, except the
--                   column grants below (no payload, no result: what its calls return
--                   about the runs it claimed is all it sees of them)
--   jobs_operator : also enqueue, run_now, cancel, retry, define, pause, resume, ...,
--                   scope_worker / unscope_worker (what a worker login may claim),
--                   and the scheduler's own calls (try_lead, materialize, reap, prune)
-- ===========================================================================

-- Every object of the schema belongs to the schema's owner, whoever migrates: a schema that one
-- role installed and another (a superuser, say) upgraded would otherwise hold objects of both,
-- and the first one's SECURITY DEFINER functions could not use what the second one created
-- (jobs.enqueue stopped on a helper function a later migration made), while the second one's
-- would run with its rights. Objects created by a migrator other than the owner are given to the
-- owner here, on every install (which also mends a schema upgraded so before). The migrator is the
-- owner, a member of it or a superuser (the bootstrap comments on the schema, which only they may).
DO $owner$
DECLARE
    v_owner oid := (SELECT n.nspowner FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'jobs');
    v_object record;
BEGIN
    FOR v_object IN
        SELECT format('%s %s', CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                                               WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
                      c.oid::regclass) AS what
          FROM pg_catalog.pg_class AS c
         WHERE c.relnamespace = 'jobs'::regnamespace AND c.relowner <> v_owner
           AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
           -- a sequence that a column owns follows its table
           AND NOT (c.relkind = 'S' AND EXISTS (
                SELECT FROM pg_catalog.pg_depend AS d
                 WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objid = c.oid
                   AND d.deptype IN ('a', 'i') AND d.refclassid = 'pg_catalog.pg_class'::regclass))
        UNION ALL
        SELECT format('%s %s', CASE p.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE'
                                               ELSE 'FUNCTION' END, p.oid::regprocedure)
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'jobs'::regnamespace AND p.proowner <> v_owner
        UNION ALL
        SELECT format('%s %s', CASE t.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END, t.oid::regtype)
          FROM pg_catalog.pg_type AS t
         WHERE t.typnamespace = 'jobs'::regnamespace AND t.typowner <> v_owner
           AND t.typtype IN ('e', 'd', 'c', 'r') AND (t.typtype <> 'c' OR (
                SELECT c.relkind FROM pg_catalog.pg_class AS c WHERE c.oid = t.typrelid) = 'c')
    LOOP
        EXECUTE format('ALTER %s OWNER TO %I', v_object.what, pg_catalog.pg_get_userbyid(v_owner));
    END LOOP;
END
$owner$;

-- The grants below are the whole of what pgtick's roles hold in the schema: what an earlier
-- release granted and this one does not (a column a worker no longer reads, a call that is no
-- longer theirs) is taken back here, in the install's transaction, before granting again.
-- (A table's REVOKE takes its columns' grants with it.) Grant your own roles what you need
-- beyond these: grants to jobs_reader, jobs_worker and jobs_operator do not survive a migration.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA jobs FROM public, jobs_reader, jobs_worker, jobs_operator;
REVOKE ALL ON ALL TABLES IN SCHEMA jobs FROM jobs_reader, jobs_worker, jobs_operator;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA jobs FROM public, jobs_reader, jobs_worker, jobs_operator;

-- search_path pinned on every function, here once for all: a CREATE OR REPLACE in the files
-- above leaves it unset, so this runs on every install, in the same transaction. So is
-- standard_conforming_strings, on every function whose text holds a backslash or a U&''
-- literal: a PL/pgSQL body is parsed when a session first calls it, and with the caller's
-- setting off (a database default, say) its '\s' would read as 's' and its U&'' literals be
-- refused (the other functions read alike either way, and a setting pinned costs each call
-- its save and restore, so theirs is reset). A function with a SQL-standard body
-- (jobs._owned) is left as it is: its body was parsed when it was created, so no setting
-- reaches it, and pinning one would stop the planner inlining it.
DO $$
DECLARE
    v_function regprocedure;
    v_literals boolean;
    v_pinned boolean;
    v_strings boolean;
BEGIN
    FOR v_function, v_literals, v_pinned, v_strings IN
        SELECT p.oid::regprocedure,
               strpos(p.prosrc, chr(92)) > 0 OR strpos(p.prosrc, 'U&''') > 0,
               'search_path=pg_catalog, pg_temp' = ANY (coalesce(p.proconfig, '{}')),
               'standard_conforming_strings=on' = ANY (coalesce(p.proconfig, '{}'))
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'jobs'::regnamespace
           AND p.prokind IN ('f', 'p')
           AND p.prosqlbody IS NULL
    LOOP
        IF NOT v_pinned THEN
            EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', v_function);
        END IF;
        IF v_literals AND NOT v_strings THEN
            EXECUTE format('ALTER FUNCTION %s SET standard_conforming_strings = on', v_function);
        ELSIF v_strings AND NOT v_literals THEN
            EXECUTE format('ALTER FUNCTION %s RESET standard_conforming_strings', v_function);
        END IF;
    END LOOP;
END $$;
REVOKE ALL ON ALL TABLES IN SCHEMA jobs FROM public;

-- Schemas installed before workers lost their reader rights: take them back.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_auth_members AS m
                WHERE m.roleid = 'jobs_reader'::regrole AND m.member = 'jobs_worker'::regrole) THEN
        REVOKE jobs_reader FROM jobs_worker;
    END IF;
END $$;
GRANT jobs_reader TO jobs_operator;
GRANT jobs_worker TO jobs_operator;

GRANT USAGE ON SCHEMA jobs TO jobs_reader, jobs_worker;
GRANT SELECT ON ALL TABLES IN SCHEMA jobs TO jobs_reader;
GRANT USAGE ON TYPE jobs.run_status TO jobs_reader;

GRANT EXECUTE ON FUNCTION
jobs.claim(integer, text, text[], boolean, text[], text),
jobs.heartbeat(bigint[], text, text),
jobs.hand_back_unheld(bigint[], text, text),
jobs.complete(bigint, text, jsonb, text),
jobs.complete_many(bigint[], text, text),
jobs.fail(bigint, text, text[], text, text, text),
jobs.acknowledge_cancel(bigint, text, text, text),
jobs.next_due(text[], text[]),
jobs.snooze(bigint, text, interval, text),
jobs.unclaim(bigint[], text, text),
jobs.register_worker(text, text[], text, integer, text[]),
jobs.worker_seen(text),
jobs.worker_stopped(text)
TO jobs_worker;

-- What the Python worker reads besides its calls: the default heartbeat timeout, of
-- definitions their names (for its log lines) and whether they are capped, and the tight
-- limits (the last two to bound its claims in flight); which queues and kinds have a limit at
-- all (while it holds runs under one, a finished run's slot is claimed for at once).
GRANT SELECT (heartbeat_timeout) ON jobs.config TO jobs_worker;
GRANT SELECT (id, name, max_concurrent_runs) ON jobs.definitions TO jobs_worker;
GRANT SELECT ON jobs.tight_limits TO jobs_worker;
GRANT SELECT (scope, name) ON jobs.limits TO jobs_worker;

-- The console's read-only calls (sql/console.sql).
GRANT EXECUTE ON FUNCTION
jobs.get_run(bigint),
jobs.run_detail(bigint),
jobs.prune_count(interval),
jobs.compact_interval(interval),
jobs.describe_catch_up(jobs.catch_ups)
TO jobs_reader;

GRANT EXECUTE ON FUNCTION
jobs.enqueue(
    text, jsonb, timestamptz, integer, text, integer, interval, interval,
    text, text, text, text, interval, text, bigint[]
),
jobs.enqueue_many(text, jsonb, timestamptz, integer, text, text, integer, interval, interval, bigint[]),
jobs.pause_queue(text),
jobs.resume_queue(text),
jobs.set_limit(text, text, integer, integer, interval, boolean),
jobs.remove_limit(text, text),
jobs.run_now(text, jsonb),
jobs.cancel(bigint),
jobs.cancel_queued(text),
jobs.retry(bigint),
jobs.set_retry_policy(
    text, text[], text[], integer, interval, double precision, interval, double precision
),
jobs.define(
    text, text, text, text, timestamptz, jsonb, boolean, integer, integer, integer, text, text,
    interval, interval, text, text, interval, integer, text, text
),
jobs.backfill(text, timestamptz, timestamptz),
jobs.finish_backfill(bigint, timestamptz[], text),
jobs.pause(text),
jobs.resume(text),
jobs.undefine(text),
jobs.new_definitions(integer),
jobs.due_definitions(timestamptz, integer),
jobs.materialize(bigint, timestamptz, timestamptz[], timestamptz, integer),
jobs.materialize_one_shots(interval, interval),
jobs.materialize_many(bigint[], timestamptz[], timestamptz[], integer[], bigint[], timestamptz[]),
jobs.define_many(jsonb),
jobs.mark_schedule_error(bigint, integer, text),
jobs.reap(),
jobs.reap_worker(text, text),
jobs.prune(interval, integer),
jobs.prune_registry(interval),
jobs.archive(integer),
jobs.try_lead(text),
jobs.resign(),
jobs.acquire_lease(text, text, interval),
jobs.renew_lease(text, text, interval),
jobs.release_lease(text, text),
jobs.audit(text, text, text, jsonb),
jobs.retry_many(bigint[]),
jobs.discard(bigint[]),
jobs.record_catch_up(bigint, text, timestamptz, timestamptz, integer, integer, timestamptz),
jobs.undefine_detail(text),
jobs.scope_worker(name, text[], text[]),
jobs.unscope_worker(name)
TO jobs_operator;

GRANT UPDATE ON jobs.config TO jobs_operator;

-- Pure functions the views and previews use (jobs.definition_health calls jobs._dst_auto).
GRANT EXECUTE ON FUNCTION
jobs._dst_auto(text),
jobs.jitter_offset(bigint, timestamptz, interval)
TO jobs_reader;

GRANT EXECUTE ON FUNCTION jobs.version() TO jobs_reader;
