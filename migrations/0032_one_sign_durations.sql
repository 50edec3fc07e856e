-- pgtick 0032: the durations stored in the settings tables have one sign. An interval whose
-- months, days and time differ in sign ('1 mon -1 day') lasts a different time from each date
-- it is added to, and the functions now refuse one; a value stored before that rule (in
-- jobs.config, a definition or a retry policy) would make each call that reads it refuse too,
-- the leader's hourly prune of a retention so stored among them. Each such value becomes the
-- one-sign interval it compared as (justify_interval: '1 mon -1 day' is '29 days'), every
-- column of a row in one UPDATE, so that a row's checks see none of them left mixed.
DO $one_sign$
DECLARE
    v_table record;
BEGIN
    FOR v_table IN
        SELECT
            c.table_name,
            string_agg(format('%1$I = CASE WHEN %2$s THEN justify_interval(%1$I) ELSE %1$I END',
                              c.column_name, m.mixed), ', ' ORDER BY c.column_name) AS sets,
            string_agg(m.mixed, ' OR ' ORDER BY c.column_name) AS any_mixed
          FROM information_schema.columns AS c
         CROSS JOIN LATERAL (
             SELECT format(
                 '((date_trunc(''month'', %1$I) > interval ''0'''
                 ' OR date_trunc(''day'', %1$I) - date_trunc(''month'', %1$I) > interval ''0'''
                 ' OR %1$I - date_trunc(''day'', %1$I) > interval ''0'')'
                 ' AND (date_trunc(''month'', %1$I) < interval ''0'''
                 ' OR date_trunc(''day'', %1$I) - date_trunc(''month'', %1$I) < interval ''0'''
                 ' OR %1$I - date_trunc(''day'', %1$I) < interval ''0''))',
                 c.column_name) AS mixed
         ) AS m
         WHERE c.table_schema = 'jobs' AND c.data_type = 'interval'
           AND c.table_name IN ('config', 'definitions', 'retry_policies')
         GROUP BY c.table_name
         ORDER BY c.table_name
    LOOP
        EXECUTE format('UPDATE jobs.%I SET %s WHERE %s', v_table.table_name, v_table.sets, v_table.any_mixed);
    END LOOP;
END $one_sign$;
