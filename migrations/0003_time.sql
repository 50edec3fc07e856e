-- ===========================================================================
-- 0003_time: DST policy per definition and the schedule controls
-- (overlap buffer_one / cancel_other, jitter, pause_after_failures, backfill).
-- ===========================================================================

ALTER TABLE jobs.definitions
ADD COLUMN dst_gap text CHECK (dst_gap IN ('shift', 'end', 'skip')),
ADD COLUMN dst_repeat text CHECK (dst_repeat IN ('first', 'second', 'both')),
ADD COLUMN jitter interval CHECK (jitter >= '0' AND jitter <= '1 day'),
ADD COLUMN pause_after_failures integer CHECK (pause_after_failures BETWEEN 1 AND 1000),
ADD COLUMN paused_reason text,
ADD COLUMN failure_streak_since timestamptz;
COMMENT ON COLUMN jobs.definitions.dst_gap IS
'A wall time that does not exist (spring forward): shift (offset before the gap, RFC 5545), end (first instant after the gap), skip. NULL = auto.';
COMMENT ON COLUMN jobs.definitions.dst_repeat IS
'A wall time that occurs twice (fall back): first, second or both. NULL = auto.';
COMMENT ON COLUMN jobs.definitions.jitter IS
'Each occurrence starts a deterministic offset in [0, jitter) later, derived from (id, occurrence); NULL = none.';
COMMENT ON COLUMN jobs.definitions.pause_after_failures IS
'That many consecutive final failures (no retry left) pause the definition; NULL = never.';
COMMENT ON COLUMN jobs.definitions.paused_reason IS
'Why the definition was paused automatically (pause_after_failures); cleared by jobs.resume().';
COMMENT ON COLUMN jobs.definitions.failure_streak_since IS
'Failures that finished before this instant do not count toward pause_after_failures (set by jobs.resume()).';

ALTER TABLE jobs.definitions DROP CONSTRAINT definitions_overlap_policy_check;
ALTER TABLE jobs.definitions ADD CONSTRAINT definitions_overlap_policy_check
CHECK (overlap_policy IN ('queue', 'skip', 'buffer_one', 'cancel_other'));
COMMENT ON COLUMN jobs.definitions.overlap_policy IS
'An occurrence that finds the definition at its cap: queue (waits), skip (CANCELLED Skipped), buffer_one (at most one waits, further ones Skipped), cancel_other (asks the running one to cancel, then waits).';

CREATE TABLE jobs.backfills (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    definition_id bigint NOT NULL REFERENCES jobs.definitions (id) ON DELETE CASCADE,
    revision integer NOT NULL,
    window_from timestamptz NOT NULL,
    window_to timestamptz NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now(),
    done_at timestamptz,
    runs_created integer,
    error text,
    CONSTRAINT backfills_window_ordered CHECK (window_from <= window_to)
);
COMMENT ON TABLE jobs.backfills IS
'Requests to materialize the occurrences of a past window once (jobs.backfill); the scheduler computes and inserts them.';
COMMENT ON COLUMN jobs.backfills.id IS 'Surrogate key.';
COMMENT ON COLUMN jobs.backfills.definition_id IS 'The definition whose occurrences are backfilled.';
COMMENT ON COLUMN jobs.backfills.revision IS 'The definition revision the window was requested for; a changed schedule voids it.';
COMMENT ON COLUMN jobs.backfills.window_from IS 'First instant of the window (inclusive).';
COMMENT ON COLUMN jobs.backfills.window_to IS 'Last instant of the window (inclusive).';
COMMENT ON COLUMN jobs.backfills.requested_at IS 'When jobs.backfill() was called.';
COMMENT ON COLUMN jobs.backfills.done_at IS 'When the occurrences were inserted (or the request voided); NULL = pending.';
COMMENT ON COLUMN jobs.backfills.runs_created IS 'Runs inserted; occurrences already present are not inserted again.';
COMMENT ON COLUMN jobs.backfills.error IS 'Why the request was voided (schedule changed, unreadable); NULL when done normally.';

CREATE INDEX backfills_pending_idx ON jobs.backfills (id) WHERE done_at IS NULL;
