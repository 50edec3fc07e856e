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
