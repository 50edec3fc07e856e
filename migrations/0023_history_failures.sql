-- pgtick 0023: the failures in history, indexed as jobs.runs indexes its own.
-- The dashboard lists, counts and retries the FAILED runs of a kind across jobs.runs and
-- jobs.run_history, newest first. jobs.runs answers that from runs_failed_kind_idx; history,
-- without one, was read day by day through its id index until a page of matches was found,
-- every day of it for a kind with no failures. Partial: only failed runs are in them, so an
-- archive writes an entry for a failure alone.

CREATE INDEX run_history_failed_idx ON jobs.run_history (id) WHERE status = 'FAILED';
COMMENT ON INDEX jobs.run_history_failed_idx IS
'The FAILED runs in history by id: the dashboard''s failure lists and counts.';

CREATE INDEX run_history_failed_kind_idx ON jobs.run_history (kind, id) WHERE status = 'FAILED';
COMMENT ON INDEX jobs.run_history_failed_kind_idx IS
'The FAILED runs in history by kind and id: the failures of one kind, newest first.';
