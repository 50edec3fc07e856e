-- pgtick 0029: a rate limit's period is at least a second, in the table as in jobs.set_limit.
-- A claim counts a limit's starts since its own transaction began less the period, and claims
-- come milliseconds apart: a period under a second holds almost none of them, so in practice
-- it removed the limit. A row written before this bound keeps its rate: its period becomes a
-- second and its limit the starts that rate allows in one (rounded up, at most 1,000,000).
UPDATE jobs.limits
SET
    rate_limit = least(1000000, ceil(rate_limit / extract(EPOCH FROM rate_period)))::integer,
    rate_period = interval '1 second',
    updated_at = now()
WHERE rate_period < interval '1 second';
ALTER TABLE jobs.limits
DROP CONSTRAINT limits_rate_period_check,
ADD CONSTRAINT limits_rate_period_check CHECK (rate_period >= '1 second' AND rate_period <= '1 day');
COMMENT ON COLUMN jobs.limits.rate_period IS 'The trailing window of the rate limit (1 second to 1 day).';
