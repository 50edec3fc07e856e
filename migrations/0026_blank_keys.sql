-- pgtick 0026: a key of only spaces is refused wherever it is written, not only by the functions.
-- jobs.enqueue, jobs.enqueue_many and jobs.define refuse an idempotency, unique or concurrency key
-- that is empty or only white space (jobs._check_key), but the bounds of the columns checked only
-- the length: a direct INSERT or UPDATE (another language writing a row, an operator's fix in
-- psql) stored a blank key, which then stood for one job, or one tenant, for every writer that
-- sent it. Each key column now carries a second constraint, named for its field
-- (runs_idempotency_key_not_blank ...), with the rule jobs._check_key applies: blank once the
-- control characters (tabs, line breaks) are taken out and the white space that jobs._blank
-- knows is trimmed. The rule is written out here rather than calling jobs._blank, so the
-- constraint needs no function of the schema (the function files come after the migrations).
-- The keys are checked by domains, only where a value of the column is written: a claim, a
-- heartbeat or a completion writes none of them, and a retry's row copies its keys from a run
-- (values of the domain already: not checked again). All are added NOT VALID: a database may
-- hold blank keys written before (by an earlier jobs.enqueue or directly), and those rows stay
-- as they are; the history tables, which receive only copies of runs, are left unchecked so
-- that moving such a run there cannot fail. docs/operations.md says how to find and fix them.

ALTER DOMAIN jobs.run_idempotency_key
ADD CONSTRAINT runs_idempotency_key_not_blank
CHECK (btrim(
    regexp_replace(value, '[[:cntrl:]]', '', 'g'),
    U&' \00A0\1680\2000\2001\2002\2003\2004\2005\2006\2007\2008\2009\200A\2028\2029\202F\205F\3000'
) <> '')
NOT VALID;

ALTER DOMAIN jobs.run_unique_key
ADD CONSTRAINT runs_unique_key_not_blank
CHECK (btrim(
    regexp_replace(value, '[[:cntrl:]]', '', 'g'),
    U&' \00A0\1680\2000\2001\2002\2003\2004\2005\2006\2007\2008\2009\200A\2028\2029\202F\205F\3000'
) <> '')
NOT VALID;

ALTER DOMAIN jobs.run_concurrency_key
ADD CONSTRAINT runs_concurrency_key_not_blank
CHECK (btrim(
    regexp_replace(value, '[[:cntrl:]]', '', 'g'),
    U&' \00A0\1680\2000\2001\2002\2003\2004\2005\2006\2007\2008\2009\200A\2028\2029\202F\205F\3000'
) <> '')
NOT VALID;

-- The definitions' concurrency key gets a domain of its own too, rather than a second CHECK of
-- jobs.definitions: a table's CHECK is tested on every UPDATE of a row, whatever it changes, so
-- a definition that holds a blank key from before could then not be changed at all (its cursor
-- moved, its failure recorded, a pause), and a domain is tested only where the key is written.
-- Created empty, the column moved onto it (text to a domain over text: no rewrite, no scan),
-- then its constraint added NOT VALID, as 0016 did for the runs' fields.
CREATE DOMAIN jobs.definition_concurrency_key AS text;
COMMENT ON DOMAIN jobs.definition_concurrency_key IS
'jobs.definitions.concurrency_key: not blank (its length: definitions_concurrency_key_check).';
ALTER TABLE jobs.definitions ALTER COLUMN concurrency_key TYPE jobs.definition_concurrency_key;
ALTER DOMAIN jobs.definition_concurrency_key
ADD CONSTRAINT definitions_concurrency_key_not_blank
CHECK (btrim(
    regexp_replace(value, '[[:cntrl:]]', '', 'g'),
    U&' \00A0\1680\2000\2001\2002\2003\2004\2005\2006\2007\2008\2009\200A\2028\2029\202F\205F\3000'
) <> '')
NOT VALID;
