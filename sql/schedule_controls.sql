-- ===========================================================================
-- schedule_controls.sql: what a definition's schedule controls do beyond
-- materialization: the DST policy auto picks, overlap_policy buffer_one and
-- cancel_other (applied by jobs.claim), pause_after_failures (a deferred
-- trigger on every final failure) and jobs.backfill for past windows.
-- Occurrences themselves are computed by the driver (pgtick.schedule).
-- ===========================================================================

-- ===========================================================================
-- Jitter and the run insert shared by jobs.materialize and jobs.finish_backfill.
-- ===========================================================================

-- Private: the error of jobs.jitter_offset for a jitter over a day (a SQL function cannot raise).
-- Not IMMUTABLE: the planner would call such a function on a constant argument ahead of time,
-- in a CASE branch that is never taken too.
CREATE OR REPLACE FUNCTION jobs._jitter_refused(jitter interval) RETURNS interval
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RAISE EXCEPTION 'jitter must be between 0 and 1 day, got %', jitter USING ERRCODE = '22023';
END $$;
COMMENT ON FUNCTION jobs._jitter_refused(interval) IS 'Private: raises 22023 naming jitter (more than a day), for jobs.jitter_offset.';

-- The delay of one occurrence: a deterministic offset in [0, jitter) from (definition, occurrence),
-- so every leader computes the same start.
CREATE OR REPLACE FUNCTION jobs.jitter_offset(definition_id bigint, occurrence timestamptz, jitter interval)
RETURNS interval
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT CASE
        WHEN jitter IS NULL OR jitter <= interval '0' THEN interval '0'
        -- A definition's jitter is at most a day (jobs.define); a longer one is refused here
        -- rather than computed past the range of an interval's microseconds.
        WHEN jitter > interval '1 day' THEN jobs._jitter_refused(jitter)
        -- 52 bits of the hash as a fraction in [0, 1) of the jitter, in whole seconds
        -- (microseconds for a jitter under a second): shown and compared as written.
        ELSE make_interval(secs => floor(
            ((hashtextextended(definition_id::text || '@' || extract(epoch FROM occurrence)::text, 0) >> 12)
             & 4503599627370495)::float8 / 4503599627370496.0
            * (extract(epoch FROM jitter) * CASE WHEN jitter >= interval '1 second' THEN 1 ELSE 1000000 END)::float8
        ) / CASE WHEN jitter >= interval '1 second' THEN 1 ELSE 1000000 END)
    END
$$;
COMMENT ON FUNCTION jobs.jitter_offset(bigint, timestamptz, interval) IS 'How much later than its occurrence a run of this definition starts: deterministic in [0, jitter) from (definition_id, occurrence), in whole seconds when jitter is a second or more. 22023 for a jitter over a day (a definition''s bound).';

-- Private: whether a scheduled run is still the new occurrence the scheduler made, due at its
-- occurrence delayed by its definition's jitter. Only such a run is what an overlap policy is
-- about (skip, buffer_one and cancel_other act for a new occurrence that comes due while the
-- definition is busy) and what a coalescing catch-up supersedes. A run that began and asked to
-- run later (jobs.snooze moves it to now() + delay) is not one any more, nor is a retry or a
-- manual run: they wait for room. A run given back unstarted (jobs.unclaim,
-- jobs.hand_back_unheld) keeps its time and is new still: it never began. A run materialized
-- before runs recorded their occurrence (occurrence_at NULL) counts as new, and one made under
-- an earlier jitter (its occurrence before the change took over) as begun: it waits.
CREATE OR REPLACE FUNCTION jobs._new_occurrence(
    origin text, definition_id bigint, occurrence_at timestamptz, scheduled_for timestamptz, jitter interval
)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT origin = 'schedule'
           AND (occurrence_at IS NULL
                OR scheduled_for = occurrence_at + jobs.jitter_offset(definition_id, occurrence_at, jitter))
$$;
COMMENT ON FUNCTION jobs._new_occurrence(text, bigint, timestamptz, timestamptz, interval) IS 'Private: whether a run (origin, definition, occurrence_at, scheduled_for; jitter: its definition''s) is a scheduled occurrence still due when the scheduler made it for, never snoozed: the only runs overlap_policy skip and buffer_one skip, cancel_other acts for and a coalescing catch-up supersedes.';

-- Private: whether the run of a definition's past occurrence has moved to history. jobs.runs
-- keeps each occurrence single by its occurrence index; history, which that index does not
-- cover, is looked up here: a window backfilled ahead of a cursor that stayed behind (the
-- scheduler was down), run and archived before the scheduler came back, is not made again.
-- Only past occurrences are looked up (a run archives at least an hour after it finished, and
-- an occurrence is materialized at most the lookahead ahead), and only the days of history
-- from the day before the occurrence on (a run finishes after its occurrence, or within the
-- lookahead before it when cancelled while it waited), so the lookup is one probe of
-- run_history_occurrence_idx per such day and the scheduler's usual runs, materialized ahead
-- of their occurrence, make none. The lookup reads the statement's snapshot, so an insert of
-- past occurrences first takes jobs._hold_history_moves (below): no move can commit between
-- that snapshot and the insert.
CREATE OR REPLACE FUNCTION jobs._archived_occurrence(definition_id bigint, occurrence timestamptz)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT occurrence < now() AND EXISTS (
        SELECT FROM jobs.run_history AS h
         WHERE h.definition_id = _archived_occurrence.definition_id
           AND h.origin = 'schedule'
           AND coalesce(h.occurrence_at, h.scheduled_for) = _archived_occurrence.occurrence
           AND h.finished_at >= _archived_occurrence.occurrence - interval '1 day'
    )
$$;
COMMENT ON FUNCTION jobs._archived_occurrence(bigint, timestamptz) IS 'Private: whether a past occurrence of the definition has its scheduled run in jobs.run_history (materialized once: not again).';

-- Private, called before a statement that inserts runs of these occurrences, where one of them is
-- past (the only ones jobs._archived_occurrence looks up): wait for every move of runs to history
-- in progress (jobs.archive holds ROW EXCLUSIVE on jobs.run_history until it commits) and keep
-- new ones off until this transaction commits. Without it, a move committing after the insert's
-- snapshot was taken and before its conflict check would slip between the two: the occurrence
-- index no longer holds the moved run, and the lookup does not see it in history yet. The
-- insert must take its snapshot after this (READ COMMITTED: its own statement), as the
-- scheduler's do. Moves wait for the insert's commit; inserts of occurrences still ahead, the
-- scheduler's usual ones, take no lock.
CREATE OR REPLACE FUNCTION jobs._hold_history_moves(occurrences timestamptz[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF EXISTS (SELECT FROM unnest(occurrences) AS t (at) WHERE t.at < now()) THEN
        LOCK TABLE ONLY jobs.run_history IN SHARE MODE;
    END IF;
END $$;
COMMENT ON FUNCTION jobs._hold_history_moves(timestamptz[]) IS 'Private: where one of these occurrences is past, wait for the moves of runs to history in progress and hold new ones off until commit (SHARE lock on jobs.run_history), so an insert of them after this sees every run that moved.';

-- Private: insert one scheduled run per occurrence (delayed by the definition's jitter); returns how many.
-- The occurrence index makes an occurrence that already has its run a no-op, and one whose run
-- has moved to history is left out.
CREATE OR REPLACE FUNCTION jobs._insert_occurrences(def jobs.definitions, run_times timestamptz[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_count integer;
BEGIN
    PERFORM jobs._hold_history_moves(run_times);
    INSERT INTO jobs.runs (
        definition_id, kind, payload, priority, max_attempts, timeout, heartbeat_timeout,
        origin, queue, concurrency_key, scheduled_for, occurrence_at
    )
    SELECT def.id, def.kind, def.payload, def.priority, def.max_attempts, def.timeout,
           def.heartbeat_timeout, 'schedule', def.queue, def.concurrency_key,
           t + jobs.jitter_offset(def.id, t, def.jitter), t
      FROM unnest(run_times) AS t
     WHERE NOT jobs._archived_occurrence(def.id, t)
    ON CONFLICT (definition_id, (coalesce(occurrence_at, scheduled_for))) WHERE origin = 'schedule' DO NOTHING;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END $$;
COMMENT ON FUNCTION jobs._insert_occurrences(jobs.definitions, timestamptz[]) IS 'Private: insert a QUEUED scheduled run per occurrence, delayed by jobs.jitter_offset; occurrences already present are skipped. Returns runs inserted.';

-- ===========================================================================
-- DST policy: what auto picks (the driver's zones.auto_policy says the same).
-- ===========================================================================

-- Private: {dst_gap, dst_repeat} that auto picks for a schedule text; NULL for a one-shot.
CREATE OR REPLACE FUNCTION jobs._dst_auto(schedule text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN schedule IS NULL THEN NULL
        -- interval-like cron (minute or hour field starts with *) and sub-daily RRULE: real time
        WHEN schedule ~* '^\s*@hourly\s*$' THEN ARRAY['skip', 'both']
        WHEN schedule ~* '^\s*@' THEN ARRAY['end', 'first']
        WHEN schedule !~ '[=:]' AND schedule ~ '^\s*(\*|\S+\s+\*)' THEN ARRAY['skip', 'both']
        WHEN schedule !~ '[=:]' THEN ARRAY['end', 'first']
        WHEN schedule ~* '(^|[\s:;])FREQ\s*=\s*(HOURLY|MINUTELY|SECONDLY)' THEN ARRAY['skip', 'both']
        ELSE ARRAY['shift', 'first']
    END
$$;
COMMENT ON FUNCTION jobs._dst_auto(text) IS 'Private: the DST policy auto picks, {dst_gap, dst_repeat}: interval-like cron and sub-daily RRULE skip/both, other cron end/first, other RRULE shift/first.';

-- ===========================================================================
-- Overlap: buffer_one and cancel_other, applied by jobs.claim under its dispatch locks.
-- ===========================================================================

-- Private, called by jobs.claim after it picked, while it holds the dispatch locks of room_defs
-- (room_free = free slots counted under them): for buffer_one definitions every due new
-- occurrence (jobs._new_occurrence) beyond the one that may wait is CANCELLED Skipped; for
-- cancel_other definitions at their cap, the running runs older than a waiting new occurrence
-- are asked to cancel. A run snoozed since it began, a retry or a manual run just waits. Rows locked
-- by someone else are left for the next claim (SKIP LOCKED): it never waits.
CREATE OR REPLACE FUNCTION jobs._apply_overlap(room_defs bigint[], room_free integer[], picked bigint[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_defs bigint[];
    v_skipped bigint[];
BEGIN
    SELECT array_agg(d.id) INTO v_defs
      FROM jobs.definitions AS d
     WHERE d.id = ANY (room_defs) AND d.overlap_policy IN ('buffer_one', 'cancel_other');
    IF v_defs IS NULL THEN
        RETURN;
    END IF;

    WITH room AS (  -- slots still free after this claim's picks
        SELECT r.definition_id,
               greatest(r.free - (SELECT count(*) FROM jobs.runs AS p
                                   WHERE p.id = ANY (coalesce(picked, '{}'))
                                     AND p.definition_id = r.definition_id), 0) AS free
          FROM unnest(room_defs, room_free) AS r (definition_id, free)
         WHERE r.definition_id = ANY (v_defs)
    ),
    waiting AS (  -- due and not picked, in claim order: those beyond the free slots wait
        SELECT q.id, q.definition_id,
               row_number() OVER (PARTITION BY q.definition_id
                                  ORDER BY q.priority DESC, q.scheduled_for, q.id) AS rn
          FROM jobs.runs AS q
          JOIN jobs.definitions AS d ON d.id = q.definition_id AND d.overlap_policy = 'buffer_one'
         WHERE q.definition_id = ANY (v_defs) AND q.status = 'QUEUED' AND q.scheduled_for <= now()
           AND q.id <> ALL (coalesce(picked, '{}'))
    ),
    victims AS (  -- and of those that wait, only one may (a run snoozed since it began waits too)
        SELECT q.id FROM jobs.runs AS q
          JOIN waiting AS w ON w.id = q.id
          JOIN room ON room.definition_id = w.definition_id
          JOIN jobs.definitions AS d ON d.id = q.definition_id
         WHERE w.rn > room.free + 1 AND q.origin = 'schedule' AND q.status = 'QUEUED'
           AND jobs._new_occurrence(q.origin, q.definition_id, q.occurrence_at, q.scheduled_for, d.jitter)
         ORDER BY q.id
           FOR UPDATE OF q SKIP LOCKED
    ),
    skipped AS (
        UPDATE jobs.runs AS r
           SET status = 'CANCELLED', finished_at = now(), failure_reason = 'Skipped',
               error = 'skipped: an earlier occurrence already waits (overlap_policy buffer_one)'
          FROM victims WHERE r.id = victims.id
        RETURNING r.id
    )
    SELECT array_agg(skipped.id) INTO v_skipped FROM skipped;
    IF v_skipped IS NOT NULL THEN
        PERFORM jobs._cascade_dependency_failure(v_skipped);  -- runs waiting on them
    END IF;

    WITH waiting AS (  -- per cancel_other definition at its cap: its newest due new occurrence
        SELECT q.definition_id, max(q.scheduled_for) AS newest
          FROM jobs.runs AS q
          JOIN unnest(room_defs, room_free) AS room (definition_id, free)
            ON room.definition_id = q.definition_id AND room.free = 0
          JOIN jobs.definitions AS d ON d.id = q.definition_id AND d.overlap_policy = 'cancel_other'
         WHERE q.definition_id = ANY (v_defs) AND q.status = 'QUEUED' AND q.scheduled_for <= now()
           AND q.origin = 'schedule' AND q.id <> ALL (coalesce(picked, '{}'))
           AND jobs._new_occurrence(q.origin, q.definition_id, q.occurrence_at, q.scheduled_for, d.jitter)
         GROUP BY q.definition_id
    ),
    victims AS (
        SELECT r.id FROM jobs.runs AS r JOIN waiting AS w ON w.definition_id = r.definition_id
         WHERE r.status = 'RUNNING' AND NOT r.cancel_requested AND r.scheduled_for < w.newest
         ORDER BY r.id
           FOR UPDATE OF r SKIP LOCKED
    )
    UPDATE jobs.runs AS r SET cancel_requested = TRUE
      FROM victims WHERE r.id = victims.id AND r.status = 'RUNNING';
END $$;
COMMENT ON FUNCTION jobs._apply_overlap(bigint[], integer[], bigint[]) IS 'Private (jobs.claim): enforce overlap_policy buffer_one (further waiting occurrences Skipped) and cancel_other (ask the older running run to cancel) for the definitions whose dispatch locks the claim holds.';

-- ===========================================================================
-- pause_after_failures: a deferred trigger sees every final failure, whatever path failed it
-- (jobs.fail, jobs.reap, timeouts), after the retry row (if any) was inserted.
-- ===========================================================================

-- Private trigger function: when a run of a definition with pause_after_failures ends FAILED with
-- no retry, count the definition's consecutive final failures and pause it at the threshold.
CREATE OR REPLACE FUNCTION jobs._pause_after_failures() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    v_limit integer;
    v_failures integer;
BEGIN
    IF OLD.status = 'FAILED' OR NEW.definition_id IS NULL THEN
        RETURN NULL;  -- not a new failure, or an ad-hoc run: no definition to pause
    END IF;
    SELECT d.pause_after_failures INTO v_limit FROM jobs.definitions AS d
     WHERE d.id = NEW.definition_id AND d.enabled;
    IF v_limit IS NULL OR EXISTS (SELECT FROM jobs.runs AS x WHERE x.retry_of = NEW.id) THEN
        RETURN NULL;  -- not watched, already paused, or a retry follows: not final
    END IF;
    -- Two failures committing at once: the second counts after the first committed. A
    -- transaction already holding one such lock (a reap sweep failing runs of several
    -- definitions) only tries the next: waiting while holding one could close a cycle with
    -- another sweep. Then that definition pauses at its next final failure instead.
    IF current_setting('pgtick.pause_locked', TRUE) = 'yes' THEN
        IF NOT pg_try_advisory_xact_lock(hashtextextended('pause:' || NEW.definition_id, 0)) THEN
            RETURN NULL;
        END IF;
    ELSE
        PERFORM pg_advisory_xact_lock(hashtextextended('pause:' || NEW.definition_id, 0));
        PERFORM set_config('pgtick.pause_locked', 'yes', TRUE);
    END IF;
    -- The streak may reach back past jobs.config.archive_after: counted in history too.
    SELECT count(*) INTO v_failures
      FROM jobs.runs_all AS r
      JOIN jobs.definitions AS d ON d.id = r.definition_id
     WHERE r.definition_id = NEW.definition_id AND r.status = 'FAILED'
       AND r.finished_at >= coalesce(d.failure_streak_since, '-infinity')
       AND r.id > coalesce((SELECT max(ok.id) FROM jobs.runs_all AS ok
                             WHERE ok.definition_id = NEW.definition_id AND ok.status = 'COMPLETED'), 0)
       AND NOT EXISTS (SELECT FROM jobs.runs_all AS x WHERE x.retry_of = r.id);
    UPDATE jobs.definitions AS d
       SET enabled = FALSE, updated_at = now(),
           paused_reason = format('paused after %s consecutive failures (pause_after_failures %s); last: run %s %s',
                                  v_failures, d.pause_after_failures, NEW.id,
                                  left(coalesce(NEW.failure_reason || ': ', '') || coalesce(NEW.error, ''), 500))
     WHERE d.id = NEW.definition_id AND d.enabled AND v_failures >= d.pause_after_failures;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION jobs._pause_after_failures() IS 'Private trigger: pause a definition (enabled = false, paused_reason set) once pause_after_failures consecutive final failures are reached.';

-- The WHEN is as short as it can be: every UPDATE of jobs.runs reads it back from its stored
-- text and prepares it again (a claim, a completion, a heartbeat); the function tests the rest.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_trigger AS t
                    WHERE t.tgname = 'runs_pause_after_failures'
                      AND t.tgrelid = 'jobs.runs'::regclass) THEN
        CREATE CONSTRAINT TRIGGER runs_pause_after_failures
        AFTER UPDATE OF status ON jobs.runs
        DEFERRABLE INITIALLY DEFERRED
        FOR EACH ROW
        WHEN (new.status = 'FAILED')
        EXECUTE FUNCTION jobs._pause_after_failures();
    END IF;
END $$;

-- ===========================================================================
-- Backfill: the occurrences of a past window, once.
-- ===========================================================================

-- Ask for the occurrences of name's schedule in [from, to] (a past window) to be materialized once.
-- The scheduler (or `pgtick backfill`) computes them and calls jobs.finish_backfill.
CREATE OR REPLACE FUNCTION jobs.backfill(name text, "from" timestamptz, "to" timestamptz) RETURNS jobs.backfills
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_def jobs.definitions;
    v_row jobs.backfills;
BEGIN
    PERFORM jobs._check_instant('backfill from', backfill."from");
    PERFORM jobs._check_instant('backfill to', backfill."to");
    IF backfill."from" > backfill."to" THEN
        RAISE EXCEPTION 'backfill from (%) is after to (%)', backfill."from", backfill."to"
            USING ERRCODE = '22023';
    END IF;
    IF backfill."to" > now() THEN
        RAISE EXCEPTION 'backfill to (%) is in the future: backfill is for past windows', backfill."to"
            USING ERRCODE = '22023', HINT = 'Future occurrences are the scheduler''s.';
    END IF;
    IF backfill."to" - backfill."from" > interval '366 days' THEN
        RAISE EXCEPTION 'backfill window from % to % is longer than 366 days', backfill."from", backfill."to"
            USING ERRCODE = '22023', HINT = 'Backfill a long history in windows of at most a year.';
    END IF;
    v_def := jobs._known_definition((SELECT d FROM jobs.definitions AS d WHERE d.name = backfill.name), backfill.name);
    IF v_def.schedule IS NULL THEN
        RAISE EXCEPTION 'definition % is a one-shot: only a recurring schedule can be backfilled',
            quote_literal(backfill.name) USING ERRCODE = '22023';
    END IF;
    INSERT INTO jobs.backfills AS b (definition_id, revision, window_from, window_to)
    VALUES (v_def.id, v_def.revision, backfill."from", backfill."to")
    RETURNING b.* INTO v_row;
    PERFORM jobs._notify();
    RETURN v_row;
END $$;
COMMENT ON FUNCTION jobs.backfill(text, timestamptz, timestamptz) IS 'Request the occurrences of the named definition in the past window [from, to] (at most 366 days) to be materialized once; the scheduler inserts them. Occurrences that already have their run are not inserted again.';

-- Leader: insert a pending backfill's occurrences (or void it with error), once.
CREATE OR REPLACE FUNCTION jobs.finish_backfill(backfill_id bigint, run_times timestamptz[], error text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_request jobs.backfills;
    v_def jobs.definitions;
    v_count integer := 0;
    v_error text := finish_backfill.error;
BEGIN
    IF finish_backfill.run_times IS NULL AND v_error IS NULL THEN
        -- Done with no runs would drop the request: the leader says so with '{}'.
        RAISE EXCEPTION 'run_times must be an array of the window''s occurrences (''{}'' for none), or error given, not NULL'
            USING ERRCODE = '22004';
    END IF;
    PERFORM jobs._check_range('run_times length', cardinality(coalesce(finish_backfill.run_times, '{}')), 0, 100000);
    -- The definition first, then the request, as jobs.undefine locks them (its delete cascades to
    -- the request): after an undefine neither is there, and nothing is inserted.
    SELECT d.* INTO v_def FROM jobs.definitions AS d
     WHERE d.id = (SELECT b.definition_id FROM jobs.backfills AS b WHERE b.id = finish_backfill.backfill_id)
       FOR SHARE;
    SELECT b.* INTO v_request FROM jobs.backfills AS b
     WHERE b.id = finish_backfill.backfill_id AND b.done_at IS NULL
       FOR UPDATE;
    IF NOT FOUND OR v_def.id IS NULL THEN
        RETURN 0;  -- done already (another leader, or twice), or its definition was deleted
    END IF;
    IF v_error IS NULL AND v_def.revision <> v_request.revision THEN
        v_error := 'the definition''s schedule changed after the backfill was requested';
    END IF;
    IF v_error IS NULL AND jobs._blank_key(v_def.concurrency_key) THEN
        -- A blank key from before such keys were refused: the runs' key refuses it. The request
        -- is voided saying so, rather than failing every tick and holding up the next ones.
        v_error := jobs._blank_key_problem(v_def.name, v_def.concurrency_key);
    END IF;
    IF v_error IS NULL AND EXISTS (SELECT FROM unnest(finish_backfill.run_times) AS t
                                    WHERE t IS NULL OR t < v_request.window_from OR t > v_request.window_to) THEN
        RAISE EXCEPTION 'run_times must lie within the backfill window [%, %]',
            v_request.window_from, v_request.window_to USING ERRCODE = '22023';
    END IF;
    IF v_error IS NULL THEN
        -- An occurrence that has a run already is skipped by the occurrence the run records, not
        -- by its start (a jitter changed since then moves the start): in jobs.runs one range of
        -- the occurrence index (runs_occurrence_uniq), in history the definition's runs.
        v_count := jobs._insert_occurrences(v_def, array(
            SELECT t FROM unnest(finish_backfill.run_times) AS t
             WHERE t NOT IN (SELECT r.occurrence_at FROM jobs.runs_all AS r
                              WHERE r.definition_id = v_def.id AND r.origin = 'schedule'
                                AND coalesce(r.occurrence_at, r.scheduled_for) BETWEEN v_request.window_from
                                                                                   AND v_request.window_to
                                AND r.occurrence_at IS NOT NULL)
        ));
    END IF;
    UPDATE jobs.backfills AS b
       SET done_at = now(), runs_created = v_count, error = left(v_error, 2000)
     WHERE b.id = v_request.id;
    RETURN jobs._notify_queued(v_count);
END $$;
COMMENT ON FUNCTION jobs.finish_backfill(bigint, timestamptz[], text) IS 'Leader: insert the occurrences of a pending backfill (those already present are skipped) and mark it done, or void it with error. run_times NULL without an error raises 22004 (''{}'' is a window without occurrences). Returns runs inserted; 0 when it was done already.';
