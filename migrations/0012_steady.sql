-- pgtick 0012: the index of runs waiting on dependencies keeps no pending list.
-- A failure cascade probes runs_blocked_deps_idx once per run it cancels (and a completion once
-- per call). With GIN's fast update, every entry inserted since the last vacuum sits in an
-- unordered pending list that each probe reads whole: after a burst of dependent enqueues a
-- cascade over thousands of runs took minutes. Rebuilt without it, inserts go straight into
-- the index (it holds the blocked runs only: a small, quick rebuild).
DROP INDEX jobs.runs_blocked_deps_idx;
CREATE INDEX runs_blocked_deps_idx ON jobs.runs USING gin (depends_on) WITH (fastupdate = off)
WHERE blocked;
COMMENT ON INDEX jobs.runs_blocked_deps_idx IS
'The blocked runs by the runs they wait on (depends_on): release on completion, cascade on failure. No fast update: a probe never reads a pending list.';
