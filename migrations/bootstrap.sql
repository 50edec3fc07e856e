-- bootstrap.sql: the jobs schema and the migration ledger, created when missing.
-- Loaded by sql/install.sql under the migration lock, before any migration; safe to re-run.
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
