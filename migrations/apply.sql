-- apply.sql (psql): apply migrations/:migration.sql (NNNN_name) unless
-- jobs.schema_migrations records NNNN, and record it in the same transaction.
-- sql/install.sql sets :migration and includes this file once per migration.
BEGIN;
SELECT NOT EXISTS (
    SELECT FROM jobs.schema_migrations WHERE version = left(:'migration', 4)
) AS pgtick_pending \gset
\if :pgtick_pending
\ir :migration.sql
INSERT INTO jobs.schema_migrations (version, name) VALUES (left(:'migration', 4), substr(:'migration', 6));
\endif
COMMIT;
