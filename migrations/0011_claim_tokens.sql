-- pgtick 0011: a worker's identity is bound to a secret it cannot have guessed.
-- * jobs.runs.claim_token_hash: sha256 of the claim token the claiming worker presented
--   to jobs.claim (never the token itself). heartbeat, complete, complete_many, fail,
--   acknowledge_cancel and snooze touch a run claimed with a token only for a caller that
--   presents the same token; a run claimed without one keeps worker-id fencing.
-- * jobs.config.require_claim_token: when true, jobs.claim refuses a caller without a token.

ALTER TABLE jobs.runs ADD COLUMN claim_token_hash bytea;
COMMENT ON COLUMN jobs.runs.claim_token_hash IS
'sha256 of the claim token the claiming worker presented to jobs.claim (NULL: claimed without one, or not claimed). Its calls on this run must present the same token.';

ALTER TABLE jobs.config ADD COLUMN require_claim_token boolean NOT NULL DEFAULT FALSE;
COMMENT ON COLUMN jobs.config.require_claim_token IS
'When true, jobs.claim refuses (22023) a caller that presents no claim_token, so every claimed run is fenced by a secret, not only by its worker id.';

-- The worker calls gain a claim_token parameter (last, DEFAULT NULL): the old signatures
-- go, sql/claim.sql, worker.sql, retry.sql and flow.sql create the new ones.
DROP FUNCTION IF EXISTS jobs.claim(integer, text, text[], boolean, text[]);
DROP FUNCTION IF EXISTS jobs.heartbeat(bigint[], text);
DROP FUNCTION IF EXISTS jobs.complete(bigint, text, jsonb);
DROP FUNCTION IF EXISTS jobs.complete_many(bigint[], text);
DROP FUNCTION IF EXISTS jobs.fail(bigint, text, text[], text, text);
DROP FUNCTION IF EXISTS jobs.acknowledge_cancel(bigint, text, text);
DROP FUNCTION IF EXISTS jobs.snooze(bigint, text, interval);
