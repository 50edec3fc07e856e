-- pgtick 0033: the queues each worker claims from.
-- jobs.kinds_without_worker counted a kind as served by any live worker that registered it,
-- whatever queues that worker claims from: a kind's runs in a queue no worker serves waited
-- unseen. The registry now keeps the queues a worker registers (NULL: every queue, as for a
-- worker that registered before pgtick recorded them).
ALTER TABLE jobs.worker_registry ADD COLUMN queues text[];
COMMENT ON COLUMN jobs.worker_registry.queues IS
'The queues the worker claims from; NULL: every queue (also a worker registered before pgtick recorded them).';
