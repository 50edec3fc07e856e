-- ===========================================================================
-- leases.sql: leader election and TTL leases.
--
-- Leadership is a session-scoped advisory lock on one documented key,
-- jobs._leader_key() (see the key table in helpers.sql). It is held for as long as the leader's
-- connection lives, so the leader must use a direct or session-mode
-- connection: a transaction-mode pooler would hand the lock to other clients.
--
-- Leases are rows with an owner and an expiry: acquire succeeds when the lease
-- is free or expired; renew and release only by the owner.
-- ===========================================================================

-- Private: does this session hold the leader lock?
CREATE OR REPLACE FUNCTION jobs._holds_lead() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT FROM pg_catalog.pg_locks AS l
         WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted
           AND l.database = (SELECT o.oid FROM pg_catalog.pg_database AS o WHERE o.datname = current_database())
           AND l.classid = (jobs._leader_key() >> 32)::oid
           AND l.objid = (jobs._leader_key() & 4294967295)::oid
           AND l.objsubid = 1)
$$;
COMMENT ON FUNCTION jobs._holds_lead() IS 'Private: true if this session holds the leader advisory lock.';

-- Try to become (or stay) the scheduler leader; never waits.
CREATE OR REPLACE FUNCTION jobs.try_lead(owner text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    IF jobs._holds_lead() THEN
        -- Already leading: the lock must not be stacked. Its leadership row is written again
        -- only if it is missing: the lock is the session's, but the row is transactional, and
        -- a transaction that took the lead and rolled back leaves the lock without its row (a
        -- leader jobs.leader would never show).
        IF EXISTS (SELECT FROM jobs._leadership AS l WHERE l.pid = pg_backend_pid()) THEN
            RETURN TRUE;
        END IF;
    ELSIF NOT pg_try_advisory_lock(jobs._leader_key()) THEN
        RETURN FALSE;
    END IF;
    -- jobs.leader always names its leader: a caller that gives no owner (jobs.try_lead() from
    -- psql or another language) is named by its application_name, else by its backend pid.
    INSERT INTO jobs._leadership AS l (singleton, pid, owner, since)
    VALUES (TRUE, pg_backend_pid(),
            left(coalesce(nullif(try_lead.owner, ''), nullif(current_setting('application_name'), ''),
                          'pid ' || pg_backend_pid()), 200),
            clock_timestamp())
    ON CONFLICT (singleton) DO UPDATE
       SET pid = excluded.pid, owner = excluded.owner, since = excluded.since;
    RETURN TRUE;
END $$;
COMMENT ON FUNCTION jobs.try_lead(text) IS 'Take the scheduler leader lock (session advisory lock) if free; true if this session leads. Idempotent. owner names the leader in jobs.leader (default: the application_name, else the backend pid).';

-- Give up leadership held by this session.
CREATE OR REPLACE FUNCTION jobs.resign() RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
BEGIN
    IF NOT jobs._holds_lead() THEN
        RETURN FALSE;
    END IF;
    DELETE FROM jobs._leadership AS l WHERE l.pid = pg_backend_pid();
    RETURN pg_advisory_unlock(jobs._leader_key());
END $$;
COMMENT ON FUNCTION jobs.resign() IS 'Release the leader lock if this session holds it; true if it did.';

-- Raise 22023 unless a lease's ttl is positive and at most a year. Measured in seconds (a year
-- being 365.25 days), not by interval comparison, which counts a year as 360 days and so
-- would refuse the '365 days' that pgtick lock --ttl and pgtick run --lease-ttl accept.
CREATE OR REPLACE FUNCTION jobs._check_ttl(ttl interval) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF ttl IS NULL OR extract(EPOCH FROM ttl) <= 0 OR extract(EPOCH FROM ttl) > extract(EPOCH FROM interval '1 year') THEN
        RAISE EXCEPTION 'ttl must be a positive interval of at most a year, got %', coalesce(ttl::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._refuse('ttl', jobs._mixed_signs_problem(ttl));
END $$;
COMMENT ON FUNCTION jobs._check_ttl(interval) IS 'Private: raises 22023 naming ttl unless it is a positive interval of at most a year whose parts have one sign (jobs.acquire_lease, jobs.renew_lease).';

-- Take a lease if it is free or expired.
CREATE OR REPLACE FUNCTION jobs.acquire_lease(name text, owner text, ttl interval) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    PERFORM jobs._check_name('name', acquire_lease.name);
    PERFORM jobs._check_text('owner', acquire_lease.owner, 200);
    PERFORM jobs._check_ttl(acquire_lease.ttl);
    -- The ttl as elapsed time (1 day as 24 hours): a day added to a timestamp is a calendar day
    -- of the caller's TimeZone, 23 hours on the day it springs forward.
    INSERT INTO jobs.leases AS l (name, owner, acquired_at, expires_at, consecutive_skips)
    VALUES (acquire_lease.name, acquire_lease.owner, clock_timestamp(),
            clock_timestamp() + make_interval(secs => extract(EPOCH FROM acquire_lease.ttl)), 0)
    ON CONFLICT (name) DO UPDATE
       SET owner = excluded.owner, acquired_at = excluded.acquired_at,
           expires_at = excluded.expires_at, consecutive_skips = 0
     WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp();
    IF FOUND THEN
        RETURN TRUE;
    END IF;
    UPDATE jobs.leases AS l
       SET consecutive_skips = l.consecutive_skips + 1, last_skipped_at = clock_timestamp()
     WHERE l.name = acquire_lease.name;
    RETURN FALSE;
END $$;
COMMENT ON FUNCTION jobs.acquire_lease(text, text, interval) IS 'Take the named lease for ttl (elapsed time: a day is 24 hours whatever the session''s TimeZone) if it is free or expired; false (and a counted skip) if someone else holds it.';

-- Extend a lease; only its owner can, and only while it has not expired.
CREATE OR REPLACE FUNCTION jobs.renew_lease(name text, owner text, ttl interval) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    PERFORM jobs._check_name('name', renew_lease.name);
    PERFORM jobs._check_text('owner', renew_lease.owner, 200);
    PERFORM jobs._check_ttl(renew_lease.ttl);
    UPDATE jobs.leases AS l
       SET expires_at = clock_timestamp() + make_interval(secs => extract(EPOCH FROM renew_lease.ttl))
     WHERE l.name = renew_lease.name AND l.owner = renew_lease.owner AND l.expires_at > clock_timestamp();
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION jobs.renew_lease(text, text, interval) IS 'Extend the lease to now + ttl (elapsed time) if owner still holds it (not expired); false otherwise: stop the guarded work.';

-- Release a lease; only its owner can.
CREATE OR REPLACE FUNCTION jobs.release_lease(name text, owner text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    PERFORM jobs._check_name('name', release_lease.name);
    PERFORM jobs._check_text('owner', release_lease.owner, 200);
    UPDATE jobs.leases AS l SET owner = NULL, expires_at = '-infinity'
     WHERE l.name = release_lease.name AND l.owner = release_lease.owner;
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION jobs.release_lease(text, text) IS 'Release the lease if owner holds it; true if it did.';
