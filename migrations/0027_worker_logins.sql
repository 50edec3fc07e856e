-- pgtick 0027: the login that registered each worker.
-- A worker id is no secret, and any jobs_worker login could register, stamp alive or mark
-- stopped a worker id that another login's worker uses: jobs.workers could not tell such a
-- line from the real one. The registry now keeps the login (session_user) that registered
-- the worker; only that login's jobs.worker_seen and jobs.worker_stopped change the row, and
-- a registration by another login takes the row over in plain sight (login changes).
ALTER TABLE jobs.worker_registry ADD COLUMN login name;
COMMENT ON COLUMN jobs.worker_registry.login IS
'The login (session_user) that registered the worker; only it may stamp the row seen or stopped. NULL: registered before pgtick recorded it (the first login to stamp it then takes it).';
