-- ===========================================================================
-- schedule.sql: definitions and materialization.
--
-- The leader computes occurrences in the driver (RRULE/cron in the definition's
-- time zone) and hands them to jobs.materialize(), which advances the cursor
-- (next_run_at) with a compare-and-set and inserts the runs in the same
-- commit. A stale leader's call matches nothing and returns 0, and the unique
-- index runs_occurrence_uniq makes a second insert of an occurrence
-- impossible anyway: each occurrence is materialized exactly once.
-- ===========================================================================

-- Keep the zone cache current with this server's time zone database.
INSERT INTO jobs._zones (name)
SELECT z.name FROM pg_catalog.pg_timezone_names AS z
ON CONFLICT DO NOTHING;

-- Private: what is wrong with a zone name (NULL: nothing). Beside an unknown name, a name
-- that is also a time zone abbreviation of another offset in some season (CET, EET, MET,
-- WET: zones with summer time, abbreviations of their winter offset) is refused, since
-- PostgreSQL reads `AT TIME ZONE 'CET'` as the abbreviation: the local times it would show
-- (jobs.definition_health, the dashboard) would be an hour off all summer.
CREATE OR REPLACE FUNCTION jobs._zone_problem(zone text) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_session text;
    v_differs boolean;
BEGIN
    IF zone IS NULL OR NOT (
        EXISTS (SELECT FROM jobs._zones AS z WHERE z.name = zone)
        OR EXISTS (SELECT FROM pg_catalog.pg_timezone_names AS z WHERE z.name = zone)
    ) THEN
        RETURN format('timezone %s is not a known IANA time zone name', jobs._shown(zone));
    END IF;
    -- Names of the time zone files that are no place: the host's own zone (localtime, whose
    -- rules the scheduler would read from its own host), the placeholder Factory, and the
    -- copies of every zone under posix/ and right/ (right/ counts leap seconds).
    IF zone IN ('localtime', 'posixrules', 'Factory') OR zone ~ '^(posix|right)/' THEN
        RETURN format('timezone %s is not a place''s IANA time zone: give one such as %s',
                      quote_literal(zone),
                      CASE WHEN zone ~ '^(posix|right)/' THEN regexp_replace(zone, '^(posix|right)/', '')
                           ELSE 'Europe/Paris or America/New_York' END);
    END IF;
    -- An abbreviation is one word: a name with a slash (nearly every region's) is none.
    IF strpos(zone, '/') = 0 AND EXISTS (SELECT FROM pg_catalog.pg_timezone_abbrevs AS a WHERE a.abbrev = upper(zone)) THEN
        -- The zone's own offsets, read as the session's zone (which takes names, not
        -- abbreviations), in January and July of this year.
        v_session := current_setting('TimeZone');
        PERFORM set_config('TimeZone', zone, TRUE);
        SELECT bool_or(make_interval(secs => extract(timezone FROM t.at)) <> a.utc_offset)
          INTO v_differs
          FROM pg_catalog.pg_timezone_abbrevs AS a,
               (VALUES (date_trunc('year', now())), (date_trunc('year', now()) + interval '6 months')) AS t (at)
         WHERE a.abbrev = upper(zone);
        PERFORM set_config('TimeZone', v_session, TRUE);
        IF v_differs THEN
            RETURN format('timezone %s is also the abbreviation of a fixed offset, which PostgreSQL reads '
                          'it as: give the region''s zone instead, such as Europe/Paris or Europe/Athens',
                          quote_literal(zone));
        END IF;
    END IF;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION jobs._zone_problem(text) IS 'Private: NULL for a known IANA time zone name of a place (not localtime, Factory or a posix/ or right/ copy) that PostgreSQL does not read as a fixed-offset abbreviation, else what is wrong with it.';

-- Private: raise 22023 unless zone is an IANA time zone name known to the server.
CREATE OR REPLACE FUNCTION jobs._check_zone(zone text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_problem text := jobs._zone_problem(zone);
BEGIN
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION '%', v_problem
            USING ERRCODE = '22023', HINT = 'Use a name such as Europe/Sofia or UTC (see pg_timezone_names).';
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_zone(text) IS 'Private: raises 22023 unless the text names a known IANA time zone.';

-- Private: a cron field's value: a number (its range checked by the caller), or one of the
-- field's names (the first of them is worth base); NULL when it is neither.
CREATE OR REPLACE FUNCTION jobs._cron_number(value text, names text[], base integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value ~ '^[0-9]{1,9}$' THEN
        RETURN value::integer;
    END IF;
    RETURN base + array_position(names, upper(value)) - 1;
END $$;
COMMENT ON FUNCTION jobs._cron_number(text, text[], integer) IS 'Private: a cron field value as a number (digits, or a month or weekday name); NULL when it is neither.';


-- Private: what is wrong with a date-time of RRULE text (DTSTART, RDATE, EXDATE, UNTIL), as the
-- driver reads one: YYYYMMDD, or YYYYMMDDTHHMMSS with an optional Z, a day the calendar has.
CREATE OR REPLACE FUNCTION jobs._rrule_date_time_problem(place text, item text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_parts text[] := regexp_match(upper(btrim(item, E' \t\n\r\f\v')),
                                   '^([0-9]{4})([0-9]{2})([0-9]{2})(?:T([0-9]{2})([0-9]{2})([0-9]{2})Z?)?$');
BEGIN
    IF v_parts IS NULL OR v_parts[1]::integer < 1 OR v_parts[2]::integer NOT BETWEEN 1 AND 12 THEN
        RETURN format('schedule: %s: invalid date-time %L', place, item);
    END IF;
    IF v_parts[3]::integer NOT BETWEEN 1 AND extract(DAY FROM (make_date(v_parts[1]::integer, v_parts[2]::integer, 1)
                                                             + interval '1 month' - interval '1 day'))
       OR coalesce(v_parts[4]::integer, 0) > 23 OR coalesce(v_parts[5]::integer, 0) > 59
       OR coalesce(v_parts[6]::integer, 0) > 59 THEN
        RETURN format('schedule: %s: invalid date-time %L', place, item);
    END IF;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION jobs._rrule_date_time_problem(text, text) IS 'Private: what is wrong with a date-time of RRULE text (YYYYMMDD or YYYYMMDDTHHMMSS[Z], a real day and time), or NULL.';

-- Private: what is wrong with RRULE text as SQL can tell without its time zone and start: the
-- properties and their parameters, the date-times, and each rule's parts and values, checked in
-- the order the driver checks them and said as it says them (the driver also finds a rule that
-- never occurs, and a TZID that names no zone).
CREATE OR REPLACE FUNCTION jobs._rrule_problem(schedule text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    c_space CONSTANT text := E' \t\n\r\f\v';
    -- BY parts of numbers: smallest and largest absolute value, and whether negative ones count
    -- from the end (none may be 0 then).
    c_lists CONSTANT jsonb := '{"BYSECOND": [0, 59, false], "BYMINUTE": [0, 59, false], "BYHOUR": [0, 23, false],
                                "BYMONTH": [1, 12, false], "BYMONTHDAY": [1, 31, true], "BYYEARDAY": [1, 366, true],
                                "BYWEEKNO": [1, 53, true], "BYSETPOS": [1, 366, true]}';
    -- The longest INTERVAL of each frequency: a thousand years.
    c_most CONSTANT jsonb := '{"YEARLY": 1000, "MONTHLY": 12000, "WEEKLY": 52142, "DAILY": 365000,
                               "HOURLY": 8760000, "MINUTELY": 525600000, "SECONDLY": 31536000000}';
    v_rules text[] := '{}';
    v_has_start boolean := FALSE;
    v_has_dates boolean := FALSE;
    v_line text;
    v_head text;
    v_value text;
    v_prop text;
    v_params text[];
    v_param text;
    v_name text;
    v_item text;
    v_rule text;
    v_part text;
    v_names text[];
    v_values text[];
    v_freq text;
    v_list jsonb;
    v_number numeric;
    v_day text[];
    v_problem text;
    i integer;
BEGIN
    FOREACH v_line IN ARRAY regexp_split_to_array(schedule, '\r\n|\r|\n') LOOP
        v_line := btrim(v_line, c_space);
        CONTINUE WHEN v_line = '';
        IF strpos(v_line, ':') = 0 THEN  -- a rule alone: FREQ=...;...
            v_rules := v_rules || v_line;
            CONTINUE;
        END IF;
        v_head := split_part(v_line, ':', 1);
        v_value := substr(v_line, strpos(v_line, ':') + 1);
        v_params := regexp_split_to_array(v_head, ';');
        v_prop := upper(btrim(v_params[1], c_space));
        v_params := v_params[2:];
        IF v_prop = 'RRULE' THEN
            IF cardinality(v_params) > 0 THEN
                RETURN format('schedule: RRULE: unsupported parameter %L', v_params[1]);
            END IF;
            v_rules := v_rules || v_value;
        ELSIF v_prop IN ('DTSTART', 'RDATE', 'EXDATE') THEN
            IF v_prop = 'DTSTART' AND v_has_start THEN
                RETURN 'schedule: DTSTART: given more than once';
            END IF;
            FOREACH v_param IN ARRAY v_params LOOP
                v_name := upper(btrim(split_part(v_param, '=', 1), c_space));
                CONTINUE WHEN v_name = 'TZID';
                IF v_name <> 'VALUE' OR strpos(v_param, '=') = 0
                   OR upper(btrim(substr(v_param, strpos(v_param, '=') + 1), c_space)) NOT IN ('DATE-TIME', 'DATE') THEN
                    RETURN format('schedule: %s: unsupported parameter %L', v_prop, v_param);
                END IF;
            END LOOP;
            FOREACH v_item IN ARRAY regexp_split_to_array(v_value, ',') LOOP
                v_problem := jobs._rrule_date_time_problem(v_prop, v_item);
                IF v_problem IS NOT NULL THEN
                    RETURN v_problem;
                END IF;
            END LOOP;
            IF v_prop = 'DTSTART' THEN
                IF strpos(v_value, ',') > 0 THEN
                    RETURN 'schedule: DTSTART: expected exactly one date-time';
                END IF;
                v_has_start := TRUE;
            END IF;
            v_has_dates := v_has_dates OR v_prop = 'RDATE';
        ELSE
            RETURN format('schedule: unsupported property %L (use DTSTART, RRULE, RDATE, EXDATE)', v_prop);
        END IF;
    END LOOP;
    IF cardinality(v_rules) = 0 AND NOT v_has_dates THEN
        RETURN 'schedule: RRULE: no RRULE or RDATE line';
    END IF;
    FOREACH v_rule IN ARRAY v_rules LOOP
        v_names := '{}';
        v_values := '{}';
        FOREACH v_part IN ARRAY string_to_array(btrim(v_rule, c_space), ';') LOOP
            CONTINUE WHEN btrim(v_part, c_space) = '';
            v_name := upper(btrim(split_part(v_part, '=', 1), c_space));
            v_value := upper(btrim(substr(v_part, strpos(v_part, '=') + 1), c_space));
            IF strpos(v_part, '=') = 0 OR v_name = '' OR v_value = '' THEN
                RETURN format('schedule: RRULE: malformed part %L (expected NAME=VALUE)', v_part);
            END IF;
            IF v_name = ANY (v_names) THEN
                RETURN format('schedule: RRULE: %s given more than once', v_name);
            END IF;
            v_names := v_names || v_name;
            v_values := v_values || v_value;
        END LOOP;
        v_freq := v_values[array_position(v_names, 'FREQ')];
        IF v_freq IS NULL THEN
            RETURN 'schedule: RRULE: missing FREQ';
        END IF;
        IF NOT c_most ? v_freq THEN
            RETURN format('schedule: RRULE: unknown FREQ %L', v_freq);
        END IF;
        IF 'COUNT' = ANY (v_names) AND 'UNTIL' = ANY (v_names) THEN
            RETURN 'schedule: RRULE: COUNT and UNTIL cannot both be given';
        END IF;
        FOR i IN 1 .. cardinality(v_names) LOOP
            v_name := v_names[i];
            v_value := v_values[i];
            CONTINUE WHEN v_name = 'FREQ';
            -- RFC 5545: parts that only make sense with some frequencies.
            IF (v_name = 'BYWEEKNO' AND v_freq <> 'YEARLY')
               OR (v_name = 'BYYEARDAY' AND v_freq IN ('MONTHLY', 'WEEKLY', 'DAILY'))
               OR (v_name = 'BYMONTHDAY' AND v_freq = 'WEEKLY') THEN
                RETURN format('schedule: RRULE: %s cannot be used with FREQ=%s', v_name, v_freq);
            END IF;
            v_list := c_lists -> v_name;
            IF v_list IS NOT NULL THEN
                FOREACH v_item IN ARRAY regexp_split_to_array(v_value, ',') LOOP
                    IF v_item !~ (CASE WHEN (v_list ->> 2)::boolean THEN '^[+-]?[0-9]+$' ELSE '^[0-9]+$' END) THEN
                        RETURN format('schedule: RRULE: invalid %s value %L', v_name, v_item);
                    END IF;
                    v_number := v_item::numeric;
                    IF abs(v_number) NOT BETWEEN (v_list ->> 0)::integer AND (v_list ->> 1)::integer
                       OR ((v_list ->> 2)::boolean AND v_number = 0) THEN
                        RETURN format('schedule: RRULE: %s value %s out of range %s-%s%s', v_name, v_number,
                                      v_list ->> 0, v_list ->> 1,
                                      CASE WHEN (v_list ->> 2)::boolean
                                           THEN format(' or -%s--%s', v_list ->> 1, v_list ->> 0) ELSE '' END);
                    END IF;
                END LOOP;
            ELSIF v_name = 'INTERVAL' THEN
                IF v_value !~ '^[0-9]+$' OR v_value::numeric = 0 THEN
                    RETURN format('schedule: RRULE: INTERVAL must be a positive integer, got %L', v_value);
                END IF;
                IF v_value::numeric > (c_most ->> v_freq)::numeric THEN
                    RETURN format('schedule: RRULE: INTERVAL must be at most %s, got %s',
                                  to_char((c_most ->> v_freq)::bigint, 'FM999,999,999,999'), v_value);
                END IF;
            ELSIF v_name = 'COUNT' THEN
                IF v_value !~ '^[0-9]+$' THEN
                    RETURN format('schedule: RRULE: COUNT must be a non-negative integer, got %L', v_value);
                END IF;
            ELSIF v_name = 'UNTIL' THEN
                v_problem := jobs._rrule_date_time_problem('RRULE: UNTIL', v_value);
                IF v_problem IS NOT NULL THEN
                    RETURN v_problem;
                END IF;
            ELSIF v_name = 'WKST' THEN
                IF v_value NOT IN ('MO', 'TU', 'WE', 'TH', 'FR', 'SA', 'SU') THEN
                    RETURN format('schedule: RRULE: invalid WKST value %L', v_value);
                END IF;
            ELSIF v_name = 'BYDAY' THEN
                FOREACH v_item IN ARRAY regexp_split_to_array(v_value, ',') LOOP
                    v_day := regexp_match(v_item, '^([+-]?[0-9]{1,2})?(MO|TU|WE|TH|FR|SA|SU)$');
                    IF v_day IS NULL THEN
                        RETURN format('schedule: RRULE: invalid BYDAY value %L', v_item);
                    END IF;
                    CONTINUE WHEN v_day[1] IS NULL;
                    IF abs(v_day[1]::integer) NOT BETWEEN 1 AND 53 THEN
                        RETURN format('schedule: RRULE: BYDAY value %L ordinal out of range 1-53', v_item);
                    END IF;
                    IF v_freq NOT IN ('MONTHLY', 'YEARLY') THEN
                        RETURN format('schedule: RRULE: BYDAY value %L needs FREQ=MONTHLY or YEARLY', v_item);
                    END IF;
                    -- Counted within the month (FREQ=MONTHLY, or BYMONTH): five of each at most.
                    IF (v_freq = 'MONTHLY' OR 'BYMONTH' = ANY (v_names)) AND abs(v_day[1]::integer) > 5 THEN
                        RETURN format('schedule: RRULE: BYDAY value %L ordinal out of range 1-5 '
                                      '(a month has at most five of each weekday)', v_item);
                    END IF;
                END LOOP;
            ELSE
                RETURN format('schedule: RRULE: unknown part %L', v_name);
            END IF;
        END LOOP;
    END LOOP;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION jobs._rrule_problem(text) IS 'Private: what is wrong with RRULE text as SQL can tell (properties and their parameters, date-times, each rule''s parts and values, said as the driver says them), or NULL.';

-- Private: what is wrong with schedule text, or NULL. The driver parses a schedule fully
-- before it saves one (pgtick.schedule); this is what SQL alone can tell, in the driver's
-- words, for a definition written from psql: a control character (but the line breaks
-- between RRULE lines, and tabs), the shape (5 cron fields or a macro, or an RRULE
-- with FREQ=), each cron field's values, ranges and steps as cronie reads them, a cron day of
-- the month that none of its months has (31 February: it never runs), and an RRULE's FREQ and
-- its BYMONTH, BYHOUR, BYMINUTE and BYSECOND values. (Whether an RRULE has any occurrence at
-- all is the driver's to say: the scheduler records it in schedule_error.)
CREATE OR REPLACE FUNCTION jobs._schedule_problem(schedule text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    c_fields CONSTANT text[] := ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'];
    c_low CONSTANT integer[] := ARRAY[0, 0, 1, 1, 0];
    c_high CONSTANT integer[] := ARRAY[59, 23, 31, 12, 7];
    c_restarts CONSTANT text[] := ARRAY['hour', 'day', 'month', 'year', 'week'];
    c_units CONSTANT text[] := ARRAY['minutes', 'hours', 'days', 'months', 'days'];
    c_freqs CONSTANT text[] := ARRAY['MINUTELY', 'HOURLY', 'DAILY', 'MONTHLY', 'DAILY'];
    c_months CONSTANT text[] := ARRAY['JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG', 'SEP', 'OCT', 'NOV', 'DEC'];
    c_days CONSTANT text[] := ARRAY['SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT'];
    v_fields text[];
    v_names text[];
    v_base integer;
    v_where text;
    v_item text;
    v_span text;
    v_step text;
    v_size integer;
    v_ends integer[];
    v_end text;
    v_first integer;
    v_last integer;
    v_first_day integer := 31;  -- the earliest day of the month the cron field names
    v_longest integer := 0;     -- the most days any month the cron field names has
    i integer;
BEGIN
    -- Shown by every console that lists definitions: no escape sequence, only the line
    -- breaks between the lines of an RRULE text (and tabs, white space to cron).
    IF schedule ~ '[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]' THEN
        RETURN format('schedule must not contain control characters (but line breaks), got %s',
                      to_json(left(schedule, 200)));
    END IF;
    IF schedule ~* '^\s*@(yearly|annually|monthly|weekly|daily|midnight|hourly)\s*$' THEN
        RETURN NULL;
    END IF;
    IF schedule ~ '^\s*[0-9A-Za-z*/,-]+(\s+[0-9A-Za-z*/,-]+){4}\s*$' THEN
        v_fields := regexp_split_to_array(btrim(schedule, E' \t\n\r'), '\s+');
        FOR i IN 1 .. 5 LOOP
            v_where := format('schedule: cron field %L', c_fields[i]);
            v_names := CASE i WHEN 4 THEN c_months WHEN 5 THEN c_days ELSE '{}' END;
            v_base := CASE i WHEN 4 THEN 1 ELSE 0 END;
            v_size := c_high[i] - c_low[i] + 1;
            FOREACH v_item IN ARRAY string_to_array(v_fields[i], ',') LOOP
                IF v_item = '' THEN
                    RETURN format('%s has an empty list item', v_where);
                END IF;
                v_span := split_part(v_item, '/', 1);
                v_step := CASE WHEN strpos(v_item, '/') > 0 THEN substr(v_item, strpos(v_item, '/') + 1) END;
                IF v_span <> '*' THEN
                    IF v_step IS NOT NULL AND strpos(v_span, '-') = 0 THEN
                        RETURN format('%s step %L needs ''*'' or a range before ''/''', v_where, v_item);
                    END IF;
                    v_ends := '{}';
                    FOREACH v_end IN ARRAY CASE WHEN strpos(v_span, '-') > 0
                                                THEN ARRAY[split_part(v_span, '-', 1), substr(v_span, strpos(v_span, '-') + 1)]
                                                ELSE ARRAY[v_span] END LOOP
                        v_ends := v_ends || jobs._cron_number(v_end, v_names, v_base);
                        IF v_ends[cardinality(v_ends)] IS NULL THEN
                            RETURN format('%s %s %L', v_where,
                                          CASE WHEN cardinality(v_names) > 0 AND v_end ~ '^[A-Za-z]+$'
                                               THEN 'unknown name' ELSE 'invalid value' END, v_end);
                        END IF;
                        IF v_ends[cardinality(v_ends)] NOT BETWEEN c_low[i] AND c_high[i] THEN
                            RETURN format('%s value %s out of range %s-%s', v_where, v_ends[cardinality(v_ends)],
                                          c_low[i], c_high[i]);
                        END IF;
                    END LOOP;
                    IF cardinality(v_ends) = 2 AND v_ends[1] > v_ends[2]
                       AND NOT (i = 5 AND v_ends[2] = 0) THEN  -- cronie: fri-sun, 5-0 end at 7
                        RETURN format('%s range %L runs backwards', v_where, v_span);
                    END IF;
                END IF;
                IF v_step IS NOT NULL AND (v_step !~ '^[0-9]{1,9}$' OR v_step::integer < 1) THEN
                    RETURN format('%s step %L in %L must be 1-%s', v_where, v_step, v_item, v_size);
                END IF;
                IF v_step IS NOT NULL AND v_step::integer > v_size THEN
                    RETURN format('%s step %L in %L must be 1-%s: cron steps restart every %s; for every %s %s '
                                  'write an RRULE such as FREQ=%s;INTERVAL=%s', v_where, v_step, v_item, v_size,
                                  c_restarts[i], v_step, c_units[i], c_freqs[i], v_step);
                END IF;
                v_first := CASE WHEN v_span = '*' THEN c_low[i] ELSE v_ends[1] END;
                v_last := CASE WHEN v_span = '*' THEN c_high[i] ELSE v_ends[cardinality(v_ends)] END;
                IF i = 3 THEN
                    v_first_day := least(v_first_day, v_first);
                ELSIF i = 4 THEN  -- February counts 29 days: a leap year has them
                    SELECT greatest(v_longest, max((ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])[m]))
                      INTO v_longest
                      FROM generate_series(v_first, v_last, coalesce(v_step::integer, 1)) AS m;
                END IF;
            END LOOP;
        END LOOP;
        -- A day of the month that none of the months has (31 February) never comes, unless a
        -- restricted day of the week also picks days (Vixie cron: either field matches then).
        IF v_fields[3] !~ '^\*' AND v_fields[5] ~ '^\*' AND v_first_day > v_longest THEN
            RETURN format('schedule: cron: schedule has no occurrences (day-of-month %L never occurs in month %L)',
                          v_fields[3], v_fields[4]);
        END IF;
        RETURN NULL;
    END IF;
    -- (An RFC 5545 recurrence set may also be dates alone: RDATE lines without a rule.)
    -- (The driver reads a part's name and value without the spaces around them: FREQ = DAILY.)
    IF schedule !~* '(^|[\s:;])FREQ\s*=' AND schedule !~* '(^|\n)\s*RDATE\s*[;:]' THEN
        RETURN format('schedule %s is neither a 5-field cron expression nor an RRULE (FREQ=... or RDATE:...)',
                      jobs._shown(schedule));
    END IF;
    RETURN jobs._rrule_problem(schedule);
END $$;
COMMENT ON FUNCTION jobs._schedule_problem(text) IS 'Private: what is wrong with schedule text as SQL can tell (a control character but a line break or tab, shape, cron field values, ranges and steps, a cron day of the month none of its months has, RRULE text as jobs._rrule_problem checks it), or NULL.';

-- Private: raise 22023 with what jobs._schedule_problem finds wrong with the schedule text.
CREATE OR REPLACE FUNCTION jobs._check_schedule_shape(schedule text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_problem text;
BEGIN
    PERFORM jobs._check_text('schedule', schedule, 4000);
    v_problem := jobs._schedule_problem(schedule);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION '%', v_problem USING ERRCODE = '22023';
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_schedule_shape(text) IS 'Private: raises 22023 with what jobs._schedule_problem finds wrong with the schedule text.';

-- Private: after a schedule change, remove the runs the old schedule materialized ahead of time.
-- A run is dropped when its occurrence is at or after the instant the new schedule takes over
-- (takeover, the definition's new cursor_from), whatever its jittered start: a jittered run may
-- start after the change for an occurrence before it, and such a run stays. A run materialized
-- before runs recorded their occurrence is dropped when it starts after boundary (the change
-- plus the old jitter). Dropped runs never started, so they are deleted, not cancelled: the new
-- schedule's cursor starts at takeover, so it re-creates every occurrence the two schedules
-- share, exactly once, and a cancelled row would hold that occurrence's place in
-- runs_occurrence_uniq and lose it. Runs waiting on a dropped run are cancelled
-- (DependencyFailed). Rows a claimer holds are waited for, in id order, and checked again.
-- moved_only (a resume: the schedule is the same, only the jitter may have changed) drops only
-- the runs whose start is not their occurrence delayed by the definition's current jitter; the
-- others are the runs the cursor would make again, and they stay, with their ids. Returns how
-- many runs were dropped.
DROP FUNCTION IF EXISTS jobs._drop_superseded(bigint[], timestamptz[]);
DROP FUNCTION IF EXISTS jobs._drop_superseded(bigint[], timestamptz[], timestamptz[]);
CREATE OR REPLACE FUNCTION jobs._drop_superseded(
    definition_ids bigint[], takeovers timestamptz[], boundaries timestamptz[], moved_only boolean DEFAULT FALSE
)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_ids bigint[];
    v_count integer;
BEGIN
    SELECT array_agg(x.id ORDER BY x.id) INTO v_ids
      FROM (SELECT r.id FROM jobs.runs AS r
              JOIN unnest(definition_ids, takeovers, boundaries) AS b (definition_id, takeover, boundary)
                ON b.definition_id = r.definition_id
              JOIN jobs.definitions AS d ON d.id = r.definition_id
             WHERE r.status = 'QUEUED' AND r.origin = 'schedule'
               AND coalesce(r.occurrence_at >= b.takeover, r.scheduled_for > b.boundary)
               AND (NOT moved_only
                    OR r.scheduled_for <> r.occurrence_at + jobs.jitter_offset(d.id, r.occurrence_at, d.jitter))
             ORDER BY r.id
               FOR UPDATE OF r) AS x;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM jobs._cascade_dependency_failure(v_ids);  -- runs waiting on them
    DELETE FROM jobs.runs AS r WHERE r.id = ANY (v_ids) AND r.status = 'QUEUED';
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END $$;
COMMENT ON FUNCTION jobs._drop_superseded(bigint[], timestamptz[], timestamptz[], boolean) IS 'Private: delete the QUEUED scheduled runs of each definition whose occurrence is at or after its takeover (without a recorded occurrence: whose start is after its boundary); a schedule change: the new schedule re-creates the occurrences it shares. moved_only: only those whose start is not their occurrence delayed by the current jitter (a resume). Runs waiting on them are cancelled. Returns how many were deleted.';

-- Private: give the QUEUED scheduled runs of these definitions the definitions' current run
-- settings (kind, payload, priority, max_attempts, timeouts, queue, concurrency key), as
-- materializing them now would. Rows a claimer holds are waited for, in id order, and checked
-- again: a run claimed meanwhile keeps its settings (a snoozed run, QUEUED again, takes the
-- new ones for its next start). Returns how many runs changed.
CREATE OR REPLACE FUNCTION jobs._restate_queued(definition_ids bigint[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_ids bigint[];
    v_count integer;
BEGIN
    SELECT array_agg(x.id ORDER BY x.id) INTO v_ids
      FROM (SELECT r.id FROM jobs.runs AS r
             WHERE r.definition_id = ANY (definition_ids) AND r.status = 'QUEUED' AND r.origin = 'schedule'
             ORDER BY r.id
               FOR NO KEY UPDATE OF r) AS x;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    UPDATE jobs.runs AS r
       SET kind = d.kind, payload = d.payload, priority = d.priority, max_attempts = d.max_attempts,
           timeout = d.timeout, heartbeat_timeout = d.heartbeat_timeout, queue = d.queue,
           concurrency_key = d.concurrency_key
      FROM jobs.definitions AS d
     WHERE r.id = ANY (v_ids) AND r.status = 'QUEUED' AND d.id = r.definition_id
       AND (r.kind, r.payload, r.priority, r.max_attempts, r.timeout, r.heartbeat_timeout, r.queue,
            r.concurrency_key)
           IS DISTINCT FROM (d.kind, d.payload, d.priority, d.max_attempts, d.timeout, d.heartbeat_timeout,
                             d.queue, d.concurrency_key);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        PERFORM jobs._notify();  -- another queue or kind: its workers hear of the runs now
    END IF;
    RETURN v_count;
END $$;
COMMENT ON FUNCTION jobs._restate_queued(bigint[]) IS 'Private: give the QUEUED scheduled runs of these definitions their definition''s current kind, payload, priority, max_attempts, timeouts, queue and concurrency key (a re-declaration); RUNNING runs keep theirs. Returns how many runs changed.';

-- Private: where a changed schedule takes over (its cursor_from). The old schedule has runs
-- for its occurrences before its cursor (next_run_at); those after the change are dropped
-- (jobs._drop_superseded). So the new schedule starts at the change, or at the old cursor
-- when that is earlier: a scheduler that had not yet materialized up to the change (it was
-- behind, or the old schedule's own cursor was not set yet because it had just changed) leaves
-- no window that neither schedule covers. A definition that was not live (disabled, finished,
-- a one-shot, a schedule error) starts at the change.
CREATE OR REPLACE FUNCTION jobs._takeover(old jobs.definitions) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN old.schedule IS NOT NULL AND old.enabled AND old.finished_at IS NULL
                     AND old.schedule_error IS NULL
                THEN least(now(), coalesce(old.next_run_at, old.cursor_from))
                ELSE now() END
$$;
COMMENT ON FUNCTION jobs._takeover(jobs.definitions) IS 'Private: the instant a changed schedule starts from: the change (now), or the old live schedule''s cursor (or its own unset cursor''s start) when earlier, so no occurrence falls between the two.';

-- Private: the cursor of a definition declared again (jobs.define, jobs.define_many): old is
-- the stored row, new the declared one, enabling whether a disabled definition is enabled.
-- New occurrences (a new schedule, zone, DST policy or one-shot time) reset the cursor (to the
-- one-shot time, or unset for a recurring schedule), unfinish it, bump the revision (a stale
-- materializer's compare-and-set fails) and take over where the old schedule stopped
-- (jobs._takeover). A recurring definition enabled again restarts at this instant, as
-- jobs.resume does: the disabled time is not caught up. Otherwise nothing changes.
CREATE OR REPLACE FUNCTION jobs._redeclared(old jobs.definitions, new jobs.definitions, enabling boolean)
RETURNS TABLE (revision integer, next_run_at timestamptz, finished_at timestamptz, cursor_from timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT old.revision + CASE WHEN c.changed OR c.restarted THEN 1 ELSE 0 END,
           CASE WHEN c.changed THEN new.run_at WHEN c.restarted THEN NULL ELSE old.next_run_at END,
           CASE WHEN c.changed THEN NULL ELSE old.finished_at END,
           CASE WHEN c.enabled THEN now() WHEN c.changed THEN jobs._takeover(old) ELSE old.cursor_from END
      -- A new jitter moves the starts of the occurrences ahead: their runs are made again.
      FROM (SELECT (old.schedule, old.timezone, old.run_at, old.dst_gap, old.dst_repeat,
                    CASE WHEN new.schedule IS NOT NULL THEN old.jitter END)
                   IS DISTINCT FROM (new.schedule, new.timezone, new.run_at, new.dst_gap, new.dst_repeat,
                                     CASE WHEN new.schedule IS NOT NULL THEN new.jitter END)
                   AS changed,
                   coalesce(enabling, FALSE) AS enabled,
                   coalesce(enabling, FALSE) AND new.schedule IS NOT NULL AS restarted) AS c
$$;
COMMENT ON FUNCTION jobs._redeclared(jobs.definitions, jobs.definitions, boolean) IS 'Private: revision, next_run_at, finished_at and cursor_from of a definition declared again: reset for new occurrences or new starts of them (schedule, zone, DST policy, a recurring schedule''s jitter, one-shot time; taking over at jobs._takeover), restarted now when a recurring one is enabled again, else unchanged.';

-- Private: whether a declaration differs from the stored definition in any declared setting
-- other than enabled (jobs.define keeps enabled when it is not given; the callers compare it).
CREATE OR REPLACE FUNCTION jobs._declaration_differs(old jobs.definitions, new jobs.definitions) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT (old.kind, old.schedule, old.timezone, old.run_at, old.payload, old.max_concurrent_runs,
            old.priority, old.max_attempts, old.misfire_policy, old.overlap_policy, old.timeout,
            old.heartbeat_timeout, old.queue, old.concurrency_key, old.dst_gap, old.dst_repeat,
            old.jitter, old.pause_after_failures)
           IS DISTINCT FROM
           (new.kind, new.schedule, new.timezone, new.run_at, new.payload, new.max_concurrent_runs,
            new.priority, new.max_attempts, new.misfire_policy, new.overlap_policy, new.timeout,
            new.heartbeat_timeout, new.queue, new.concurrency_key, new.dst_gap, new.dst_repeat,
            new.jitter, new.pause_after_failures)
$$;
COMMENT ON FUNCTION jobs._declaration_differs(jobs.definitions, jobs.definitions) IS 'Private: true when a declaration changes any declared setting of a definition except enabled: what makes jobs.define and jobs.define_many write.';

-- Private: raise 22023 naming the field unless a definition's DST policy, jitter and pause
-- threshold are valid (recurring: it has a schedule, not a run_at). jobs.define and
-- jobs.define_many both check through it.
CREATE OR REPLACE FUNCTION jobs._check_schedule_controls(
    recurring boolean, dst_gap text, dst_repeat text, jitter interval, pause_after_failures integer
)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF dst_gap IS NOT NULL AND dst_gap NOT IN ('shift', 'end', 'skip') THEN
        RAISE EXCEPTION 'dst_gap must be shift, end or skip (NULL = auto), got %', jobs._shown(dst_gap)
            USING ERRCODE = '22023',
                  HINT = 'shift: the offset before the gap (RFC 5545); end: right after the gap; skip: no run.';
    END IF;
    IF dst_repeat IS NOT NULL AND dst_repeat NOT IN ('first', 'second', 'both') THEN
        RAISE EXCEPTION 'dst_repeat must be first, second or both (NULL = auto), got %',
            jobs._shown(dst_repeat) USING ERRCODE = '22023';
    END IF;
    IF (dst_gap IS NOT NULL OR dst_repeat IS NOT NULL) AND NOT recurring THEN
        RAISE EXCEPTION 'dst_gap and dst_repeat apply to a recurring schedule, not to run_at'
            USING ERRCODE = '22023';
    END IF;
    IF jitter IS NOT NULL AND (jitter < interval '0' OR jitter > interval '1 day') THEN
        RAISE EXCEPTION 'jitter must be between 0 and 1 day, got %', jitter USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._refuse('jitter', jobs._mixed_signs_problem(jitter));
    IF jitter > interval '0' AND NOT recurring THEN   -- a one-shot runs at its run_at
        RAISE EXCEPTION 'jitter applies to a recurring schedule, not to run_at'
            USING ERRCODE = '22023', HINT = 'Put the delay into run_at itself.';
    END IF;
    IF pause_after_failures IS NOT NULL THEN
        PERFORM jobs._check_range('pause_after_failures', pause_after_failures, 1, 1000);
    END IF;
END $$;
COMMENT ON FUNCTION jobs._check_schedule_controls(boolean, text, text, interval, integer) IS 'Private: raises 22023 naming the field unless dst_gap (shift, end, skip) and dst_repeat (first, second, both), given only for a recurring schedule, jitter (0 to 1 day, more than 0 only for a recurring schedule) and pause_after_failures (1 to 1000) are valid or NULL.';

-- Create or replace definitions by name: what a declaration changes, for jobs.define and
-- jobs.define_many, which check their arguments first (each names a bad field its own way).
-- Each element of declared carries the declared settings (name to concurrency_key; the other
-- columns are ignored); enabled NULL keeps a definition's current state, and a new one starts
-- enabled. Existing rows are locked in name order, so concurrent declarations never deadlock.
-- A declaration that matches the stored definition changes nothing, not even updated_at (every
-- deploy of an app declares its schedules again). Otherwise it clears the schedule and
-- materialization errors (the leader tries again at once); enabling a disabled definition is
-- a resume (the automatic pause and the failure streak are cleared); new occurrences reset
-- the cursor (jobs._redeclared), and the old schedule's runs made ahead for occurrences from
-- the takeover on are deleted (jobs._drop_superseded). One row per definition, in name order.
CREATE OR REPLACE FUNCTION jobs._declare(declared jobs.definitions[])
RETURNS TABLE (id bigint, name text, created boolean, rescheduled boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_names text[] := array(SELECT x.name FROM unnest(_declare.declared) AS x);
    v_old jobs.definitions[];
BEGIN
    v_old := array(SELECT d FROM jobs.definitions AS d WHERE d.name = ANY (v_names) ORDER BY d.name FOR UPDATE);

    INSERT INTO jobs.definitions AS d (
        name, kind, schedule, timezone, run_at, next_run_at, payload, enabled, max_concurrent_runs,
        priority, max_attempts, misfire_policy, overlap_policy, timeout, heartbeat_timeout,
        dst_gap, dst_repeat, jitter, pause_after_failures, queue, concurrency_key, cursor_from
    )
    SELECT i.name, i.kind, i.schedule, i.timezone, i.run_at, i.run_at, i.payload,
           coalesce(i.enabled, o.enabled, TRUE),
           -- buffer_one and cancel_other are about a running occurrence: without a cap, one.
           coalesce(i.max_concurrent_runs,
                    CASE WHEN i.overlap_policy IN ('buffer_one', 'cancel_other') THEN 1 END),
           i.priority, i.max_attempts, i.misfire_policy, i.overlap_policy, i.timeout, i.heartbeat_timeout,
           i.dst_gap, i.dst_repeat, nullif(i.jitter, interval '0'), i.pause_after_failures, i.queue,
           i.concurrency_key,
           -- A new recurring schedule starts at its creation, not at the scheduler's next tick:
           -- an occurrence in between is run (or caught up by misfire_policy), not lost.
           CASE WHEN i.schedule IS NOT NULL THEN now() END
      FROM unnest(_declare.declared) AS i
      LEFT JOIN unnest(v_old) AS o ON o.name = i.name
     ORDER BY i.name
    ON CONFLICT (name) DO UPDATE
       SET kind = excluded.kind,
           schedule = excluded.schedule,
           timezone = excluded.timezone,
           run_at = excluded.run_at,
           payload = excluded.payload,
           enabled = excluded.enabled,
           max_concurrent_runs = excluded.max_concurrent_runs,
           priority = excluded.priority,
           max_attempts = excluded.max_attempts,
           misfire_policy = excluded.misfire_policy,
           overlap_policy = excluded.overlap_policy,
           timeout = excluded.timeout,
           heartbeat_timeout = excluded.heartbeat_timeout,
           dst_gap = excluded.dst_gap,
           dst_repeat = excluded.dst_repeat,
           jitter = excluded.jitter,
           pause_after_failures = excluded.pause_after_failures,
           queue = excluded.queue,
           concurrency_key = excluded.concurrency_key,
           paused_reason = CASE WHEN excluded.enabled THEN NULL ELSE d.paused_reason END,
           failure_streak_since = CASE WHEN excluded.enabled AND NOT d.enabled THEN now()
                                       ELSE d.failure_streak_since END,
           schedule_error = NULL,
           materialize_error = NULL,
           materialize_failures = 0,
           materialize_retry_at = NULL,
           updated_at = now(),
           (revision, next_run_at, finished_at, cursor_from) = (
               SELECT r.revision, r.next_run_at, r.finished_at, r.cursor_from
                 FROM jobs._redeclared(d, excluded, excluded.enabled AND NOT d.enabled) AS r
           )
     WHERE jobs._declaration_differs(d, excluded)
        OR d.enabled IS DISTINCT FROM excluded.enabled
        OR (excluded.enabled AND d.paused_reason IS NOT NULL)
        OR d.schedule_error IS NOT NULL OR d.materialize_error IS NOT NULL;

    -- A definition capped for the first time caps runs that claims in progress read as
    -- uncapped and may be starting unseen; a lower cap, runs they may be starting by the cap
    -- they read: wait for them (and hold off the next claims, which count by the new cap).
    IF EXISTS (SELECT FROM jobs.definitions AS d JOIN unnest(v_old) AS o ON o.id = d.id
                WHERE d.max_concurrent_runs < coalesce(o.max_concurrent_runs, 2147483647)) THEN
        PERFORM jobs._wait_for_claims('giving a definition a first or lower max_concurrent_runs');
    END IF;

    -- The old jitter: a run made before runs recorded their occurrence is dropped when it
    -- starts after the change plus the jitter it was made with. A one-shot moved (or made a
    -- schedule) drops the never-started run of its old time even when that time has passed:
    -- the definition runs at its new time, not at both.
    PERFORM jobs._drop_superseded(
        array_agg(d.id),
        array_agg(CASE WHEN o.schedule IS NULL AND o.run_at IS DISTINCT FROM d.run_at
                       THEN '-infinity'::timestamptz ELSE d.cursor_from END),
        array_agg(CASE WHEN o.schedule IS NULL AND o.run_at IS DISTINCT FROM d.run_at
                       THEN '-infinity'::timestamptz ELSE now() + coalesce(o.jitter, interval '0') END)
    )
       FROM jobs.definitions AS d
       JOIN unnest(v_old) AS o ON o.id = d.id
      WHERE d.revision <> o.revision
        AND (o.schedule, o.timezone, o.run_at, o.dst_gap, o.dst_repeat, o.jitter)
            IS DISTINCT FROM (d.schedule, d.timezone, d.run_at, d.dst_gap, d.dst_repeat, d.jitter)
     HAVING count(*) > 0;
    -- Enabled again with the same occurrences: a resume (jobs.resume), whose runs made before
    -- the pause stay, unless their start is not the one the current jitter gives.
    PERFORM jobs._drop_superseded(
        array_agg(d.id), array_agg(d.cursor_from), array_agg(now() + coalesce(d.jitter, interval '0')), TRUE
    )
       FROM jobs.definitions AS d
       JOIN unnest(v_old) AS o ON o.id = d.id
      WHERE d.revision <> o.revision
        AND (o.schedule, o.timezone, o.run_at, o.dst_gap, o.dst_repeat, o.jitter)
            IS NOT DISTINCT FROM (d.schedule, d.timezone, d.run_at, d.dst_gap, d.dst_repeat, d.jitter)
     HAVING count(*) > 0;

    -- The scheduled runs that have not started (materialized ahead, or waiting) run as the
    -- definition now says: a renamed kind or queue would leave them waiting for workers that no
    -- longer take them, and a corrected payload would miss the next runs (a one-shot's only
    -- one). Rows a claimer holds are waited for, in id order, and checked again: a run that
    -- is running keeps what it started with. Retries and run_now's runs keep theirs.
    PERFORM jobs._restate_queued(array_agg(d.id))
       FROM jobs.definitions AS d
       JOIN unnest(v_old) AS o ON o.id = d.id
      WHERE (o.kind, o.payload, o.priority, o.max_attempts, o.timeout, o.heartbeat_timeout, o.queue,
             o.concurrency_key)
            IS DISTINCT FROM (d.kind, d.payload, d.priority, d.max_attempts, d.timeout, d.heartbeat_timeout,
                              d.queue, d.concurrency_key)
     HAVING count(*) > 0;

    -- A restart that keeps the schedule (enabling it again) keeps its pending backfills valid.
    UPDATE jobs.backfills AS b SET revision = d.revision
      FROM jobs.definitions AS d
      JOIN unnest(v_old) AS o ON o.id = d.id
     WHERE b.definition_id = d.id AND b.done_at IS NULL AND b.revision = o.revision
       AND d.revision <> o.revision
       AND (d.schedule, d.timezone, d.dst_gap, d.dst_repeat)
           IS NOT DISTINCT FROM (o.schedule, o.timezone, o.dst_gap, o.dst_repeat);

    RETURN QUERY
    SELECT d.id, d.name, o.id IS NULL, o.id IS NOT NULL AND o.revision <> d.revision
      FROM jobs.definitions AS d
      LEFT JOIN unnest(v_old) AS o ON o.id = d.id
     WHERE d.name = ANY (v_names)
     ORDER BY d.name;
END $$;
COMMENT ON FUNCTION jobs._declare(jobs.definitions[]) IS 'Private: create or replace the declared definitions by name (arguments already checked; enabled NULL keeps the current state): the one rule of what jobs.define and jobs.define_many change. Returns (id, name, created, rescheduled) per definition in name order.';

-- The signature before the DST and schedule-control parameters: replaced, not overloaded.
DROP FUNCTION IF EXISTS jobs.define(
    text, text, text, text, timestamptz, jsonb, boolean, integer, integer, integer, text, text, interval, interval
);
DROP FUNCTION IF EXISTS jobs.define(
    text, text, text, text, timestamptz, jsonb, boolean, integer, integer, integer, text, text, interval, interval,
    text, text, interval, integer
);

-- Create or replace a definition by name; a change of schedule, time zone or run_at resets its cursor.
CREATE OR REPLACE FUNCTION jobs.define(
    name text,
    kind text,
    schedule text DEFAULT NULL,
    timezone text DEFAULT 'UTC',
    run_at timestamptz DEFAULT NULL,
    payload jsonb DEFAULT '{}',
    enabled boolean DEFAULT NULL,
    max_concurrent_runs integer DEFAULT NULL,
    priority integer DEFAULT 0,
    max_attempts integer DEFAULT NULL,
    misfire_policy text DEFAULT 'coalesce',
    overlap_policy text DEFAULT 'queue',
    timeout interval DEFAULT NULL,
    heartbeat_timeout interval DEFAULT NULL,
    dst_gap text DEFAULT NULL,
    dst_repeat text DEFAULT NULL,
    jitter interval DEFAULT NULL,
    pause_after_failures integer DEFAULT NULL,
    queue text DEFAULT 'default',
    concurrency_key text DEFAULT NULL
)
RETURNS jobs.definitions
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    PERFORM jobs._check_name('name', define.name);
    PERFORM jobs._check_name('kind', define.kind);
    IF (define.schedule IS NULL) = (define.run_at IS NULL) THEN
        RAISE EXCEPTION 'definition %: give exactly one of schedule (recurring) or run_at (one-shot)',
            quote_literal(define.name) USING ERRCODE = '22023', COLUMN = 'schedule';
    END IF;
    IF define.schedule IS NOT NULL THEN
        PERFORM jobs._check_schedule_shape(define.schedule);
    ELSE
        PERFORM jobs._check_instant('run_at', define.run_at);
    END IF;
    PERFORM jobs._check_zone(define.timezone);
    PERFORM jobs._check_payload('payload', define.payload);
    IF define.max_concurrent_runs IS NOT NULL THEN
        PERFORM jobs._check_range('max_concurrent_runs', define.max_concurrent_runs, 1, 100000);
    END IF;
    PERFORM jobs._check_range('priority', define.priority, -1000, 1000);
    IF define.max_attempts IS NOT NULL THEN
        PERFORM jobs._check_range('max_attempts', define.max_attempts, 1, 1000);
    END IF;
    IF define.misfire_policy IS NULL OR define.misfire_policy NOT IN ('coalesce', 'catch_up', 'skip') THEN
        RAISE EXCEPTION 'misfire_policy must be coalesce, catch_up or skip, got %',
            jobs._shown(define.misfire_policy) USING ERRCODE = '22023';
    END IF;
    IF define.overlap_policy IS NULL
       OR define.overlap_policy NOT IN ('queue', 'skip', 'buffer_one', 'cancel_other') THEN
        RAISE EXCEPTION 'overlap_policy must be queue, skip, buffer_one or cancel_other, got %',
            jobs._shown(define.overlap_policy) USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_duration('timeout', define.timeout);
    PERFORM jobs._check_duration('heartbeat_timeout', define.heartbeat_timeout);
    PERFORM jobs._check_flow_args(define.queue, define.concurrency_key);
    PERFORM jobs._check_schedule_controls(
        define.schedule IS NOT NULL, define.dst_gap, define.dst_repeat, define.jitter, define.pause_after_failures
    );

    PERFORM jobs._declare(ARRAY[jsonb_populate_record(NULL::jobs.definitions, jsonb_build_object(
        'name', define.name, 'kind', define.kind, 'schedule', define.schedule, 'timezone', define.timezone,
        'run_at', define.run_at, 'payload', define.payload, 'enabled', define.enabled,
        'max_concurrent_runs', define.max_concurrent_runs, 'priority', define.priority,
        'max_attempts', define.max_attempts, 'misfire_policy', define.misfire_policy,
        'overlap_policy', define.overlap_policy, 'timeout', define.timeout,
        'heartbeat_timeout', define.heartbeat_timeout, 'dst_gap', define.dst_gap, 'dst_repeat', define.dst_repeat,
        'jitter', define.jitter, 'pause_after_failures', define.pause_after_failures, 'queue', define.queue,
        'concurrency_key', define.concurrency_key
    ))]);
    RETURN (SELECT d FROM jobs.definitions AS d WHERE d.name = define.name);
END $$;
COMMENT ON FUNCTION jobs.define(
    text, text, text, text, timestamptz, jsonb, boolean, integer, integer, integer, text, text, interval, interval,
    text, text, interval, integer, text, text
) IS
'Create or replace the definition called name (exactly one of schedule or run_at). A new recurring definition starts at its creation: the scheduler runs its occurrences from that instant on (an occurrence before the scheduler''s next tick is run late, or caught up by misfire_policy). Changing schedule, timezone, DST policy or run_at resets the cursor to this instant, or to the old schedule''s cursor when that is earlier (cursor_from, see jobs._takeover), and deletes the never-started runs of the old schedule for later occurrences; the new schedule re-creates those the two share, once. Changing kind, payload, priority, max_attempts, timeouts, queue or concurrency_key also changes the scheduled runs that have not started yet (materialized ahead, or waiting). Declaring the same definition again changes nothing. enabled NULL keeps the current state; enabled true also clears an automatic pause, and a disabled recurring definition enabled again restarts at that instant, as jobs.resume (the disabled time is not caught up). dst_gap/dst_repeat NULL = auto; jitter delays each occurrence by a deterministic offset in [0, jitter); pause_after_failures pauses after that many consecutive final failures. Its runs go to queue and carry concurrency_key.';

-- Pause a definition: no new occurrences are materialized (queued runs still run).
CREATE OR REPLACE FUNCTION jobs.pause(name text) RETURNS jobs.definitions
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_def jobs.definitions;
BEGIN
    UPDATE jobs.definitions AS d SET enabled = FALSE, updated_at = now()
     WHERE d.name = pause.name RETURNING d.* INTO v_def;
    RETURN jobs._known_definition(v_def, pause.name);
END $$;
COMMENT ON FUNCTION jobs.pause(text) IS 'Pause the named definition: no new occurrences are materialized until jobs.resume().';

-- Resume a paused definition from the next occurrence after now (the paused window is not caught up).
CREATE OR REPLACE FUNCTION jobs.resume(name text) RETURNS jobs.definitions
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_def jobs.definitions;
    v_was_paused boolean;
BEGIN
    SELECT NOT d.enabled INTO v_was_paused FROM jobs.definitions AS d WHERE d.name = resume.name FOR UPDATE;
    UPDATE jobs.definitions AS d
       SET enabled = TRUE, updated_at = now(), paused_reason = NULL,
           failure_streak_since = CASE WHEN d.enabled THEN d.failure_streak_since ELSE now() END,
           revision = d.revision + CASE WHEN d.enabled THEN 0 ELSE 1 END,
           next_run_at = CASE WHEN d.enabled OR d.schedule IS NULL THEN d.next_run_at END,
           cursor_from = CASE WHEN d.enabled OR d.schedule IS NULL THEN d.cursor_from ELSE now() END
     WHERE d.name = resume.name RETURNING d.* INTO v_def;
    IF v_was_paused THEN
        -- The schedule is the one the pending backfills were requested for: they stay valid.
        UPDATE jobs.backfills AS b SET revision = v_def.revision
         WHERE b.definition_id = v_def.id AND b.done_at IS NULL AND b.revision = v_def.revision - 1;
    END IF;
    IF v_was_paused AND v_def.schedule IS NOT NULL THEN
        -- The cursor restarts at the resume and makes the runs of the occurrences from there on
        -- again: those materialized before the pause stay, unless a jitter changed meanwhile
        -- moved their start (the new run would be a second one for the occurrence).
        PERFORM jobs._drop_superseded(
            ARRAY[v_def.id], ARRAY[v_def.cursor_from], ARRAY[now() + coalesce(v_def.jitter, interval '0')], TRUE
        );
    END IF;
    RETURN jobs._known_definition(v_def, resume.name);
END $$;
COMMENT ON FUNCTION jobs.resume(text) IS 'Resume the named definition. A recurring one restarts from its first occurrence at or after now (cursor_from): the paused window is not caught up, and the runs materialized before the pause for occurrences from now on are made again (with the definition''s current jitter). An automatic pause (pause_after_failures) is cleared and the failure streak starts again.';

-- Delete a definition and cancel its queued runs; its run history stays.
CREATE OR REPLACE FUNCTION jobs.undefine(name text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    -- These locks serialize with everything that adds runs of the definition: materializing
    -- (jobs.materialize, materialize_many, materialize_one_shots, finish_backfill) locks the row
    -- and re-checks it; jobs.run_now and retries hold the definition's key shared until they
    -- commit. Taken first, they wait for those in flight, so the cancel that follows sees their
    -- runs; after this commit they find no definition and add nothing.
    v_def jobs.definitions := jobs._lock_definition(undefine.name, TRUE);
    v_cancelled integer := jobs.cancel_queued(v_def.name);
BEGIN
    DELETE FROM jobs.definitions AS d WHERE d.id = v_def.id;
    RETURN v_cancelled;
END $$;
COMMENT ON FUNCTION jobs.undefine(text) IS 'Delete the named definition and cancel its QUEUED runs; returns how many were cancelled. Run history is kept.';

-- Compare-and-set the cursor and insert the occurrences' runs, in one commit.
CREATE OR REPLACE FUNCTION jobs.materialize(
    definition_id bigint,
    expected_next_run_at timestamptz,
    run_times timestamptz[],
    new_next_run_at timestamptz,
    expected_revision integer DEFAULT NULL
)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_def jobs.definitions;
    v_count integer;
BEGIN
    IF materialize.definition_id IS NULL OR materialize.run_times IS NULL THEN
        RAISE EXCEPTION 'definition_id and run_times must not be NULL' USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_range('run_times length', cardinality(materialize.run_times), 0, 10000);
    IF materialize.expected_next_run_at IS NOT NULL THEN
        PERFORM jobs._check_instant('expected_next_run_at', materialize.expected_next_run_at);
    END IF;
    IF materialize.new_next_run_at IS NOT NULL THEN
        PERFORM jobs._check_instant('new_next_run_at', materialize.new_next_run_at);
    END IF;
    IF materialize.new_next_run_at < materialize.expected_next_run_at THEN
        RAISE EXCEPTION 'new_next_run_at (%) must not be before expected_next_run_at (%): a cursor only moves on',
            materialize.new_next_run_at, materialize.expected_next_run_at USING ERRCODE = '22023';
    END IF;
    -- Each time a run's start, as every driver can hold it, within the window the cursor moves
    -- over; a cursor not set yet (a new definition) or ended (NULL) bounds nothing on its side.
    IF EXISTS (SELECT FROM unnest(materialize.run_times) AS t
                WHERE jobs._instant_problem(t) IS NOT NULL
                   OR t < materialize.expected_next_run_at
                   OR t >= materialize.new_next_run_at) THEN
        RAISE EXCEPTION 'run_times must be finite, from 0001-01-02 to 9999-12-30 UTC, and within [expected_next_run_at, new_next_run_at)'
            USING ERRCODE = '22023';
    END IF;

    UPDATE jobs.definitions AS d
       SET next_run_at = materialize.new_next_run_at,
           finished_at = CASE WHEN materialize.new_next_run_at IS NULL THEN now() END
     WHERE d.id = materialize.definition_id
       AND d.next_run_at IS NOT DISTINCT FROM materialize.expected_next_run_at
       AND (materialize.expected_revision IS NULL OR d.revision = materialize.expected_revision)
       AND d.schedule IS NOT NULL AND d.enabled AND d.finished_at IS NULL
    RETURNING d.* INTO v_def;
    IF NOT FOUND THEN
        RETURN 0;  -- stale: another leader (or a define/pause) got there first
    END IF;

    v_count := jobs._insert_occurrences(v_def, materialize.run_times);
    RETURN jobs._notify_queued(v_count);
END $$;
COMMENT ON FUNCTION jobs.materialize(bigint, timestamptz, timestamptz[], timestamptz, integer) IS 'Leader: if the cursor still equals expected_next_run_at (and the revision matches), move it to new_next_run_at (NULL = schedule finished) and insert a run per run_times, in one commit. Returns runs inserted; 0 when stale.';

-- The scheduler's rule for which recurring definitions need work: live ones
-- (a schedule, enabled, not finished, no recorded schedule error) whose cursor
-- is unset (new) or within the horizon (due). The leader plans these in the
-- driver (time zones, DST) and hands the result to jobs.materialize().

-- Live recurring definitions (a schedule, enabled, not finished, no schedule error)
-- with what the leader needs to plan them.
CREATE OR REPLACE VIEW jobs._live_schedules AS
SELECT
    d.id,
    d.name,
    d.schedule,
    d.timezone,
    d.revision,
    d.created_at,
    d.next_run_at,
    d.misfire_policy,
    d.dst_gap,
    d.dst_repeat,
    d.cursor_from
FROM jobs.definitions AS d
WHERE d.schedule IS NOT NULL AND d.enabled AND d.finished_at IS NULL AND d.schedule_error IS NULL;
COMMENT ON VIEW jobs._live_schedules IS 'Private: live recurring definitions (a schedule, enabled, not finished, no schedule_error) with the columns the scheduler plans from (cursor_from: where a reset cursor starts).';

-- Recurring definitions whose cursor is not initialized yet, oldest first.
CREATE OR REPLACE FUNCTION jobs.new_definitions(max_rows integer) RETURNS SETOF jobs._live_schedules
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
BEGIN
    PERFORM jobs._check_range('max_rows', new_definitions.max_rows, 0, 1000000);
    RETURN QUERY
        SELECT * FROM jobs._live_schedules AS d
         WHERE d.next_run_at IS NULL ORDER BY d.id LIMIT new_definitions.max_rows;
END $$;
COMMENT ON FUNCTION jobs.new_definitions(integer) IS 'Scheduler: up to max_rows live recurring definitions whose cursor (next_run_at) is not set yet, by id.';

-- Recurring definitions whose cursor is at or before the horizon, earliest first.
CREATE OR REPLACE FUNCTION jobs.due_definitions(horizon timestamptz, max_rows integer)
RETURNS SETOF jobs._live_schedules
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
BEGIN
    PERFORM jobs._check_range('max_rows', due_definitions.max_rows, 0, 1000000);
    RETURN QUERY
        SELECT * FROM jobs._live_schedules AS d
         WHERE d.next_run_at <= due_definitions.horizon
           AND NOT EXISTS (SELECT FROM jobs.definitions AS b  -- backing off after refused inserts
                            WHERE b.id = d.id AND b.materialize_retry_at > now())
         ORDER BY d.next_run_at LIMIT due_definitions.max_rows;
END $$;
COMMENT ON FUNCTION jobs.due_definitions(timestamptz, integer) IS 'Scheduler: up to max_rows live recurring definitions whose cursor (next_run_at) is at or before horizon, earliest first, except those backing off after failed run inserts (materialize_retry_at). Served by definitions_live_due_idx.';

-- Materialize due one-shot definitions, in pure SQL; returns runs created.
CREATE OR REPLACE FUNCTION jobs.materialize_one_shots(
    lookahead interval DEFAULT '0', misfire_grace interval DEFAULT '1 minute'
)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
DECLARE
    v_count integer;
BEGIN
    IF materialize_one_shots.lookahead IS NULL OR materialize_one_shots.misfire_grace IS NULL THEN
        RAISE EXCEPTION 'lookahead and misfire_grace must not be NULL' USING ERRCODE = '22023';
    END IF;
    PERFORM jobs._check_duration('lookahead', materialize_one_shots.lookahead);
    PERFORM jobs._check_duration('misfire_grace', materialize_one_shots.misfire_grace);
    -- A one-shot moved back to a time it already ran at: its run may have moved to history.
    PERFORM jobs._hold_history_moves(array(
        SELECT o.run_at FROM jobs.definitions AS o
         WHERE o.schedule IS NULL AND o.enabled AND o.finished_at IS NULL
           AND o.next_run_at <= now() + materialize_one_shots.lookahead
    ));
    -- A definition that holds a blank concurrency key, written before such keys were refused,
    -- can have no run (the runs' key refuses it): it is recorded and backed off, as
    -- jobs.materialize_many does, and left out, so the other one-shots are materialized.
    PERFORM jobs._materialize_failed(o.id, jobs._blank_key_problem(o.name, o.concurrency_key))
       FROM jobs.definitions AS o
      WHERE o.schedule IS NULL AND o.enabled AND o.finished_at IS NULL
        AND o.next_run_at <= now() + materialize_one_shots.lookahead
        AND jobs._blank_key(o.concurrency_key)
        AND (o.materialize_retry_at IS NULL OR o.materialize_retry_at <= now());
    WITH due AS (
        UPDATE jobs.definitions AS d
           SET next_run_at = NULL, finished_at = now()
         WHERE d.id IN (
                   -- A second leader in the same instant skips what the first holds.
                   SELECT o.id FROM jobs.definitions AS o
                    WHERE o.schedule IS NULL AND o.enabled AND o.finished_at IS NULL
                      AND o.next_run_at <= now() + materialize_one_shots.lookahead
                      AND NOT coalesce(jobs._blank_key(o.concurrency_key), FALSE)
                    ORDER BY o.id
                      FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING d.*
    ),
    missed AS (
        SELECT due.*, due.misfire_policy = 'skip'
                      AND due.run_at < now() - materialize_one_shots.misfire_grace AS skipped
          FROM due
    )
    INSERT INTO jobs.runs (
        definition_id, kind, payload, priority, max_attempts, timeout, heartbeat_timeout,
        origin, queue, concurrency_key, scheduled_for, occurrence_at, status, finished_at, failure_reason, error
    )
    SELECT m.id, m.kind, m.payload, m.priority, m.max_attempts, m.timeout, m.heartbeat_timeout,
           'schedule', m.queue, m.concurrency_key, m.run_at, m.run_at,
           CASE WHEN m.skipped THEN 'CANCELLED'::jobs.run_status ELSE 'QUEUED'::jobs.run_status END,
           CASE WHEN m.skipped THEN now() END,
           CASE WHEN m.skipped THEN 'Skipped' END,
           CASE WHEN m.skipped THEN 'skipped: run_at passed while no scheduler ran (misfire_policy skip)' END
      FROM missed AS m
     WHERE NOT jobs._archived_occurrence(m.id, m.run_at)
    ON CONFLICT (definition_id, (coalesce(occurrence_at, scheduled_for))) WHERE origin = 'schedule' DO NOTHING;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN jobs._notify_queued(v_count);
END $$;
COMMENT ON FUNCTION jobs.materialize_one_shots(interval, interval) IS 'Leader: turn every enabled one-shot definition due within lookahead into its run (once: not again when its time already has a run, in jobs.runs or in history); returns runs created.';

-- Leader: record that a definition's schedule cannot be read, so operators see it and ticks skip it.
CREATE OR REPLACE FUNCTION jobs.mark_schedule_error(definition_id bigint, revision integer, message text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    UPDATE jobs.definitions AS d
       SET schedule_error = left(coalesce(mark_schedule_error.message, 'invalid schedule'), 2000)
     WHERE d.id = mark_schedule_error.definition_id AND d.revision = mark_schedule_error.revision;
    RETURN FOUND;
END $$;
COMMENT ON FUNCTION jobs.mark_schedule_error(bigint, integer, text) IS 'Leader: store why the schedule of this definition revision cannot be read; jobs.define() clears it.';
