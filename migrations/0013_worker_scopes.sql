-- pgtick 0013: an operator can give a worker login only the kinds or queues it serves.
-- * jobs.worker_scopes: per login role (session_user), the kinds and the queues jobs.claim may
--   hand it (NULL: any). jobs.claim intersects what the caller asks with this scope, so a
--   scoped login never gets a run outside it, whatever it passes and whatever role it SETs.

CREATE TABLE jobs.worker_scopes (
    role name PRIMARY KEY,
    kinds text[],
    queues text[],
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT worker_scopes_kinds_bounded CHECK (kinds IS NULL OR cardinality(kinds) BETWEEN 1 AND 1000),
    CONSTRAINT worker_scopes_queues_bounded CHECK (queues IS NULL OR cardinality(queues) BETWEEN 1 AND 1000)
);
COMMENT ON TABLE jobs.worker_scopes IS
'What jobs.claim may hand a login role (its session_user): runs of these kinds and in these queues only. No row: any run. Written by jobs.scope_worker and jobs.unscope_worker.';
COMMENT ON COLUMN jobs.worker_scopes.role IS
'The login role (session_user) the scope binds; SET ROLE does not change it.';
COMMENT ON COLUMN jobs.worker_scopes.kinds IS
'The kinds this login may claim (1 to 1000 names); NULL: any kind.';
COMMENT ON COLUMN jobs.worker_scopes.queues IS
'The queues this login may claim from (1 to 1000 names); NULL: any queue.';
COMMENT ON COLUMN jobs.worker_scopes.updated_at IS
'When the scope was last set.';
