-- ===========================================================================
-- version.sql: which schema is installed, and by which pgtick release.
-- ===========================================================================

-- The installed schema version: the latest applied migration and the package that applied it.
CREATE OR REPLACE FUNCTION jobs.version()
RETURNS TABLE (schema_version text, migration text, package_version text, applied_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
BEGIN
    RETURN QUERY
    SELECT m.version, m.name, m.package_version, m.applied_at
      FROM jobs.schema_migrations AS m
     ORDER BY m.version DESC
     LIMIT 1;
END $$;
COMMENT ON FUNCTION jobs.version() IS 'The installed schema: latest applied migration (number and name), the pgtick version that applied it (NULL: psql from sql/install.sql), and when.';
