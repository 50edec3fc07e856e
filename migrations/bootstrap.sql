-- bootstrap.sql: the jobs schema and the migration ledger, created when missing.
-- Loaded by sql/install.sql under the migration lock, before any migration; safe to re-run.
-- A database in another encoding than UTF8 is refused before anything is done: the functions
-- spell characters that most encodings lack (the spaces and invisible characters a name may
-- not hold), so their install would fail after the migrations had been applied; and in
-- SQL_ASCII, names and payloads would be bytes that no one checks or converts.
DO $encoding$
BEGIN
    IF pg_catalog.getdatabaseencoding() <> 'UTF8' THEN
        RAISE EXCEPTION 'the database encoding is %: pgtick needs a UTF8 database; nothing was installed',
            pg_catalog.getdatabaseencoding()
            USING ERRCODE = '55000',
                  HINT = 'Install into a database created with ENCODING ''UTF8'' (TEMPLATE template0).';
    END IF;
END
$encoding$;
-- A login that may not install says so first, in one line with whom to install as, rather
-- than PostgreSQL's word on the first statement it may not run (a role's admin option, a
-- schema's permission): on a database without the schema, CREATE on the database is needed;
-- on one with it, the rights of the schema's owner (its tables are altered, its functions
-- replaced). A superuser has both.
DO $rights$
DECLARE
    v_owner text;
BEGIN
    IF to_regnamespace('jobs') IS NULL THEN
        IF NOT pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE') THEN
            RAISE EXCEPTION 'role % may not create the schema jobs in database %: nothing was installed',
                current_user, pg_catalog.current_database()
                USING ERRCODE = '42501',
                      HINT = format('Migrate as the database owner or a superuser, or GRANT CREATE ON DATABASE %I TO %I.',
                                    pg_catalog.current_database(), current_user);
        END IF;
    ELSE
        SELECT r.rolname INTO v_owner
          FROM pg_catalog.pg_namespace AS n JOIN pg_catalog.pg_roles AS r ON r.oid = n.nspowner
         WHERE n.nspname = 'jobs';
        IF NOT pg_catalog.pg_has_role(v_owner, 'USAGE') THEN
            RAISE EXCEPTION 'role % may not migrate the schema jobs, which belongs to role %: nothing was changed',
                current_user, v_owner
                USING ERRCODE = '42501',
                      HINT = format('Migrate as %s (or a member of it) or a superuser.', v_owner);
        END IF;
    END IF;
END
$rights$;
-- A jobs schema that holds objects but no migration ledger is someone else's: installing over
-- it would take its objects over (pin their search_path, revoke and grant on them). So is one
-- whose schema_migrations is another tool's ledger (no text columns version and name).
-- Refused; an empty one (made by a DBA for the install) is used.
DO $foreign$
BEGIN
    IF to_regnamespace('jobs') IS NOT NULL AND to_regclass('jobs.schema_migrations') IS NULL
       AND (EXISTS (SELECT FROM pg_catalog.pg_class AS c WHERE c.relnamespace = to_regnamespace('jobs'))
            OR EXISTS (SELECT FROM pg_catalog.pg_proc AS p WHERE p.pronamespace = to_regnamespace('jobs'))
            OR EXISTS (SELECT FROM pg_catalog.pg_type AS t WHERE t.typnamespace = to_regnamespace('jobs'))) THEN
        RAISE EXCEPTION 'schema jobs already holds objects that are not pgtick''s: nothing was installed'
            USING ERRCODE = '42P06',
                  HINT = 'pgtick owns the schema jobs: install it in a database without one, or rename that schema first.';
    END IF;
    IF to_regclass('jobs.schema_migrations') IS NOT NULL
       AND (SELECT count(*) FROM pg_catalog.pg_attribute AS a
             WHERE a.attrelid = to_regclass('jobs.schema_migrations') AND NOT a.attisdropped
               AND a.attname IN ('version', 'name') AND a.atttypid = 'pg_catalog.text'::pg_catalog.regtype) <> 2 THEN
        RAISE EXCEPTION 'schema jobs already holds a table schema_migrations that is not pgtick''s ledger: nothing was installed'
            USING ERRCODE = '42P06',
                  HINT = 'pgtick owns the schema jobs: install it in a database without one, or rename that schema first.';
    END IF;
END
$foreign$;
-- The roles the schema grants to, when they exist already. They are the server's, so another
-- database's pgtick may have made them, or someone else may have, before this install: every
-- login granted one gets what pgtick grants it, and whatever else the role carries. A role
-- with an attribute that no pgtick role may have (SUPERUSER, CREATEROLE, CREATEDB,
-- REPLICATION, BYPASSRLS) is refused here, before anything is changed, on every migrate: a
-- worker login would hold it too. So is a member of a role with one (or of
-- pg_execute_server_program, pg_read_server_files, pg_write_server_files): a worker login could
-- SET ROLE to it. A role that pgtick did not make (its comment does not start
-- with 'pgtick:') and that this database has not been installed with yet is used, with a
-- WARNING that names it and says whether it can log in, what it is a member of and who its
-- members are; then it is commented as pgtick's (below), so the warning is given once.
DO $existing$
DECLARE
    v_role record;
    v_attribute text;
    v_said text[];
    v_names text;
    v_via text;
BEGIN
    FOR v_role IN
        SELECT r.oid, r.rolname, r.rolcanlogin,
               CASE WHEN r.rolsuper THEN 'SUPERUSER' WHEN r.rolcreaterole THEN 'CREATEROLE'
                    WHEN r.rolcreatedb THEN 'CREATEDB' WHEN r.rolreplication THEN 'REPLICATION'
                    WHEN r.rolbypassrls THEN 'BYPASSRLS' END AS attribute,
               coalesce(pg_catalog.shobj_description(r.oid, 'pg_authid'), '') LIKE 'pgtick:%' AS ours
          FROM pg_catalog.pg_roles AS r
         WHERE r.rolname IN ('jobs_reader', 'jobs_worker', 'jobs_operator')
         ORDER BY r.rolname
    LOOP
        v_attribute := v_role.attribute;
        IF v_attribute IS NOT NULL THEN
            RAISE EXCEPTION 'role % already exists with %: pgtick will not grant to it; nothing was installed',
                v_role.rolname, v_attribute
                USING ERRCODE = '55000',
                      HINT = format('Every login granted %s would hold %s too. Remove it (ALTER ROLE %s NO%s), '
                                    'or drop that role, then migrate again.',
                                    v_role.rolname, v_attribute, v_role.rolname, v_attribute);
        END IF;
        -- A member of a role that has such an attribute, or of a role that reads and writes the
        -- server's files or runs its programs, hands it on just as well: every login granted
        -- the pgtick role may SET ROLE to it.
        WITH RECURSIVE up (oid, via) AS (
            SELECT m.roleid, m.roleid FROM pg_catalog.pg_auth_members AS m
             WHERE m.member = v_role.oid
            UNION
            SELECT m.roleid, up.via FROM pg_catalog.pg_auth_members AS m JOIN up ON m.member = up.oid
        )
        SELECT g.rolname, v.rolname,
               CASE WHEN g.rolsuper THEN 'SUPERUSER' WHEN g.rolcreaterole THEN 'CREATEROLE'
                    WHEN g.rolcreatedb THEN 'CREATEDB' WHEN g.rolreplication THEN 'REPLICATION'
                    WHEN g.rolbypassrls THEN 'BYPASSRLS' ELSE 'the rights of ' || g.rolname END
          INTO v_names, v_via, v_attribute
          FROM up
          JOIN pg_catalog.pg_roles AS g ON g.oid = up.oid
          JOIN pg_catalog.pg_roles AS v ON v.oid = up.via
         -- Through another pgtick role it is that role's to report (checked in its turn).
         WHERE v.rolname NOT IN ('jobs_reader', 'jobs_worker', 'jobs_operator')
           AND (g.rolsuper OR g.rolcreaterole OR g.rolcreatedb OR g.rolreplication OR g.rolbypassrls
                OR g.rolname IN ('pg_execute_server_program', 'pg_read_server_files', 'pg_write_server_files'))
         ORDER BY g.rolname, v.rolname
         LIMIT 1;
        IF v_names IS NOT NULL THEN
            RAISE EXCEPTION 'role % already exists as a member of %, which has %: pgtick will not grant to it; nothing was installed',
                v_role.rolname,
                v_names || CASE WHEN v_via <> v_names THEN format(' (through %s)', v_via) ELSE '' END,
                v_attribute
                USING ERRCODE = '55000',
                      HINT = format('Every login granted %s could SET ROLE %s. Revoke it (REVOKE %s FROM %s), '
                                    'or drop that role, then migrate again.',
                                    v_role.rolname, v_names, v_via, v_role.rolname);
        END IF;
        CONTINUE WHEN v_role.ours OR to_regclass('jobs.schema_migrations') IS NOT NULL;
        v_said := '{}';
        IF v_role.rolcanlogin THEN
            v_said := v_said || 'it can log in'::text;
        END IF;
        SELECT string_agg(g.rolname, ', ' ORDER BY g.rolname) INTO v_names
          FROM pg_catalog.pg_auth_members AS m JOIN pg_catalog.pg_roles AS g ON g.oid = m.roleid
         WHERE m.member = v_role.oid
           AND NOT (v_role.rolname = 'jobs_operator' AND g.rolname IN ('jobs_reader', 'jobs_worker'));
        IF v_names IS NOT NULL THEN
            v_said := v_said || ('it is a member of ' || v_names);
        END IF;
        SELECT string_agg(u.rolname, ', ' ORDER BY u.rolname) INTO v_names
          FROM pg_catalog.pg_auth_members AS m JOIN pg_catalog.pg_roles AS u ON u.oid = m.member
         WHERE m.roleid = v_role.oid
           AND NOT (u.rolname = 'jobs_operator' AND v_role.rolname IN ('jobs_reader', 'jobs_worker'));
        IF v_names IS NOT NULL THEN
            v_said := v_said || ('its members: ' || v_names);
        END IF;
        RAISE WARNING 'role % already existed and pgtick did not create it: using it%',
            v_role.rolname,
            CASE WHEN cardinality(v_said) > 0 THEN ' (' || array_to_string(v_said, '; ') || ')' ELSE '' END
            USING HINT = format('Every login granted %s gets pgtick''s %s rights: check who holds it (\du %s).',
                                v_role.rolname, substr(v_role.rolname, 6), v_role.rolname);
    END LOOP;
END
$existing$;
-- The roles the schema grants to, created when missing. They belong to the server while the
-- migration lock is per database: the migrator of another database may be creating one at
-- this moment, and then this CREATE ROLE waits for it and fails on the role's name (or finds
-- it created just before). Either way the role is there, which is all that is needed; the
-- migrations that create roles when missing (0001) then find them.
DO $roles$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['jobs_reader', 'jobs_worker', 'jobs_operator'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN unique_violation OR duplicate_object THEN
                NULL;   -- created meanwhile by the migrator of another database
            END;
        END IF;
    END LOOP;
END
$roles$;
-- Each role commented as pgtick's, once: the mark that tells the next install (of this or
-- another database) that pgtick made it or has already said it uses it. An installer that may
-- not comment on a role (PostgreSQL 15: CREATEROLE; 16: ADMIN OPTION on it) leaves it unmarked.
DO $marks$
DECLARE
    v_role record;
BEGIN
    FOR v_role IN
        SELECT r.rolname,
               CASE r.rolname
                   WHEN 'jobs_reader' THEN 'pgtick: reads the jobs schema (the console, the dashboard).'
                   WHEN 'jobs_worker' THEN 'pgtick: a worker''s calls (claim, heartbeat, complete, fail); reads no run.'
                   ELSE 'pgtick: operates the scheduler (enqueue, define, cancel); holds the other two.'
               END AS description
          FROM pg_catalog.pg_roles AS r
         WHERE r.rolname IN ('jobs_reader', 'jobs_worker', 'jobs_operator')
           AND coalesce(pg_catalog.shobj_description(r.oid, 'pg_authid'), '') NOT LIKE 'pgtick:%'
         ORDER BY r.rolname
    LOOP
        BEGIN
            EXECUTE format('COMMENT ON ROLE %I IS %L', v_role.rolname, v_role.description);
        EXCEPTION WHEN insufficient_privilege OR unique_violation THEN
            NULL;   -- not allowed to, or commented meanwhile by the migrator of another database
        END;
    END LOOP;
END
$marks$;
-- The role grants the install ends with (sql/roles.sql), made first: an installer that may not
-- make them (PostgreSQL 16: ADMIN OPTION on the roles, which their creator has; 15: CREATEROLE)
-- stops here, before the schema or any migration is applied.
GRANT jobs_reader TO jobs_operator;
GRANT jobs_worker TO jobs_operator;

CREATE SCHEMA IF NOT EXISTS jobs;
COMMENT ON SCHEMA jobs IS 'pgtick: a job scheduler inside PostgreSQL.';
CREATE TABLE IF NOT EXISTS jobs.schema_migrations (
    version text PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE jobs.schema_migrations IS 'Applied pgtick migrations, one row each.';
COMMENT ON COLUMN jobs.schema_migrations.version IS 'Migration number, e.g. 0001.';
COMMENT ON COLUMN jobs.schema_migrations.name IS 'Migration file name without number and suffix.';
COMMENT ON COLUMN jobs.schema_migrations.applied_at IS 'When it was applied.';
