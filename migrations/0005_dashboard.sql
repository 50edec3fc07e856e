-- pgtick schema: what the web dashboard needs.
-- Forward-only: once released this file is never edited.

-- ===========================================================================
-- Audit log: every operator action taken through the dashboard (who, what, when)
-- ===========================================================================
CREATE TABLE jobs.audit_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor text NOT NULL CHECK (length(actor) BETWEEN 1 AND 200),
    action text NOT NULL CHECK (length(action) BETWEEN 1 AND 100),
    target text CHECK (length(target) <= 1000),
    detail jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(detail) = 'object'),
    db_user text NOT NULL DEFAULT session_user
);
COMMENT ON TABLE jobs.audit_log IS
'Operator actions taken through the web dashboard (and any client that calls jobs.audit): who, what, when.';
COMMENT ON COLUMN jobs.audit_log.id IS 'Entry id, in the order actions were recorded.';
COMMENT ON COLUMN jobs.audit_log.at IS 'When the action committed (transaction time).';
COMMENT ON COLUMN jobs.audit_log.actor IS 'Who acted, as the dashboard knows them (operator name and client address).';
COMMENT ON COLUMN jobs.audit_log.action IS 'What was done: cancel, retry, run_now, pause, resume, bulk_retry, bulk_discard, login, ...';
COMMENT ON COLUMN jobs.audit_log.target IS 'What it was done to: a run id, a definition name or a filter; NULL for none.';
COMMENT ON COLUMN jobs.audit_log.detail IS 'The outcome as JSON: the status after a cancel, the new run id of a retry, counts of a bulk action.';
COMMENT ON COLUMN jobs.audit_log.db_user IS 'The database login that recorded the entry.';

-- ===========================================================================
-- Runs: the FAILED set, for the dashboard's failed filter, bulk actions and failure streaks
-- ===========================================================================
-- Partial: touched only when a run fails, so claims and completions pay nothing for them.
-- (kind, id) also serves the unfiltered FAILED list: one equality-free scan of the FAILED set.
CREATE INDEX runs_failed_kind_idx ON jobs.runs (kind, id)
WHERE status = 'FAILED';
CREATE INDEX runs_failed_definition_idx ON jobs.runs (definition_id, id)
WHERE status = 'FAILED' AND definition_id IS NOT NULL;
