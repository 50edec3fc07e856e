-- pgtick 0017: the capped definitions, indexed, so that a claim asks cheaply whether any exists
-- (with none, and no limit, it locks and starts its batch in one statement), however many
-- uncapped definitions there are.

CREATE INDEX definitions_capped_idx ON jobs.definitions (id) WHERE max_concurrent_runs IS NOT NULL;
COMMENT ON INDEX jobs.definitions_capped_idx IS
'The definitions with max_concurrent_runs: jobs.claim reads whether any exists at every call.';
