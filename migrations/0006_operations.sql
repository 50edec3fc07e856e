-- pgtick schema: what operators need to see without writing SQL.
-- Forward-only: once released this file is never edited.
-- Workers register themselves (jobs.worker_registry, jobs.known_kinds), so `pgtick workers`
-- lists who is alive and an enqueue of a kind no worker ever registered is noticed at once;
-- the scheduler records each catch-up after downtime (jobs.catch_ups), so health can say what
-- happened to the occurrences it missed.

-- ===========================================================================
-- Workers
-- ===========================================================================
CREATE TABLE jobs.worker_registry (
    worker text PRIMARY KEY CHECK (length(worker) BETWEEN 1 AND 200),
    host text CHECK (length(host) <= 255),
    pid integer,
    kinds text[] NOT NULL DEFAULT '{}',
    started_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    stopped_at timestamptz
);
COMMENT ON TABLE jobs.worker_registry IS
'One row per worker process that has registered (jobs.register_worker); jobs.workers shows who is alive.';
COMMENT ON COLUMN jobs.worker_registry.worker IS 'The worker id it claims with (jobs.runs.worker).';
COMMENT ON COLUMN jobs.worker_registry.host IS 'Host name the worker runs on.';
COMMENT ON COLUMN jobs.worker_registry.pid IS 'Operating-system process id of the worker.';
COMMENT ON COLUMN jobs.worker_registry.kinds IS 'The job kinds the worker can run.';
COMMENT ON COLUMN jobs.worker_registry.started_at IS 'When the worker registered.';
COMMENT ON COLUMN jobs.worker_registry.last_seen_at IS
'The worker''s last sign of life (registration or jobs.worker_seen, on its heartbeat cadence).';
COMMENT ON COLUMN jobs.worker_registry.stopped_at IS 'When the worker said it stopped; NULL while it runs (or if it died).';

CREATE TABLE jobs.known_kinds (
    kind text PRIMARY KEY CHECK (length(kind) BETWEEN 1 AND 200),
    first_registered_at timestamptz NOT NULL DEFAULT now(),
    last_registered_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE jobs.known_kinds IS
'Every job kind some worker has registered; jobs.enqueue raises a NOTICE for a kind not listed here.';
COMMENT ON COLUMN jobs.known_kinds.kind IS 'A job kind (jobs.runs.kind).';
COMMENT ON COLUMN jobs.known_kinds.first_registered_at IS 'When a worker first registered this kind.';
COMMENT ON COLUMN jobs.known_kinds.last_registered_at IS 'When a worker last registered this kind.';

-- ===========================================================================
-- Catch-ups after downtime
-- ===========================================================================
CREATE TABLE jobs.catch_ups (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    definition_id bigint NOT NULL,
    caught_up_at timestamptz NOT NULL DEFAULT now(),
    misfire_policy text NOT NULL CHECK (misfire_policy IN ('coalesce', 'catch_up', 'skip')),
    resumed_from timestamptz NOT NULL,
    first_late timestamptz NOT NULL,
    last_late timestamptz NOT NULL,
    occurrences integer NOT NULL CHECK (occurrences >= 1),
    runs integer NOT NULL CHECK (runs >= 0 AND runs <= occurrences),
    superseded integer NOT NULL DEFAULT 0 CHECK (superseded >= 0 AND superseded <= occurrences),
    CONSTRAINT catch_ups_once UNIQUE (definition_id, resumed_from),
    CONSTRAINT catch_ups_definition_fk FOREIGN KEY (definition_id)
    REFERENCES jobs.definitions (id) ON DELETE CASCADE
);
COMMENT ON TABLE jobs.catch_ups IS
'One row per catch-up: the scheduler found occurrences of a definition late (it was down) and applied the misfire policy.';
COMMENT ON COLUMN jobs.catch_ups.id IS 'Surrogate key.';
COMMENT ON COLUMN jobs.catch_ups.definition_id IS 'The definition whose occurrences were late.';
COMMENT ON COLUMN jobs.catch_ups.caught_up_at IS 'When the scheduler materialized the late occurrences.';
COMMENT ON COLUMN jobs.catch_ups.misfire_policy IS 'The policy applied: coalesce, catch_up or skip.';
COMMENT ON COLUMN jobs.catch_ups.resumed_from IS 'The cursor the scheduler resumed from (one record per definition and cursor).';
COMMENT ON COLUMN jobs.catch_ups.first_late IS
'The earliest late occurrence: the cursor, or an older run materialized before the downtime that never started.';
COMMENT ON COLUMN jobs.catch_ups.last_late IS 'The latest late occurrence.';
COMMENT ON COLUMN jobs.catch_ups.occurrences IS 'How many occurrences were late (superseded ones included).';
COMMENT ON COLUMN jobs.catch_ups.superseded IS
'Of them, QUEUED runs materialized before the downtime that never started, cancelled as Skipped (coalesce, skip).';
COMMENT ON COLUMN jobs.catch_ups.runs IS
'How many runs were created for them (coalesce: 1; catch_up: all; skip: those still within the misfire grace).';
CREATE INDEX catch_ups_definition_idx ON jobs.catch_ups (definition_id, caught_up_at DESC);
