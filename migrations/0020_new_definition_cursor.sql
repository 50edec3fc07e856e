-- pgtick 0020: a new recurring definition starts at its creation.
-- jobs.define and jobs.define_many now set cursor_from when they create a recurring
-- definition, so the scheduler plans it from that instant rather than from its next tick: an
-- occurrence between the two used to be lost. A definition created before this migration and
-- not planned yet starts at its creation too.

UPDATE jobs.definitions
SET cursor_from = created_at
WHERE schedule IS NOT NULL AND next_run_at IS NULL AND cursor_from IS NULL;

COMMENT ON COLUMN jobs.definitions.cursor_from IS
'Where a reset cursor (next_run_at NULL) starts: the instant the recurring definition was created, its schedule last changed or it resumed (NULL: the scheduler''s now).';
