-- ===========================================================================
-- ops.sql: the operator's settings (jobs.config), console (views) and retention (prune).
-- ===========================================================================

-- Operators change settings with UPDATE jobs.config SET ...: a value out of bounds is refused
-- there with 22023 naming the setting and its range (the table's CHECK constraints say the same
-- with 23514 should this trigger ever be disabled). A setting the reaper, prune or the retry
-- backoff computes with can then never make them fail for every run.
CREATE OR REPLACE FUNCTION jobs._check_config() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    v_unset text[];
BEGIN
    -- Every setting but archive_after (NULL: never archive) has a value: the NOT NULL
    -- constraints would say 23502; the setting is named here with 22023, as for its bounds.
    v_unset := array_remove(ARRAY[
        CASE WHEN NEW.heartbeat_timeout IS NULL THEN 'heartbeat_timeout' END,
        CASE WHEN NEW.orphan_timeout IS NULL THEN 'orphan_timeout' END,
        CASE WHEN NEW.max_payload_bytes IS NULL THEN 'max_payload_bytes' END,
        CASE WHEN NEW.retention IS NULL THEN 'retention' END,
        CASE WHEN NEW.max_attempts IS NULL THEN 'max_attempts' END,
        CASE WHEN NEW.backoff_initial IS NULL THEN 'backoff_initial' END,
        CASE WHEN NEW.backoff_max IS NULL THEN 'backoff_max' END,
        CASE WHEN NEW.require_claim_token IS NULL THEN 'require_claim_token' END], NULL);
    IF cardinality(v_unset) > 0 THEN
        RAISE EXCEPTION 'jobs.config.% must not be NULL', v_unset[1]
            USING ERRCODE = '22023', HINT = 'Set it to a value; only archive_after may be NULL (never archive).';
    END IF;
    PERFORM jobs._check_duration('jobs.config.heartbeat_timeout', NEW.heartbeat_timeout, 'heartbeat_timeout');
    PERFORM jobs._check_duration('jobs.config.orphan_timeout', NEW.orphan_timeout, 'orphan_timeout');
    PERFORM jobs._check_duration('jobs.config.retention', NEW.retention, 'retention');
    PERFORM jobs._check_duration('jobs.config.archive_after', NEW.archive_after, 'archive_after');
    PERFORM jobs._check_duration('jobs.config.backoff_initial', NEW.backoff_initial, 'backoff_initial');
    PERFORM jobs._check_duration('jobs.config.backoff_max', NEW.backoff_max, 'backoff_max');
    -- The cap on the retry delay at least the first delay, when either is written: a row
    -- stored before this rule that breaks it still takes UPDATEs of its other settings.
    IF TG_OP = 'INSERT'
       OR (NEW.backoff_initial, NEW.backoff_max) IS DISTINCT FROM (OLD.backoff_initial, OLD.backoff_max) THEN
        PERFORM jobs._check_backoff_order(
            'jobs.config.backoff_initial', NEW.backoff_initial, 'jobs.config.backoff_max', NEW.backoff_max,
            'Every retry delay of a kind without a policy would be backoff_max: change both in one UPDATE'
            || ' (UPDATE jobs.config SET backoff_initial = ..., backoff_max = ...).');
    END IF;
    PERFORM jobs._check_range('jobs.config.max_attempts', NEW.max_attempts, 1, 1000);
    PERFORM jobs._check_range('jobs.config.max_payload_bytes', NEW.max_payload_bytes, 2, 268435456);
    -- A lowered heartbeat timeout: workers learn it at their next beat, sent at the cadence the
    -- timeout in force until now asked for, so to runs beaten before the change the reaper
    -- applies that one for its length (jobs.reap). Lowered again within that time: the longer
    -- one still in force is kept, from the new change.
    IF TG_OP = 'UPDATE' AND NEW.heartbeat_timeout < OLD.heartbeat_timeout THEN
        NEW.heartbeat_timeout_lowered_from := greatest(
            OLD.heartbeat_timeout,
            CASE WHEN OLD.heartbeat_timeout_lowered_at
                      + make_interval(secs => extract(EPOCH FROM OLD.heartbeat_timeout_lowered_from)) > now()
                 THEN OLD.heartbeat_timeout_lowered_from END);
        NEW.heartbeat_timeout_lowered_at := now();
    ELSIF TG_OP = 'UPDATE' THEN
        NEW.heartbeat_timeout_lowered_from := OLD.heartbeat_timeout_lowered_from;
        NEW.heartbeat_timeout_lowered_at := OLD.heartbeat_timeout_lowered_at;
    ELSE
        NEW.heartbeat_timeout_lowered_from := NULL;
        NEW.heartbeat_timeout_lowered_at := NULL;
    END IF;
    RETURN NEW;
END $$;
COMMENT ON FUNCTION jobs._check_config() IS 'Private trigger: refuse (22023, naming the setting and its range) a jobs.config row whose durations or numbers are out of bounds, or whose backoff_max is written below its backoff_initial; when heartbeat_timeout is lowered, record the timeout in force before and when (heartbeat_timeout_lowered_from, _at), which the reaper keeps for one of its lengths.';

CREATE OR REPLACE TRIGGER config_bounds
BEFORE INSERT OR UPDATE ON jobs.config
FOR EACH ROW EXECUTE FUNCTION jobs._check_config();
COMMENT ON TRIGGER config_bounds ON jobs.config IS 'Refuse settings out of bounds with 22023 naming the setting (jobs._check_config).';

-- jobs.config is one row that the reaper, retries, enqueue and prune read at every call: without
-- it they would find no setting and quietly do nothing (no retry, no reaping, no payload limit).
-- So it is changed with UPDATE only; a DELETE or TRUNCATE of it is refused, whatever it matches.
CREATE OR REPLACE FUNCTION jobs._keep_config() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'jobs.config holds the settings every call reads; it cannot be emptied (% refused)', TG_OP
        USING ERRCODE = '22023', HINT = 'Change a setting with UPDATE jobs.config SET ...';
END $$;
COMMENT ON FUNCTION jobs._keep_config() IS 'Private trigger: refuse (22023) a DELETE or TRUNCATE of jobs.config, whose one row every call reads.';

CREATE OR REPLACE TRIGGER config_kept
BEFORE DELETE OR TRUNCATE ON jobs.config
FOR EACH STATEMENT EXECUTE FUNCTION jobs._keep_config();
COMMENT ON TRIGGER config_kept ON jobs.config IS 'Refuse a DELETE or TRUNCATE of jobs.config with 22023 (jobs._keep_config): its row is changed with UPDATE only.';

-- Who leads the scheduler, since when.
-- The leader key (helpers.sql key table: 8099570450837490756, 'pgtickLD') is spelled out here rather than
-- read from jobs._leader_key(): a view calls functions with the privileges of whoever selects
-- from it, and the private helper is executable by no role, so every reader would get 42501.
CREATE OR REPLACE VIEW jobs.leader AS
SELECT
    l.pid,
    s.owner,
    s.since,
    now() - s.since AS leading_for,
    a.application_name,
    a.client_addr,
    a.backend_start
FROM pg_catalog.pg_locks AS l
INNER JOIN pg_catalog.pg_database AS db ON l.database = db.oid AND db.datname = current_database()
LEFT JOIN pg_catalog.pg_stat_activity AS a ON l.pid = a.pid
-- A leader shows only when the lock holder and the committed leadership row agree: the lock is
-- in pg_locks as soon as jobs.try_lead takes it, the row only once that transaction commits, and
-- a dead leader's row stays behind with a pid that no longer holds the lock.
INNER JOIN jobs._leadership AS s ON l.pid = s.pid
WHERE
    l.locktype = 'advisory' AND l.granted
    AND l.classid = 1885828201::oid  -- 8099570450837490756 >> 32
    AND l.objid = 1667976260::oid  -- 8099570450837490756 & 4294967295
    AND l.objsubid = 1
UNION ALL
-- A scheduler behind a transaction-mode pooler leads by the lease pgtick:leader instead (no
-- session holds anything: no pid, no backend).
SELECT
    NULL::integer AS pid,
    e.owner,
    e.acquired_at AS since,
    now() - e.acquired_at AS leading_for,
    NULL::text AS application_name,
    NULL::inet AS client_addr,
    NULL::timestamptz AS backend_start
FROM jobs.leases AS e
WHERE e.name = 'pgtick:leader' AND e.owner IS NOT NULL AND e.expires_at > clock_timestamp();
COMMENT ON VIEW jobs.leader IS 'Who leads the scheduler, since when: the backend holding the leader lock whose leadership row is committed, or (pid NULL) the holder of the unexpired lease pgtick:leader, as a scheduler behind a pooler leads. No row: nobody leads, or a new leader has not committed yet.';

-- What is running now, with heartbeat age and runtime.
CREATE OR REPLACE VIEW jobs.running AS
SELECT
    r.id,
    d.name AS definition,
    r.kind,
    r.worker,
    r.attempt,
    r.scheduled_for,
    r.started_at,
    now() - r.started_at AS runtime,
    r.heartbeat_at,
    now() - r.heartbeat_at AS heartbeat_age,
    r.cancel_requested,
    r.timeout,
    -- jobs.config's as the reaper applies it: the previous one, for its length after it was
    -- lowered, to a run whose last heartbeat came before that (jobs.reap).
    coalesce(
        r.heartbeat_timeout,
        CASE
            WHEN
                r.heartbeat_at < c.heartbeat_timeout_lowered_at
                AND c.heartbeat_timeout_lowered_at
                + make_interval(secs => extract(EPOCH FROM c.heartbeat_timeout_lowered_from)) > now()
                THEN greatest(c.heartbeat_timeout, c.heartbeat_timeout_lowered_from)
            ELSE c.heartbeat_timeout
        END
    ) AS heartbeat_timeout
FROM jobs.runs AS r
CROSS JOIN jobs.config AS c
LEFT JOIN jobs.definitions AS d ON r.definition_id = d.id
WHERE r.status = 'RUNNING';
COMMENT ON VIEW jobs.running IS 'RUNNING runs with runtime and heartbeat age (NULL heartbeat_age: never heartbeated), and the heartbeat timeout after which the reaper fails them (the run''s own, else jobs.config''s; the previous one, for its length, to a run whose last heartbeat came before it was lowered).';

-- Queue depth per kind and queue: live counts, recent outcomes, oldest due QUEUED age, and
-- flow control: paused, blocked on dependencies, held back by a full rate window, limits.
-- (Columns after lost_1h were added later, at the end, so existing readers keep working.)
CREATE OR REPLACE VIEW jobs.queue_stats AS
-- The QUEUED and the RUNNING rows are read apart, each through its partial index
-- (runs_claim_idx, runs_running_idx): status IN (...) matches neither index's predicate and
-- would read the whole table, the finished runs of the last archive_after included.
WITH waiting AS (
    SELECT
        r.kind,
        r.queue,
        count(*) FILTER (WHERE r.scheduled_for <= now() AND NOT r.blocked) AS queued,
        count(*) FILTER (WHERE r.scheduled_for > now() AND NOT r.blocked) AS scheduled,
        count(*) FILTER (WHERE r.blocked) AS blocked,
        min(r.scheduled_for) FILTER (WHERE r.scheduled_for <= now() AND NOT r.blocked) AS oldest_queued_at
    FROM jobs.runs AS r
    WHERE r.status = 'QUEUED'
    GROUP BY r.kind, r.queue
),

recent AS (
    SELECT
        r.kind,
        r.queue,
        count(*) FILTER (WHERE r.status = 'COMPLETED') AS completed_1h,
        count(*) FILTER (WHERE r.status = 'FAILED') AS failed_1h,
        count(*) FILTER (WHERE r.status = 'CANCELLED') AS cancelled_1h,
        count(*) FILTER (WHERE r.failure_reason = 'Skipped') AS skipped_1h,
        count(*) FILTER (WHERE r.failure_reason IN ('HeartbeatLost', 'Orphaned')) AS lost_1h
    FROM jobs.runs AS r
    WHERE r.finished_at > now() - interval '1 hour'
    GROUP BY r.kind, r.queue
),

running AS (
    SELECT
        r.kind,
        r.queue,
        count(*) AS n
    FROM jobs.runs AS r
    WHERE r.status = 'RUNNING'
    GROUP BY r.kind, r.queue
),

stats AS (
    SELECT
        coalesce(w.kind, x.kind, recent.kind) AS kind,
        coalesce(w.queue, x.queue, recent.queue) AS queue,
        coalesce(w.queued, 0) AS queued,
        coalesce(w.scheduled, 0) AS scheduled,
        coalesce(x.n, 0) AS running,
        coalesce(recent.completed_1h, 0) AS completed_1h,
        coalesce(recent.failed_1h, 0) AS failed_1h,
        coalesce(recent.cancelled_1h, 0) AS cancelled_1h,
        now() - w.oldest_queued_at AS oldest_queued_age,
        coalesce(recent.skipped_1h, 0) AS skipped_1h,
        coalesce(recent.lost_1h, 0) AS lost_1h,
        coalesce(w.blocked, 0) AS blocked,
        w.oldest_queued_at
    FROM waiting AS w
    FULL OUTER JOIN running AS x ON w.kind = x.kind AND w.queue = x.queue
    FULL OUTER JOIN recent
        ON coalesce(w.kind, x.kind) = recent.kind AND coalesce(w.queue, x.queue) = recent.queue
)

SELECT
    s.kind,
    s.queued,
    s.scheduled,
    s.running,
    s.completed_1h,
    s.failed_1h,
    s.cancelled_1h,
    s.oldest_queued_age,
    s.skipped_1h,
    s.lost_1h,
    s.queue,
    p.name IS NOT NULL AS paused,
    s.blocked,
    -- Due QUEUED runs whose queue or kind rate window is full now (per key where per_key).
    coalesce(held.rate_limited, 0) AS rate_limited,
    ql.max_running AS queue_max_running,
    kl.max_running AS kind_max_running,
    CASE WHEN ql.rate_limit IS NOT NULL THEN ql.rate_limit || ' per ' || ql.rate_period END AS queue_rate,
    CASE WHEN kl.rate_limit IS NOT NULL THEN kl.rate_limit || ' per ' || kl.rate_period END AS kind_rate,
    coalesce(ql.per_key, FALSE) OR coalesce(kl.per_key, FALSE) AS per_key,
    s.oldest_queued_at
FROM stats AS s
LEFT JOIN jobs.paused_queues AS p ON s.queue = p.name
LEFT JOIN jobs.limits AS ql ON ql.scope = 'queue' AND s.queue = ql.name
LEFT JOIN jobs.limits AS kl ON kl.scope = 'kind' AND s.kind = kl.name
LEFT JOIN LATERAL (
    SELECT count(*) AS rate_limited
    FROM jobs.runs AS q
    WHERE
        (ql.rate_limit IS NOT NULL OR kl.rate_limit IS NOT NULL)
        AND q.kind = s.kind AND q.queue = s.queue AND q.status = 'QUEUED'
        AND NOT q.blocked AND q.scheduled_for <= now()
        AND EXISTS (
            -- The queue's and the kind's window, each under its label as jobs.claim counts it.
            SELECT FROM (
                VALUES ('queue', s.queue, ql.rate_limit, ql.rate_period, ql.per_key),
                ('kind', s.kind, kl.rate_limit, kl.rate_period, kl.per_key)
            ) AS l (scope, name, rate_limit, rate_period, per_key)
            WHERE
                l.rate_limit IS NOT NULL AND l.rate_limit <= (
                    SELECT coalesce(sum(x.starts), 0) FROM jobs._rate_starts AS x
                    WHERE
                        x.label = CASE
                            WHEN l.per_key THEN jsonb_build_array(l.scope, l.name, q.concurrency_key)::text
                            ELSE jsonb_build_array(l.scope, l.name)::text
                        END
                        AND x.started_at > now() - l.rate_period
                )
        )
) AS held ON TRUE;
COMMENT ON VIEW jobs.queue_stats IS 'Per kind and queue: due QUEUED (claimable when not paused or limited), future QUEUED (scheduled), RUNNING, outcomes in the last hour, the age of the oldest due QUEUED run, of the last hour''s CANCELLED those Skipped (overlap) and of its FAILED those lost (HeartbeatLost or Orphaned); then the queue, whether it is paused, QUEUED runs blocked on dependencies, due runs held back by a full rate window, and the queue''s and kind''s limits.';

-- One row per definition: cursor and next start in UTC and local time (with the local time's UTC
-- offset), last outcomes, failure and skip streaks.
CREATE OR REPLACE VIEW jobs.definition_health AS
SELECT
    d.id,
    d.name,
    d.kind,
    d.schedule,
    d.timezone,
    NOT d.enabled AS paused,
    d.next_run_at,
    d.next_run_at AT TIME ZONE d.timezone AS next_run_local,
    d.max_concurrent_runs,
    coalesce(live.running, 0) AS running,
    coalesce(live.queued, 0) AS queued,
    coalesce(
        (
            SELECT r.finished_at FROM jobs.runs AS r
            WHERE r.id = ok.id
        ),
        (
            SELECT h.finished_at FROM jobs.run_history AS h
            WHERE h.id = ok.id
        )
    ) AS last_success_at,
    bad.finished_at AS last_failure_at,
    last.status AS last_status,
    fails.failures AS consecutive_failures,
    skipped.skips AS consecutive_skips,
    d.finished_at IS NOT NULL AS finished,
    d.schedule_error,
    coalesce(d.dst_gap, (jobs._dst_auto(d.schedule))[1]) AS dst_gap,
    coalesce(d.dst_repeat, (jobs._dst_auto(d.schedule))[2]) AS dst_repeat,
    d.dst_gap IS NULL AND d.dst_repeat IS NULL AND d.schedule IS NOT NULL AS dst_auto,
    d.overlap_policy,
    d.jitter,
    d.pause_after_failures,
    d.paused_reason,
    coalesce(recent.outcomes, '{}') AS recent_outcomes,
    catch_up.caught_up_at AS last_catch_up_at,
    catch_up.summary AS last_catch_up,
    d.materialize_error,
    d.materialize_failures,
    d.materialize_retry_at,
    late.p50 AS lateness_p50,
    late.p99 AS lateness_p99,
    next_start.at AS next_start_at,
    next_start.at AT TIME ZONE d.timezone AS next_start_local,
    last.finished_at AS last_finished_at,
    -- The local times' offsets from UTC: in the hour a fall-back repeats, one wall time is two
    -- instants, told apart only by these.
    (d.next_run_at AT TIME ZONE d.timezone) - (d.next_run_at AT TIME ZONE 'UTC') AS next_run_utc_offset,
    (next_start.at AT TIME ZONE d.timezone) - (next_start.at AT TIME ZONE 'UTC') AS next_start_utc_offset
FROM jobs.definitions AS d
LEFT JOIN LATERAL (
    SELECT
        count(*) FILTER (WHERE r.status = 'RUNNING') AS running,
        count(*) FILTER (WHERE r.status = 'QUEUED') AS queued,
        min(r.scheduled_for) FILTER (WHERE r.status = 'QUEUED' AND NOT r.blocked) AS first_queued
    FROM jobs.runs AS r
    WHERE r.definition_id = d.id AND r.status IN ('QUEUED', 'RUNNING')
) AS live ON TRUE
LEFT JOIN LATERAL (
    -- The next start: the first QUEUED run (materialized ahead of the cursor, queued by hand,
    -- a retry), else the cursor's run: its occurrence delayed by the definition's jitter, as
    -- the scheduler will queue it. A paused or finished definition, or one whose schedule
    -- cannot be read, materializes nothing more, but the runs it has queued still start. A
    -- run waiting on dependencies starts when they complete, not at its time.
    SELECT CASE
        WHEN d.enabled AND d.finished_at IS NULL AND d.schedule_error IS NULL
            THEN least(live.first_queued, d.next_run_at + jobs.jitter_offset(d.id, d.next_run_at, d.jitter))
        ELSE live.first_queued
    END AS at
) AS next_start ON TRUE
-- The last success, failure and outcome: from jobs.runs, and from history only for a
-- definition that has none since jobs.config.archive_after (coalesce evaluates its second
-- argument only when the first is NULL; a UNION ALL ordered by id would read both). max(id)
-- is read as the newest entry of the definition's index, backwards.
LEFT JOIN LATERAL (
    SELECT coalesce(
        (
            SELECT max(r.id) FROM jobs.runs AS r
            WHERE r.definition_id = d.id AND r.status = 'COMPLETED'
        ),
        (
            SELECT max(h.id) FROM jobs.run_history AS h
            WHERE h.definition_id = d.id AND h.status = 'COMPLETED'
        )
    ) AS id
) AS ok ON TRUE
LEFT JOIN LATERAL (
    SELECT coalesce(
        (
            SELECT r.finished_at FROM jobs.runs AS r
            WHERE r.definition_id = d.id AND r.status = 'FAILED'
            ORDER BY r.id DESC LIMIT 1
        ),
        (
            SELECT h.finished_at FROM jobs.run_history AS h
            WHERE h.definition_id = d.id AND h.status = 'FAILED'
            ORDER BY h.id DESC LIMIT 1
        )
    ) AS finished_at
) AS bad ON TRUE
LEFT JOIN LATERAL (
    -- The last outcome: status and finish of one run, the newest finished in jobs.runs.
    SELECT
        r.status,
        r.finished_at
    FROM jobs.runs AS r
    WHERE r.definition_id = d.id AND r.finished_at IS NOT NULL
    ORDER BY r.id DESC LIMIT 1
) AS live_last ON TRUE
LEFT JOIN LATERAL (
    -- Else the newest in history: read only when jobs.runs has no finished run of the
    -- definition (the condition on live_last is checked once, before the history's index).
    SELECT
        live_last.status,
        live_last.finished_at
    WHERE live_last.status IS NOT NULL
    UNION ALL
    (
        SELECT
            h.status,
            h.finished_at
        FROM jobs.run_history AS h
        WHERE live_last.status IS NULL AND h.definition_id = d.id
        ORDER BY h.id DESC LIMIT 1
    )
) AS last ON TRUE
LEFT JOIN LATERAL (
    -- A streak only follows a last outcome other than COMPLETED; it may reach into history.
    SELECT count(*) AS failures FROM jobs.runs_all AS r
    WHERE
        r.definition_id = d.id AND r.status = 'FAILED' AND r.id > coalesce(ok.id, 0)
        AND last.status IS DISTINCT FROM 'COMPLETED'
) AS fails ON TRUE
LEFT JOIN LATERAL (
    -- The bound as a row comparison, which only the (definition_id, id) index answers: as
    -- r.id > ..., the plan could walk the primary key over every run for each definition.
    SELECT count(*) AS skips FROM jobs.runs AS r
    WHERE
        r.definition_id = d.id AND r.failure_reason = 'Skipped'
        AND (r.definition_id, r.id) > (d.id, coalesce((
            SELECT max(s.id) FROM jobs.runs AS s
            WHERE s.definition_id = d.id AND s.started_at IS NOT NULL
        ), 0))
) AS skipped ON TRUE
LEFT JOIN LATERAL (
    -- Start lateness of the runs due in the last hour (one range of runs_occurrence_uniq: a
    -- run is due at most its definition's jitter after its occurrence).
    SELECT
        percentile_cont(0.5) WITHIN GROUP (ORDER BY r.started_at - r.scheduled_for) AS p50,
        percentile_cont(0.99) WITHIN GROUP (ORDER BY r.started_at - r.scheduled_for) AS p99
    FROM jobs.runs AS r
    WHERE
        r.definition_id = d.id AND r.origin = 'schedule'
        AND coalesce(r.occurrence_at, r.scheduled_for) > now() - interval '1 hour' - coalesce(d.jitter, interval '0')
        AND r.scheduled_for > now() - interval '1 hour' AND r.started_at IS NOT NULL
) AS late ON TRUE
LEFT JOIN LATERAL (
    SELECT array_agg(x.outcome ORDER BY x.id) AS outcomes FROM (
        SELECT
            r.id,
            CASE WHEN r.failure_reason = 'Skipped' THEN 'SKIPPED' ELSE r.status::text END AS outcome
        FROM jobs.runs AS r
        WHERE r.definition_id = d.id AND r.finished_at IS NOT NULL
        ORDER BY r.id DESC LIMIT 20
    ) AS x
) AS recent ON TRUE
LEFT JOIN LATERAL (
    SELECT
        c.caught_up_at,
        jobs.describe_catch_up(c) AS summary
    FROM jobs.catch_ups AS c
    WHERE c.definition_id = d.id
    ORDER BY c.caught_up_at DESC LIMIT 1
) AS catch_up ON TRUE;
COMMENT ON VIEW jobs.definition_health IS 'Per definition: paused, the cursor (next_run_at, next_run_local: how far its occurrences are materialized, in UTC and local time), running/queued, last success and failure, consecutive failures (since the last success) and skips (since the last start), finished, schedule_error; the effective DST policy (dst_gap, dst_repeat, dst_auto: both chosen by auto), overlap_policy, jitter, pause_after_failures and paused_reason (why it was paused automatically); materialize_error, materialize_failures and materialize_retry_at when its runs could not be inserted; start lateness p50/p99 (started_at - scheduled_for) of the occurrences scheduled in the last hour; the last 20 outcomes oldest first (SKIPPED for overlap skips), and the last catch-up after downtime as a sentence. Page it (ORDER BY name LIMIT n): every row reads that definition''s runs; jobs.definition_summary counts them all. Then next_start_at and next_start_local: when its next run starts, the first QUEUED run not waiting on dependencies, else the cursor delayed by its jitter (the cursor only while it is enabled, not finished and its schedule readable; the runs a paused definition queued still start); and last_finished_at, when the last outcome (last_status) finished; last, next_run_utc_offset and next_start_utc_offset, the offsets from UTC of next_run_local and next_start_local (-04:00:00 for EDT), which tell apart the two instants of a wall time a fall-back repeats.';

-- One row for all definitions: how many there are and how many need attention.
CREATE OR REPLACE VIEW jobs.definition_summary AS
SELECT
    count(*) AS definitions,
    count(*) FILTER (WHERE d.schedule IS NOT NULL) AS recurring,
    count(*) FILTER (WHERE NOT d.enabled) AS paused,
    count(*) FILTER (WHERE d.finished_at IS NOT NULL) AS finished,
    count(*) FILTER (WHERE d.schedule_error IS NOT NULL) AS schedule_errors,
    count(*) FILTER (WHERE d.materialize_error IS NOT NULL) AS materialize_errors,
    min(d.next_run_at) FILTER (WHERE d.enabled AND d.finished_at IS NULL) AS next_run_at
FROM jobs.definitions AS d;
COMMENT ON VIEW jobs.definition_summary IS 'All definitions in one row: total, recurring, paused, finished, with a schedule error, failing to materialize, and the earliest cursor; what `pgtick status` shows before its page of jobs.definition_health.';

-- Per kind: scheduled occurrences that are due but not started, and how late the oldest is.
CREATE OR REPLACE VIEW jobs.schedule_backlog AS
SELECT
    r.kind,
    count(*) AS due_not_started,
    max(now() - r.scheduled_for) AS oldest_due_age
FROM jobs.runs AS r
WHERE r.status = 'QUEUED' AND r.origin = 'schedule' AND r.scheduled_for <= now()
GROUP BY r.kind;
COMMENT ON VIEW jobs.schedule_backlog IS 'Per kind: schedule occurrences whose time has come that are still QUEUED (due but not started), and the age of the oldest; an alert source (it should stay near zero).';

-- Delete finished runs older than older_than (default jobs.config.retention), at most batch_size per call.
CREATE OR REPLACE FUNCTION jobs.prune(older_than interval DEFAULT NULL, batch_size integer DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_age interval := coalesce(prune.older_than, (SELECT c.retention FROM jobs.config AS c));
    v_cutoff timestamptz;
    v_wait text := current_setting('lock_timeout');
    v_day record;
    v_held boolean;
    v_batch bigint[];
    v_kept bigint[];
    v_rows bigint;
    v_count bigint := 0;
    v_days integer := 0;
    v_more boolean := FALSE;
    c_days_per_call CONSTANT integer := 50;
BEGIN
    PERFORM jobs._check_duration('older_than', v_age);
    PERFORM jobs._check_range('batch_size', prune.batch_size, 1, 1000000);
    -- Elapsed time (a day is 24 hours, a month 30 days, as jobs.reap counts): now() - interval
    -- '1 day' steps back a calendar day in the session's TimeZone, 23 or 25 hours across a DST
    -- change, and a session in such a zone would delete runs (and free their keys) early.
    v_cutoff := now() - make_interval(secs => extract(EPOCH FROM v_age));
    -- Whole days of history first: a DROP, whatever their size. A day that ends after the
    -- cutoff stays until it does, so history keeps up to a day more than the retention.
    -- A DROP locks jobs.run_history against readers while it waits for its lock, and a long
    -- transaction that read history would hold it up, with every reader queued behind: it
    -- waits half a second at most, then the day waits for the next prune.
    -- A day holding a run of a retry chain that a blocked run waits on stays until it waits no
    -- more (flow.sql: the waiting run is released or cancelled by following the chain from the
    -- id it names). Read under the day's lock, which an enqueue naming one of its runs holds
    -- until it commits.
    -- Every dropped day holds about sixteen locks (the partition, its indexes, its types) until
    -- the caller commits: a call drops at most c_days_per_call of them, and stops dropping
    -- once it has dropped batch_size runs, so that a retention cut by years is pruned over
    -- many calls rather than by one transaction that fills the server's lock table and fails.
    -- The days are listed before they are locked, and another prune (the leader's and an
    -- operator's) may drop one and commit while this one waits for its lock: each is named by
    -- its name, read with the list (its oid would then name nothing), and a day found gone
    -- once locked is passed over.
    FOR v_day IN SELECT h.day, format('%s.%I', c.relnamespace::regnamespace, c.relname) AS name
                   FROM jobs._history_days_before(v_cutoff) AS h
                   JOIN pg_catalog.pg_class AS c ON c.oid = h.part
                  ORDER BY h.day LOOP
        IF v_days >= c_days_per_call OR v_count >= prune.batch_size THEN
            v_more := TRUE;
            EXIT;
        END IF;
        BEGIN
            PERFORM set_config('lock_timeout', '500ms', TRUE);
            -- ONLY: the parent alone (the DROP locks it), not every day of history with it.
            EXECUTE format('LOCK TABLE ONLY jobs.run_history, %s IN ACCESS EXCLUSIVE MODE', v_day.name);
            PERFORM set_config('lock_timeout', v_wait, TRUE);
        EXCEPTION
            WHEN lock_not_available THEN
                EXIT;  -- the block's rollback restored lock_timeout
            WHEN undefined_table THEN
                CONTINUE;  -- dropped by another prune meanwhile
        END;
        EXECUTE format('SELECT EXISTS (SELECT FROM %s AS h WHERE h.id = ANY ($1))', v_day.name)
           INTO v_held USING jobs._waited_on();
        CONTINUE WHEN v_held;
        EXECUTE format('SELECT count(*) FROM %s', v_day.name) INTO v_rows;
        EXECUTE format('DROP TABLE %s', v_day.name);
        DELETE FROM jobs.run_history_keys AS k   -- the keys of its runs (the day by finished_at)
         WHERE k.finished_at >= v_day.day::timestamp AT TIME ZONE 'UTC'
           AND k.finished_at < (v_day.day + 1)::timestamp AT TIME ZONE 'UTC';
        v_count := v_count + v_rows;
        v_days := v_days + 1;
    END LOOP;
    IF v_more THEN  -- days are left: the caller calls again (it does while this returns batch_size)
        RETURN greatest(v_count, prune.batch_size);
    END IF;
    -- Then runs not moved yet (archive_after longer than the retention, or NULL), row by row,
    -- but for those a blocked run waits on: passed over in the batch (so a long list of them
    -- cannot fill every batch), and read again with the batch locked (as above).
    SELECT array_agg(v.run_id) INTO v_batch
      FROM jobs._lock_finished_before(v_cutoff, prune.batch_size, jobs._waited_on()) AS v;
    v_kept := jobs._waited_on();
    DELETE FROM jobs.runs AS r WHERE r.id = ANY (v_batch) AND r.id <> ALL (v_kept);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    -- Recorded starts of rate limits no claim has touched for longer than any window (1 day).
    DELETE FROM jobs._rate_starts AS x WHERE x.started_at < now() - interval '1 day';
    -- The worker registry and the known kinds, kept to the same retention.
    PERFORM jobs.prune_registry(v_age);
    RETURN v_count + v_rows;
END $$;
COMMENT ON FUNCTION jobs.prune(interval, integer) IS 'Delete finished runs older than older_than (default jobs.config.retention): every day of jobs.run_history that ended before it, dropped whole, and up to batch_size such runs still in jobs.runs; the runs of retry chains that blocked runs wait on stay, with their days. Then the worker registry to the same age (jobs.prune_registry). A call drops at most 50 days, and no more days once it has dropped batch_size runs (each dropped day holds its locks until commit): one that stopped with days left returns at least batch_size. Returns how many. Call again while it returns batch_size or more.';
