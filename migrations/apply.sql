-- apply.sql (psql): apply migrations/:migration.sql (NNNN_name) unless
-- jobs.schema_migrations records NNNN, and record it.
-- sql/install.sql sets :migration and includes this file once per migration, all in the one
-- transaction of the install: no migration commits on its own, so an install stopped anywhere
-- (an error, Ctrl-C, a lost connection) leaves none of them applied or recorded.
SELECT NOT EXISTS (
    SELECT FROM jobs.schema_migrations WHERE version = left(:'migration', 4)
) AS pgtick_pending \gset
\if :pgtick_pending
\ir :migration.sql
INSERT INTO jobs.schema_migrations (version, name) VALUES (left(:'migration', 4), substr(:'migration', 6));
\endif
