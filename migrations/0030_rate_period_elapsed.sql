-- pgtick 0030: a rate limit's period is elapsed time, in the table as in jobs.set_limit.
-- A claim counts a limit's starts since now() - rate_period, and an interval with a day (or
-- month) field steps back calendar days in the claiming session's TimeZone: 23 or 25 hours
-- across a DST change, so claimers in different zones counted different windows, and one in
-- a zone that had sprung forward started more runs than the rate allows. A row written before
-- this rule keeps its length: '1 day' becomes '24:00:00'.
UPDATE jobs.limits
SET
    rate_period = make_interval(secs => extract(EPOCH FROM rate_period)),
    updated_at = now()
WHERE
    extract(DAY FROM rate_period) <> 0
    OR extract(MONTH FROM rate_period) <> 0
    OR extract(YEAR FROM rate_period) <> 0;
ALTER TABLE jobs.limits
ADD CONSTRAINT limits_rate_period_elapsed CHECK (
    extract(DAY FROM rate_period) = 0 AND extract(MONTH FROM rate_period) = 0
    AND extract(YEAR FROM rate_period) = 0
);
COMMENT ON COLUMN jobs.limits.rate_period IS
'The trailing window of the rate limit (1 second to 1 day), as elapsed time: hours, minutes and seconds, no day field (1 day is 24:00:00).';
