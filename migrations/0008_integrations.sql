-- pgtick 0008: what integrations need from the schema.
-- * jobs.schema_migrations.package_version: which pgtick release applied each migration
--   (read through jobs.version()).
-- * jobs.runs.trace_context: the W3C trace context of the code that enqueued a run, so a
--   trace runs from the request that enqueued to the job that ran. Set by the enqueuing
--   transaction with set_config('pgtick.trace_context', '<json>', true) before it calls
--   jobs.enqueue / enqueue_many / run_now; a retry row inherits its previous attempt's.

ALTER TABLE jobs.schema_migrations ADD COLUMN package_version text;
COMMENT ON COLUMN jobs.schema_migrations.package_version IS
'pgtick version whose `pgtick migrate` (or `pgtick migrate --sql` script) applied it; NULL when applied by psql from sql/install.sql.';

ALTER TABLE jobs.runs
ADD COLUMN trace_context jsonb DEFAULT nullif(current_setting('pgtick.trace_context', TRUE), '')::jsonb;
COMMENT ON COLUMN jobs.runs.trace_context IS
'W3C trace context (traceparent, tracestate) of the code that enqueued the run; taken from the transaction setting pgtick.trace_context; a retry inherits it.';

-- Private: a retry row carries the trace context of the attempt it retries.
CREATE OR REPLACE FUNCTION jobs._inherit_trace_context()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    SELECT r.trace_context INTO NEW.trace_context FROM jobs.runs AS r WHERE r.id = NEW.retry_of;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION jobs._inherit_trace_context() FROM public;
COMMENT ON FUNCTION jobs._inherit_trace_context() IS
'Private trigger: a retry row (retry_of set, no trace context of its own) copies its previous attempt''s trace_context.';

CREATE TRIGGER runs_inherit_trace_context
BEFORE INSERT ON jobs.runs
FOR EACH ROW WHEN (new.retry_of IS NOT NULL AND new.trace_context IS NULL)
EXECUTE FUNCTION jobs._inherit_trace_context();
