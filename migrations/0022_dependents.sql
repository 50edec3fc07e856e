-- pgtick 0022: the runs that name dependencies, found by what they name, also once they ran.
-- The index of jobs.runs over depends_on held the blocked runs only: what a completion
-- releases and a failure cancels. Which runs waited on a given run, after they were released
-- or moved to history (a run's page lists them), was then a read of every run. It now holds
-- every run that names dependencies (few: depends_on is NULL for the others, so no other run
-- writes it), and history has its own. The probes of release and cascade test blocked on the
-- rows the index returns.

DROP INDEX jobs.runs_blocked_deps_idx;
CREATE INDEX runs_depends_on_idx ON jobs.runs USING gin (depends_on) WITH (fastupdate = off)
WHERE depends_on IS NOT NULL;
COMMENT ON INDEX jobs.runs_depends_on_idx IS
'The runs that name dependencies, by the runs they name (depends_on): release on completion, cascade on failure, and what waited on a run. No fast update: a probe never reads a pending list.';

CREATE INDEX run_history_depends_on_idx ON jobs.run_history USING gin (depends_on)
WHERE depends_on IS NOT NULL;
COMMENT ON INDEX jobs.run_history_depends_on_idx IS
'The moved runs that named dependencies, by the runs they named: what waited on a run, after it moved.';
