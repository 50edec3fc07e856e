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
