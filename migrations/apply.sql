-- apply.sql (psql): apply migrations/:migration.sql (NNNN_name) unless
-- jobs.schema_migrations records NNNN, and record it in the same transaction.
-- sql/install.sql sets :migration and includes this file once per migration.
-- Each migration commits the transaction before it (the previous migration's, or the empty one
-- sql/install.sql opens after the bootstrap) and leaves its own open: the last migration
-- commits with the functions and views, so an install stopped before them (an error, Ctrl-C, a
-- lost connection) leaves that migration unrecorded, and `pgtick run` says to migrate again
-- rather than start on a complete ledger over the previous functions.
COMMIT;
BEGIN;
SELECT NOT EXISTS (
    SELECT FROM jobs.schema_migrations WHERE version = left(:'migration', 4)
) AS pgtick_pending \gset
\if :pgtick_pending
\ir :migration.sql
INSERT INTO jobs.schema_migrations (version, name) VALUES (left(:'migration', 4), substr(:'migration', 6));
\endif
