-- pgtick 0031: the live one-shot definitions, indexed by time, so that the leader's one-shot
-- phase reads only them. Without it the phase walked every live definition whose cursor had
-- passed (definitions_due_idx), which after downtime is every recurring schedule: with
-- 100,000 of them, 140-170 ms a tick that found no one-shot to start.

CREATE INDEX definitions_one_shot_due_idx ON jobs.definitions (next_run_at)
WHERE schedule IS NULL AND enabled AND finished_at IS NULL;
COMMENT ON INDEX jobs.definitions_one_shot_due_idx IS
'Live one-shot definitions by their time: jobs.materialize_one_shots reads them at every tick.';
