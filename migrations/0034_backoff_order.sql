-- pgtick 0034: a retry delay's cap is at least its first delay, in the tables themselves.
-- jobs.set_retry_policy and the jobs.config trigger refuse a backoff_max below
-- backoff_initial; a direct write to the tables still stored one, and every delay was then
-- the cap. A pair stored that way becomes backoff_initial = backoff_max, which gives the same
-- delays: min(backoff_max * factor ^ n, backoff_max) is backoff_max for a factor of 1 or more.
UPDATE jobs.retry_policies SET backoff_initial = backoff_max
WHERE backoff_max < backoff_initial;
ALTER TABLE jobs.retry_policies
ADD CONSTRAINT retry_policies_backoff_order CHECK (backoff_max >= backoff_initial);
UPDATE jobs.config SET backoff_initial = backoff_max
WHERE backoff_max < backoff_initial;
ALTER TABLE jobs.config
ADD CONSTRAINT config_backoff_order CHECK (backoff_max >= backoff_initial);
