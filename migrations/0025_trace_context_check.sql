-- pgtick 0025: a trace context that is not a JSON object is refused naming its setting.
-- A run's trace_context defaulted to the transaction setting pgtick.trace_context cast to
-- jsonb: a value that was not JSON failed every insert of a run in that transaction (an
-- enqueue, a retry queued by a failure) with a bare "invalid input syntax for type json".
-- The default now reads the setting through jobs._trace_context(), called only when the
-- setting is not empty, so an insert without a trace context costs what it did.

CREATE FUNCTION jobs._trace_context() RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_text text := nullif(current_setting('pgtick.trace_context', TRUE), '');
    v_value jsonb;
BEGIN
    IF v_text IS NULL THEN
        RETURN NULL;
    END IF;
    BEGIN
        v_value := v_text::jsonb;
    EXCEPTION WHEN invalid_text_representation THEN
        v_value := NULL;
    END;
    IF jsonb_typeof(v_value) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'pgtick.trace_context must be a JSON object (traceparent, tracestate), got %',
            left(v_text, 200)
            USING ERRCODE = '22023',
                  HINT = 'Set it with set_config(''pgtick.trace_context'', ''{"traceparent": "..."}'', true), or to '''' for none.';
    END IF;
    RETURN v_value;
END $$;
REVOKE ALL ON FUNCTION jobs._trace_context() FROM public;
COMMENT ON FUNCTION jobs._trace_context() IS
'Private: the transaction setting pgtick.trace_context as jsonb (NULL when unset or empty); raises 22023 naming it unless it is a JSON object.';

ALTER TABLE jobs.runs ALTER COLUMN trace_context
SET DEFAULT CASE WHEN current_setting('pgtick.trace_context', TRUE) <> '' THEN jobs._trace_context() END;
