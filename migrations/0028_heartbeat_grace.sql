-- pgtick 0028: a lowered jobs.config.heartbeat_timeout does not take live runs.
-- A worker learns the setting at its next beat, which it still sends at the cadence the
-- previous, longer timeout asked for; a reaper that applied the shorter timeout at once failed
-- runs whose workers were alive. The config row now remembers the timeout in force before it
-- was lowered, and since when: the reaper keeps that longer timeout for one of its own
-- lengths after the change, by which time every live worker has beaten and taken the new one.
ALTER TABLE jobs.config
ADD COLUMN heartbeat_timeout_lowered_from interval,
ADD COLUMN heartbeat_timeout_lowered_at timestamptz;
COMMENT ON COLUMN jobs.config.heartbeat_timeout_lowered_from IS
'Kept by pgtick (a trigger): the heartbeat timeout in force before heartbeat_timeout was last lowered; the reaper keeps it until heartbeat_timeout_lowered_at + this.';
COMMENT ON COLUMN jobs.config.heartbeat_timeout_lowered_at IS
'Kept by pgtick (a trigger): when heartbeat_timeout was last lowered.';
